// The tensor-core flash attention kernels (src/backend/cuda/ops_attention_flash_tc_kernels.h and
// ops_attention_flash_tc_backward_kernels.h), run on the CPU by the host GPU emulation
// (simt_runtime.h), against the CPU backend's attention forward and backward. The kernels are
// the very source nvcc compiles; only the launches are repeated here, in the order
// CudaBackend::attention_flash_tc and attention_backward_flash_tc issue them. This checks the
// kernels' index arithmetic, tiling, masking, online softmax, fragment flow and the cp.async /
// barrier discipline without a GPU; the hardware's own behaviour (and speed) still needs one
// (tests/gpu). Tolerance 1e-2 of the largest magnitude: P, dS and the operands are bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "backend/cuda/ops_attention_flash_tc_backward_kernels.h"
#include "backend/cuda/ops_attention_flash_tc_kernels.h"

namespace zaya {
namespace {

using flash_tc::DkvLayout;
using flash_tc::DqLayout;
using flash_tc::ForwardLayout;

using simt_test::AttnCase;
using simt_test::AttnReference;

constexpr double kTol = 1e-2;

// Packs fp32 rows [B, rows, H, dh] into the kernels' bf16 layout [B, H, rows_pad, dh], as
// flash_pack_rows does (rows past pos0 + chunk zeroed when pos0 is given).
std::vector<uint16_t> pack(const std::vector<float>& src, int64_t B, int64_t rows, int64_t H, int64_t dh,
                           const int64_t* pos0 = nullptr, int64_t chunk = 0) {
  const int64_t rows_pad = flash_padded(rows);
  std::vector<uint16_t> out(size_t(B * H * rows_pad * dh), 0xffff);  // NaN until the kernel writes it
  simt::launch(dim3(3), dim3(256), 0, [&] {
    flash_tc::k_pack_rows(src.data(), out.data(), B, rows, rows_pad, H, dh, pos0, chunk);
  });
  return out;
}

template <int DH>
void run_forward(const FlashParams& fp, bool lse_only) {
  const dim3 grid(unsigned((fp.a.T + kFlashRows - 1) / kFlashRows), unsigned(fp.a.Hq), unsigned(fp.a.B));
  if (lse_only)
    simt::launch(grid, dim3(kFlashThreads), ForwardLayout<DH, true>::bytes,
                 [&] { flash_tc::k_flash_forward<DH, true>(fp); });
  else
    simt::launch(grid, dim3(kFlashThreads), ForwardLayout<DH, false>::bytes,
                 [&] { flash_tc::k_flash_forward<DH, false>(fp); });
}

template <int DH>
void run_backward(const FlashParams& fp) {
  const AttnParams& a = fp.a;
  simt::launch(dim3(unsigned((a.T + kFlashRows - 1) / kFlashRows), unsigned(a.Hq), unsigned(a.B)),
               dim3(kFlashThreads), DqLayout<DH>::bytes, [&] { flash_tc::k_flash_dq<DH>(fp); });
  simt::launch(dim3(unsigned((a.S + kFlashKeys - 1) / kFlashKeys), unsigned(a.Hkv), unsigned(a.B)),
               dim3(kFlashThreads), DkvLayout<DH>::bytes, [&] { flash_tc::k_flash_dkdv<DH>(fp); });
}

// The orders the emulation tries (simt::Schedule): warps in step with late copies, then warp 0
// ahead of the others with late copies and with early ones, then the last warp ahead.
const simt::Schedule kSchedules[] = {{true, false, false}, {false, false, false}, {false, true, false},
                                     {false, false, true}};

std::string describe(const simt::Schedule& s) {
  return std::string(s.round_robin ? " [warps in step" : s.reverse ? " [last warp ahead" : " [warp 0 ahead") +
         (s.reverse && s.round_robin ? ", last warp first" : "") +
         (s.copies_at_issue ? ", copies land at issue]" : ", copies land at the wait]");
}

void check_case(const AttnCase& c, uint64_t seed) {
  const std::string what = simt_test::describe(c) + describe(simt::schedule());
  const AttnReference ref(c, seed);
  const int64_t nq = int64_t(ref.q.size()), nkv = int64_t(ref.k.size());

  // The kernels' parameters, as FlashCall sets them up.
  FlashParams fp;
  fp.a = ref.params();
  fp.S_pad = flash_padded(c.S);
  fp.T_pad = flash_padded(c.T);
  fp.scale_log2 = ref.args.scale * 1.4426950408889634f;
  const std::vector<uint16_t> kp = pack(ref.k, c.B, c.S, c.Hkv, c.dh, c.pos0.data(), c.T);
  const std::vector<uint16_t> vp = pack(ref.v, c.B, c.S, c.Hkv, c.dh, c.pos0.data(), c.T);
  fp.k = kp.data();
  fp.v = vp.data();

  std::vector<float> got(size_t(nq), NAN);
  fp.a.out = got.data();
  if (c.dh == 64) run_forward<64>(fp, false);
  else run_forward<128>(fp, false);
  simt_test::expect_close(got, ref.out, kTol, what + " out");

  const std::vector<uint16_t> qp = pack(ref.q, c.B, c.T, c.Hq, c.dh), dop = pack(ref.dout, c.B, c.T, c.Hq, c.dh);
  std::vector<float> lse2(size_t(c.B * c.Hq * fp.T_pad), NAN), drow(size_t(c.B * c.Hq * fp.T_pad), NAN);
  std::vector<float> gdq(size_t(nq), NAN), gdk(size_t(nkv), NAN), gdv(size_t(nkv), NAN);
  fp.q = qp.data();
  fp.dout = dop.data();
  fp.lse2 = lse2.data();
  fp.drow = drow.data();
  fp.a.o = ref.out.data();  // the backward reads the forward output (the CPU's, as the model passes it)
  fp.a.dout = ref.dout.data();
  fp.a.dq = gdq.data();
  fp.a.dk = gdk.data();
  fp.a.dv = gdv.data();
  simt::launch(dim3(4), dim3(256), 0, [&] {
    flash_tc::k_flash_drow(ref.dout.data(), ref.out.data(), drow.data(), c.B, c.T, c.Hq, c.dh, fp.T_pad);
  });
  if (c.dh == 64) {
    run_forward<64>(fp, true);
    run_backward<64>(fp);
  } else {
    run_forward<128>(fp, true);
    run_backward<128>(fp);
  }
  simt_test::expect_close(gdq, ref.dq, kTol, what + " dq");
  simt_test::expect_close(gdk, ref.dk, kTol, what + " dk");
  simt_test::expect_close(gdv, ref.dv, kTol, what + " dv");
}

// Training chunks: head_dim 64 and 128, several query blocks and key tiles with ragged ends,
// one KV head for four query heads, sliding windows and document starts.
TEST(SimtFlashAttention, TrainingChunksMatchTheCpuForwardAndBackward) {
  const std::vector<AttnCase> cases = {
      {2, 70, 70, 4, 2, 64, 0, {0, 0}, false},
      {1, 130, 130, 4, 2, 128, 0, {0}, false},
      {2, 100, 100, 4, 1, 64, 33, {0, 0}, true},
      {1, 200, 200, 2, 1, 128, 70, {0}, true},
  };
  uint64_t seed = 11;
  for (const simt::Schedule& schedule : kSchedules) {
    simt::set_schedule(schedule);
    for (const AttnCase& c : cases) check_case(c, seed += 10);
  }
  simt::set_schedule({});
}

// Chunks later in a sequence, forward and backward: prefill after earlier chunks, and a
// context-parallel chunk's queries over its whole gathered sequence (with a window and document
// starts). The slots past each chunk hold NaN and the packing must keep them out.
TEST(SimtFlashAttention, ChunksAtAnOffsetMatchTheCpu) {
  const std::vector<AttnCase> cases = {
      {1, 70, 200, 4, 2, 128, 0, {100}, false},
      {2, 64, 160, 4, 2, 64, 0, {64, 20}, false},
      {2, 80, 240, 4, 2, 64, 50, {80, 160}, true},
      {1, 96, 384, 2, 1, 128, 0, {192}, true},
  };
  uint64_t seed = 101;
  for (const simt::Schedule& schedule : kSchedules) {
    simt::set_schedule(schedule);
    for (const AttnCase& c : cases) check_case(c, seed += 10);
  }
  simt::set_schedule({});
}

}  // namespace
}  // namespace zaya
