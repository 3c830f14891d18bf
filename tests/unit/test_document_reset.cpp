// reset_at_document_boundary (spec decision 7): packed rows where every document restarts the
// CCA convolution, the delayed value, attention and RoPE positions.
//  * ops: the CPU kernels equal the plain reference ops with document starts, and their
//    backward passes finite differences;
//  * model: a packed row equals its documents run one by one (logits, routing, loss and every
//    parameter gradient), and matches the PyTorch twin's fixtures (reset.safetensors).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/reference/reference_ops.h"
#include "core/error.h"
#include "data/loader.h"
#include "grad_check.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/model_io.h"
#include "test_helpers.h"

namespace zaya {
namespace {

using Vec = std::vector<float>;
Vec randn(size_t n, uint64_t seed, double scale = 1.0) { return test::fd_randn(n, seed, scale); }
size_t sz(int64_t n) { return static_cast<size_t>(n); }

// Per-token start table for B rows of length T with the given starts in every row.
std::vector<int32_t> table(int64_t B, int64_t T, const std::vector<std::vector<int32_t>>& starts) {
  std::vector<int32_t> out(sz(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const auto& s = starts[sz(b) % starts.size()];
    document_segments(s.data(), s.size(), T, out.data() + b * T);
  }
  return out;
}

TEST(DocumentReset, OpsMatchReference) {
  CpuBackend be;
  // conv (both CPU paths: the direct one for short rows and the GEMM one), values, attention
  // across the 64-query / 128-key blocks, with and without a window.
  for (int64_t T : {int64_t(6), int64_t(40), int64_t(150)}) {
    SCOPED_TRACE(::testing::Message() << "T " << T);
    const int64_t B = 2, Hq = 4, Hkv = 2, dh = 8, C = (Hq + Hkv) * dh, N = B * T;
    auto seg = table(B, T, {{0, 1, 2, int32_t(T / 2)}, {3, int32_t(T - 1)}});
    for (int64_t t0 : {int64_t(2), int64_t(3)}) {
      const int64_t t1 = 2, P = t0 - 1 + t1 - 1;
      auto u = randn(sz(N * C), 1), wd = randn(sz(C * t0), 2), bd = randn(sz(C), 3),
           wg = randn(sz(C * dh * t1), 4, 0.3), bg = randn(sz(C), 5);
      Vec s1(sz(B * P * C), 0.0f), s2 = s1, z1(sz(N * C), NAN), z2 = z1;
      CcaConvArgs a{u.data(), s1.data(), wd.data(), bd.data(), wg.data(), bg.data(), z1.data(), B, T, C, t0, t1, dh};
      a.seg_start = seg.data();
      be.cca_conv(a);
      a.state = s2.data();
      a.z = z2.data();
      reference::cca_conv(a);
      EXPECT_LT(test::max_rel_err(z1.data(), z2.data(), z1.size()), 1e-5) << "t0 " << t0;
      a.seg_start = nullptr;  // and the resets do change the output
      reference::cca_conv(a);
      EXPECT_GT(test::max_rel_err(z1.data(), z2.data(), z1.size()), 1e-2);
    }
    const int64_t half = Hkv * dh / 2;
    auto vc = randn(sz(N * half), 6), vd = randn(sz(N * half), 7);
    Vec vs1(sz(B * half), 0.0f), vs2 = vs1, v1(sz(N * 2 * half), NAN), v2 = v1;
    CcaValueArgs va{vc.data(), vd.data(), vs1.data(), v1.data(), B, T, half};
    va.seg_start = seg.data();
    be.cca_values(va);
    va.v_state = vs2.data();
    va.v = v2.data();
    reference::cca_values(va);
    EXPECT_EQ(v1, v2);
    EXPECT_EQ(v1[sz((1 * 2 * half) + half)], 0.0f);  // row 0, t = 1 starts a document

    for (int64_t window : {int64_t(0), int64_t(5)}) {
      auto q = randn(sz(N * Hq * dh), 8, 1.5), k = randn(sz(N * Hkv * dh), 9, 1.5), v = randn(sz(N * Hkv * dh), 10);
      std::vector<int64_t> pos0(sz(B), 0);
      Vec o1(q.size(), NAN), o2 = o1;
      AttentionArgs aa{q.data(), k.data(), v.data(), o1.data(), pos0.data(), B, T, T, Hq, Hkv, dh, window,
                       1.0f / std::sqrt(float(dh))};
      aa.seg_start = seg.data();
      be.attention(aa);
      aa.out = o2.data();
      reference::attention(aa);
      EXPECT_LT(test::max_rel_err(o1.data(), o2.data(), o1.size()), 1e-5) << "window " << window;
    }
  }
}

TEST(DocumentReset, OpGradientsMatchFiniteDifferences) {
  CpuBackend be;
  const auto o = [] {
    test::FdOptions f;
    f.rel_step = 1e-2;
    f.max_elements = 48;
    return f;
  }();
  const int64_t B = 2, T = 11, heads = 3, dh = 8, C = heads * dh, N = B * T;
  auto seg = table(B, T, {{0, 1, 4, 5}, {6}});
  {  // convolution
    const int64_t t0 = 3, t1 = 2, P = t0 - 1 + t1 - 1;
    auto u = randn(sz(N * C), 20), wd = randn(sz(C * t0), 21), bd = randn(sz(C), 22), wg = randn(sz(C * dh * t1), 23, 0.3),
         bg = randn(sz(C), 24), c = randn(sz(N * C), 25);
    Vec state(sz(B * P * C), 0.0f), z(sz(N * C));
    CcaConvArgs a{u.data(), state.data(), wd.data(), bd.data(), wg.data(), bg.data(), z.data(), B, T, C, t0, t1, dh};
    a.seg_start = seg.data();
    auto loss = [&] {
      std::fill(state.begin(), state.end(), 0.0f);
      be.cca_conv(a);
      return test::fd_dot(c, z);
    };
    Vec du(u.size(), 0.0f), dwd(wd.size(), 0.0f), dbd(bd.size(), 0.0f), dwg(wg.size(), 0.0f), dbg(bg.size(), 0.0f);
    be.cca_conv_backward(a, c.data(), du.data(), dwd.data(), dbd.data(), dwg.data(), dbg.data());
    // rows at and right after every document start are always checked
    std::vector<int64_t> edges;
    for (int64_t n = 0; n < N; ++n)
      if (seg[sz(n)] == n % T || seg[sz(n)] + 1 == n % T) edges.push_back(n * C + n % C);
    EXPECT_TRUE(test::check_gradient("conv du", u.data(), N * C, du.data(), loss, o, edges));
    EXPECT_TRUE(test::check_gradient("conv dw_dw", wd.data(), C * t0, dwd.data(), loss, o));
    EXPECT_TRUE(test::check_gradient("conv db_dw", bd.data(), C, dbd.data(), loss, o));
    EXPECT_TRUE(test::check_gradient("conv dw_grp", wg.data(), C * dh * t1, dwg.data(), loss, o));
    EXPECT_TRUE(test::check_gradient("conv db_grp", bg.data(), C, dbg.data(), loss, o));
  }
  {  // delayed value
    const int64_t half = 6, n = N * half;
    auto vc = randn(sz(n), 30), vd = randn(sz(n), 31), c = randn(sz(2 * n), 32);
    Vec state(sz(B * half)), v(sz(2 * n));
    CcaValueArgs a{vc.data(), vd.data(), state.data(), v.data(), B, T, half};
    a.seg_start = seg.data();
    auto loss = [&] {
      std::fill(state.begin(), state.end(), 0.0f);
      be.cca_values(a);
      return test::fd_dot(c, v);
    };
    Vec dvc(sz(n), NAN), dvd(sz(n), NAN);
    be.cca_values_backward(c.data(), dvc.data(), dvd.data(), B, T, half, seg.data());
    EXPECT_TRUE(test::check_gradient("values dv_cur", vc.data(), n, dvc.data(), loss, o));
    EXPECT_TRUE(test::check_gradient("values dv_del", vd.data(), n, dvd.data(), loss, o));
  }
  {  // attention
    const int64_t Hq = 4, Hkv = 2, nq = N * Hq * dh, nkv = N * Hkv * dh;
    auto q = randn(sz(nq), 40, 1.5), k = randn(sz(nkv), 41, 1.5), v = randn(sz(nkv), 42), c = randn(sz(nq), 43);
    std::vector<int64_t> pos0(sz(B), 0);
    Vec out(sz(nq));
    AttentionArgs a{q.data(), k.data(), v.data(), out.data(), pos0.data(), B, T, T, Hq, Hkv, dh, 0,
                    1.0f / std::sqrt(float(dh))};
    a.seg_start = seg.data();
    auto loss = [&] {
      be.attention(a);
      return test::fd_dot(c, out);
    };
    loss();
    Vec dq(sz(nq), NAN), dk(sz(nkv), NAN), dv(sz(nkv), NAN);
    be.attention_backward(a, c.data(), dq.data(), dk.data(), dv.data());
    EXPECT_TRUE(test::check_gradient("attention dq", q.data(), nq, dq.data(), loss, o));
    EXPECT_TRUE(test::check_gradient("attention dk", k.data(), nkv, dk.data(), loss, o));
    EXPECT_TRUE(test::check_gradient("attention dv", v.data(), nkv, dv.data(), loss, o));
  }
}

TEST(DocumentReset, BadStartTablesAreRefused) {
  const int32_t good[] = {0, 1, 1, 3};
  EXPECT_NO_THROW(check_segments(good, 1, 4));
  for (std::vector<int32_t> bad : {std::vector<int32_t>{0, 2, 2, 2}, {0, 0, 1, 1}, {1, 1, 1, 1}, {0, -1, 2, 3}}) {
    try {
      check_segments(bad.data(), 1, 4);
      ADD_FAILURE() << "accepted a bad table";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("document start table"), std::string::npos) << e.what();
    }
  }
}

// A packed row equals its documents run one at a time: logits, routing, the loss and every
// parameter gradient (summed over the documents).
TEST(DocumentReset, PackedRowEqualsDocumentsRunSeparately) {
  auto be = make_cpu_backend();
  ModelConfig c = preset_config("zaya-tiny");
  Model m(c, *be);
  m.init_random(7);
  const int64_t T = 24, V = c.vocab_size;
  const std::vector<int32_t> starts = {0, 1, 7, 8, 15};
  std::vector<int32_t> ids(sz(T)), tg(sz(T)), seg(sz(T));
  for (int64_t t = 0; t < T; ++t) ids[sz(t)] = int32_t((t * 37 + 11) % V);
  for (int64_t t = 0; t < T; ++t) tg[sz(t)] = t + 1 < T ? ids[sz(t + 1)] : -1;
  document_segments(starts.data(), starts.size(), T, seg.data());

  Vec packed_logits(sz(T * V)), grads_packed(sz(m.layout().total), 0.0f), grads_docs = grads_packed;
  std::vector<int32_t> packed_experts(sz(c.num_hidden_layers * T));
  ForwardOutputs out;
  out.logits = packed_logits.data();
  out.experts = packed_experts.data();
  m.forward(ids.data(), 1, T, nullptr, out, seg.data());
  StepStats packed = m.forward_backward(ids.data(), tg.data(), 1, T, grads_packed.data(), 0.5f, seg.data());

  double loss_docs = 0;
  std::vector<int64_t> bounds(starts.begin() + 1, starts.end());
  bounds.insert(bounds.begin(), 0);
  bounds.push_back(T);
  for (size_t d = 0; d + 1 < bounds.size(); ++d) {
    const int64_t s = bounds[d], n = bounds[d + 1] - s;
    Vec logits(sz(n * V));
    std::vector<int32_t> experts(sz(c.num_hidden_layers * n));
    ForwardOutputs o;
    o.logits = logits.data();
    o.experts = experts.data();
    m.forward(ids.data() + s, 1, n, nullptr, o);
    EXPECT_LT(test::max_rel_err(packed_logits.data() + s * V, logits.data(), logits.size()), 1e-5) << "doc " << d;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      for (int64_t t = 0; t < n; ++t)
        EXPECT_EQ(packed_experts[sz(l * T + s + t)], experts[sz(l * n + t)]) << "doc " << d;
    loss_docs += m.forward_backward(ids.data() + s, tg.data() + s, 1, n, grads_docs.data(), 0.5f).loss_sum;
  }
  EXPECT_NEAR(packed.loss_sum, loss_docs, 1e-5 * std::fabs(loss_docs));
  for (const ParamSpec& p : m.layout().params) {
    if (p.kind == ParamKind::Buffer) continue;
    EXPECT_LT(test::max_rel_err(grads_packed.data() + p.offset, grads_docs.data() + p.offset, sz(p.numel)), 1e-4)
        << p.name;
  }
  // Without resets the same packed row gives different logits.
  Vec plain(sz(T * V));
  ForwardOutputs po;
  po.logits = plain.data();
  m.forward(ids.data(), 1, T, nullptr, po);
  EXPECT_GT(test::max_rel_err(plain.data(), packed_logits.data(), plain.size()), 1e-2);
}

// The PyTorch twin's packed forward (every document run on its own) and autograd gradients.
class ResetFixture : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> reset_cases() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(test::source_path("tests/fixtures")))
    if (std::filesystem::exists(e.path() / "reset.safetensors")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(DocumentReset, TwinFixturesExist) { EXPECT_GE(reset_cases().size(), 3u); }

TEST_P(ResetFixture, LogitsRoutingLossAndGradientsMatchTwin) {
  const std::string dir = test::source_path("tests/fixtures/" + GetParam());
  auto be = make_cpu_backend();
  auto model = load_model(dir, *be);
  const ModelConfig& c = model->config();
  auto batch = nlohmann::json::parse(std::ifstream(dir + "/ids.json")).get<std::vector<std::vector<int32_t>>>();
  const int64_t B = int64_t(batch.size()), T = int64_t(batch[0].size()), V = c.vocab_size, L = c.num_hidden_layers;
  std::vector<int32_t> ids, targets;
  for (auto& seq : batch) {
    ids.insert(ids.end(), seq.begin(), seq.end());
    for (int64_t t = 0; t < T; ++t) targets.push_back(t + 1 < T ? seq[sz(t + 1)] : -1);
  }
  SafeTensorsSet ref = SafeTensorsSet::open_file(dir + "/reset.safetensors");
  const auto* se = ref.find("doc_starts");
  ASSERT_NE(se, nullptr);
  ASSERT_EQ(se->info->numel(), B * T);
  const int32_t* seg = reinterpret_cast<const int32_t*>(se->file->data(*se->info));

  Vec logits(sz(B * T * V)), want(sz(B * T * V));
  std::vector<int32_t> experts(sz(L * B * T));
  ForwardOutputs out;
  out.logits = logits.data();
  out.experts = experts.data();
  model->forward(ids.data(), B, T, nullptr, out, seg);
  ref.read_f32("logits", want.data());
  EXPECT_LT(test::max_rel_err(logits.data(), want.data(), want.size()), 1e-5);
  const auto* ee = ref.find("experts");
  ASSERT_EQ(ee->info->numel(), L * B * T);
  const int32_t* want_experts = reinterpret_cast<const int32_t*>(ee->file->data(*ee->info));
  EXPECT_EQ(experts, std::vector<int32_t>(want_experts, want_experts + L * B * T));

  Vec grads(sz(model->layout().total), 0.0f);
  StepStats st = model->forward_backward(ids.data(), targets.data(), B, T, grads.data(), 1.0f / float(B * (T - 1)), seg);
  float ref_loss;
  ref.read_f32("loss", &ref_loss);
  EXPECT_NEAR(st.loss_sum / double(st.tokens), ref_loss, 1e-5 * std::fabs(ref_loss));
  int checked = 0;
  for (const ParamSpec& p : model->layout().params) {
    if (p.kind == ParamKind::Buffer) continue;
    Vec g(sz(p.numel));
    ASSERT_NE(ref.find("grad." + p.name), nullptr) << p.name;
    ref.read_f32("grad." + p.name, g.data());
    EXPECT_LT(test::max_rel_err(grads.data() + p.offset, g.data(), g.size()), 1e-4) << p.name;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

INSTANTIATE_TEST_SUITE_P(Twin, ResetFixture, ::testing::ValuesIn(reset_cases()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace zaya
