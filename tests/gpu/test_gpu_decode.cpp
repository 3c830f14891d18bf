// Inference on the GPU against the CPU, as `zaya generate` and the server's engine run it: a
// prompt's first chunk prefilled in the last sequence of a batch of four, then one pass over
// the last two sequences that runs a fresh prompt beside that prompt's next chunk (two
// positions), both copied down to the first two sequences and decoded together token by token,
// then one sequence copied out into a state sized to its positions (the server's kept states),
// back into the second sequence of a fresh state and continued there with a chunk and two more
// decode steps. Every step's logits must match the CPU's doing the
// same relative to the largest logit: fp32 GEMMs within 1e-4; bf16 GEMMs (the server's default
// on a GPU), with a routing made decisive so that rounding cannot flip an expert, within 3e-2:
// each op is within 1e-2, and the logits after two or three blocks of bf16 operands, with keys
// and values cached from earlier steps, measured up to 1.33e-2 in the host emulation. The
// states' positions must agree. Fixtures with a 3-tap convolution (its
// state holds more rows) and a sliding window (decode past the window). Skipped ("skipped: no
// GPU") without a device.
#include "decisive_routing.h"
#include "gpu_test_support.h"
#include "grad_fixtures.h"
#include "model/model.h"
#include "model/model_io.h"
#if defined(ZAYA_SIMT)
#include "simt_host_api.h"  // the emulated runtime's counts
#endif

namespace zaya {
namespace {

using namespace gpu_test;

struct DecodeRun {
  std::vector<std::vector<float>> logits;  // one entry per forward, in order
  std::vector<int64_t> positions;          // the states' positions after each stage
};

// The same sequence of decode-state operations on either backend.
DecodeRun run_decode(Model& model) {
  const ModelConfig& c = model.config();
  Backend& be = model.backend();
  const int64_t V = c.vocab_size, S = 32;
  DecodeRun run;
  auto forward = [&](const std::vector<int32_t>& ids, int64_t B, DecodeState& state, int64_t first) {
    std::vector<float> logits(static_cast<size_t>(B * V));
    ForwardOutputs out;
    out.logits = logits.data();
    out.last_only = true;
    model.forward(ids.data(), B, int64_t(ids.size()) / B, &state, out, nullptr, first);
    run.logits.push_back(std::move(logits));
  };
  auto ids = [&](int32_t first, int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(int32_t((first + 7 * i) % V));
    return t;
  };
  DecodeState batch(c, be, 4, S);
  forward(ids(3, 5), 1, batch, 3);  // prompt a's first chunk, in sequence 3
  forward(ids(8, 3), 1, batch, 2);  // what sequence 2 held before: reset_sequence must clear it
  batch.reset_sequence(2);
  std::vector<int32_t> pass = ids(5, 7);  // prompt b (sequence 2, fresh) beside a's next chunk
  const std::vector<int32_t> a_next = ids(11, 7);
  pass.insert(pass.end(), a_next.begin(), a_next.end());
  forward(pass, 2, batch, 2);
  batch.copy_sequence(batch, 2, 0);  // both join the decoding batch
  batch.copy_sequence(batch, 3, 1);
  for (int step = 0; step < 6; ++step)
    forward({int32_t((2 + step) % V), int32_t((9 + 3 * step) % V)}, 2, batch, 0);
  run.positions = {batch.pos[0], batch.pos[1]};

  DecodeState kept(c, be, 1, batch.pos[1]);  // a's sequence, sized to it
  kept.copy_sequence(batch, 1, 0);
  DecodeState next(c, be, 2, S);
  next.copy_sequence(kept, 0, 1);
  forward(ids(17, 4), 1, next, 1);  // the next turn's new tokens
  for (int step = 0; step < 2; ++step) forward({int32_t((4 + 5 * step) % V)}, 1, next, 1);
  run.positions.push_back(kept.pos[0]);
  run.positions.push_back(next.pos[1]);
  return run;
}

class GpuDecode : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(GpuDecode, PrefillCopiesAndDecodeMatchCpu) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  const auto& [fixture, mode_index] = GetParam();
  const GemmMode mode = gemm_modes()[size_t(mode_index)];
  const std::string dir = test::source_path("tests/fixtures/" + fixture);
  CpuBackend cpu;
  auto cpu_model = load_model(dir, cpu);
  make_routing_decisive(*cpu_model);
  const DecodeRun want = run_decode(*cpu_model);
  auto gpu = make_gpu(mode);
  auto gpu_model = load_model(dir, *gpu);
  make_routing_decisive(*gpu_model);
  gpu->set_weights_frozen(true);  // as the server runs it (bf16 shadows where GEMMs are bf16)
  const DecodeRun got = run_decode(*gpu_model);
  gpu->set_weights_frozen(false);
  EXPECT_EQ(got.positions, want.positions);
  EXPECT_EQ(want.positions, (std::vector<int64_t>{13, 18, 18, 24}));
  ASSERT_EQ(got.logits.size(), want.logits.size());
  const double tol = mode.bf16 ? 3e-2 : mode.tol;
  for (size_t i = 0; i < want.logits.size(); ++i)
    expect_close(got.logits[i], want.logits[i], tol,
                 fixture + " " + mode.name + " forward " + std::to_string(i));
}

#if defined(ZAYA_SIMT)
// A decode step under the bf16 policy (the server's) waits for the GPU once, for its logits: the
// MoE's routing plan stays on the device (few-rows GEMVs; the per-expert GEMMs of larger calls
// copy it to the host, a wait per MoE layer). Counted in the host emulation, whose runtime
// records every launch, copy and synchronisation the backend asks for; a decode step at batch 1
// and 4 after an 8-token prompt.
TEST(GpuDecodeRoundTrips, OneWaitPerDecodeStep) {
  const std::string dir = test::source_path("tests/fixtures/conv_t3_gqa2");
  auto gpu = make_gpu(gemm_modes()[0]);
  ASSERT_TRUE(std::string(gemm_modes()[0].name) == "bf16");
  auto model = load_model(dir, *gpu);
  gpu->set_weights_frozen(true);
  const ModelConfig& c = model->config();
  for (int64_t B : {1, 4}) {
    DecodeState state(c, *gpu, B, 64);
    std::vector<int32_t> prompt(size_t(B * 8), 3), token(size_t(B), 5);
    std::vector<float> logits(size_t(B * c.vocab_size));
    ForwardOutputs out;
    out.logits = logits.data();
    out.last_only = true;
    model->forward(prompt.data(), B, 8, &state, out, nullptr, 0);
    const simt::ApiCounts before = simt::api_counts();
    model->forward(token.data(), B, 1, &state, out, nullptr, 0);
    const simt::ApiCounts after = simt::api_counts();
    const std::string what = "decode step at batch " + std::to_string(B) + " (" +
                             std::to_string(after.launches - before.launches) + " launches, " +
                             std::to_string(after.copies_to_device - before.copies_to_device) +
                             " copies to the device)";
    EXPECT_EQ(after.copies_to_host - before.copies_to_host, 1) << what << ": copies to the host";
    EXPECT_EQ(after.synchronizations - before.synchronizations, 1) << what << ": synchronisations";
    // Launches bound decode at these sizes (docs/gpu.md): 95 before the few-rows linears, the
    // MoE GEMVs on fp32 rows, the conv weights read as stored, the RoPE computed in place, the
    // one-launch routing plan, the state updates folded into their ops, the whole conv of a few
    // rows as one kernel, the MoE as two (no plan; SwiGLU and the router weight folded in) and
    // the router's fp32 linears as GEMVs with their bias (53), the router's softmax and
    // selection as one kernel (51), the attention's four input projections as one GEMV launch,
    // the router MLP's GELUs in its GEMVs' stores and the key and value cache writes as one
    // kernel (39), and the router's depth-averaging add in its norm's kernel (38); a change that
    // adds launches to the step shows here. Copies between device buffers: none (each layer
    // copied its router latent for the next one, 2 a step, until the two buffers traded places).
    EXPECT_LE(after.launches - before.launches, 38) << what << ": launches";
    EXPECT_EQ(after.copies_on_device - before.copies_on_device, 0) << what << ": copies on the device";
    // Uploads: 9 a step when each layer uploaded the positions and cache offsets it was given; the
    // backend now reuses a device copy while the bytes recur (CudaBackend::upload_reused). A
    // one-token step's positions and cache offsets are the same bytes, so they share one copy.
    EXPECT_LE(after.copies_to_device - before.copies_to_device, 4) << what << ": copies to the device";
  }
  gpu->set_weights_frozen(false);
}
#endif

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuDecode,
                         ::testing::Combine(::testing::Values("conv_t3_gqa2", "gqa2_sliding_identity_untied"),
                                            ::testing::Range(0,
                                                             int(gemm_modes().size()))),  // every GEMM mode
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  gemm_modes()[size_t(std::get<1>(info.param))].name;
                         });

}  // namespace
}  // namespace zaya
