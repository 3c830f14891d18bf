// Every CPU op against its plain reference (backend/reference): fresh random inputs per case,
// outputs poisoned with NaN before each run so an unwritten element fails the comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/reference/reference_ops.h"
#include "test_helpers.h"

namespace zaya {
namespace {

using test::max_rel_err;
using test::random_vector;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> poisoned(size_t n) { return std::vector<float>(n, kNaN); }

// Shapes cover one row (sgemv), a few rows (the few-rows kernel of batched decode: 4-row blocks,
// a tail, threaded when large), just past it, and a full GEMM.
TEST(CpuOps, LinearMatchesReference) {
  CpuBackend be;
  for (auto [M, K, N] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 64, 48}, {7, 33, 5}, {4, 512, 160}, {16, 520, 130}, {17, 64, 9}, {130, 96, 200}}) {
    auto x = random_vector(static_cast<size_t>(M * K), 1), w = random_vector(static_cast<size_t>(N * K), 2), bias = random_vector(static_cast<size_t>(N), 3);
    auto y = poisoned(static_cast<size_t>(M * N)), ref = poisoned(static_cast<size_t>(M * N));
    be.linear(x.data(), w.data(), bias.data(), y.data(), M, K, N, false, 0);
    reference::linear(x.data(), w.data(), bias.data(), ref.data(), M, K, N);
    EXPECT_LT(max_rel_err(y.data(), ref.data(), y.size()), 1e-5) << M << "x" << K << "x" << N;
    // Strided output (ldy) and accumulation.
    auto wide = poisoned(static_cast<size_t>(M * (N + 3)));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) wide[size_t(m * (N + 3) + n)] = 1.0f;
    be.linear(x.data(), w.data(), nullptr, wide.data(), M, K, N, true, N + 3);
    reference::linear(x.data(), w.data(), nullptr, ref.data(), M, K, N);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) ASSERT_NEAR(wide[size_t(m * (N + 3) + n)], ref[size_t(m * N + n)] + 1.0f, 1e-4);
    EXPECT_TRUE(std::isnan(wide[size_t(N)]));  // padding column untouched
  }
}

TEST(CpuOps, NormsActivationsSoftmaxRouting) {
  CpuBackend be;
  const int64_t rows = 37, dim = 80;
  auto x = random_vector(static_cast<size_t>(rows * dim), 4, 3.0), w = random_vector(static_cast<size_t>(dim), 5);
  auto y = poisoned(x.size()), ref = poisoned(x.size());
  be.rmsnorm(x.data(), w.data(), 1e-5f, y.data(), rows, dim);
  reference::rmsnorm(x.data(), w.data(), 1e-5f, ref.data(), rows, dim);
  EXPECT_LT(max_rel_err(y.data(), ref.data(), y.size()), 1e-6);

  auto h = random_vector(x.size(), 6), hs = random_vector(static_cast<size_t>(dim), 7), hb = random_vector(static_cast<size_t>(dim), 8),
       rs = random_vector(static_cast<size_t>(dim), 9), rb = random_vector(static_cast<size_t>(dim), 10);
  auto r1 = x, r2 = x;
  be.residual_scale(r1.data(), h.data(), hs.data(), hb.data(), rs.data(), rb.data(), rows, dim);
  reference::residual_scale(r2.data(), h.data(), hs.data(), hb.data(), rs.data(), rb.data(), rows, dim);
  EXPECT_LT(max_rel_err(r1.data(), r2.data(), r1.size()), 1e-6);

  auto g1 = x, g2 = x;
  be.gelu(g1.data(), int64_t(g1.size()));
  reference::gelu(g2.data(), int64_t(g2.size()));
  EXPECT_LT(max_rel_err(g1.data(), g2.data(), g1.size()), 1e-6);

  const int64_t classes = 9;
  auto s1 = random_vector(static_cast<size_t>(rows * classes), 11, 4.0), s2 = s1;
  be.softmax(s1.data(), rows, classes);
  reference::softmax(s2.data(), rows, classes);
  EXPECT_LT(max_rel_err(s1.data(), s2.data(), s1.size()), 1e-6);

  auto bias = random_vector(static_cast<size_t>(classes), 12, 0.05);
  std::vector<int32_t> e1(static_cast<size_t>(rows), -1), e2(static_cast<size_t>(rows), -2);
  auto w1 = poisoned(static_cast<size_t>(rows)), w2 = poisoned(static_cast<size_t>(rows));
  be.route_select(s1.data(), bias.data(), e1.data(), w1.data(), rows, classes);
  reference::route_select(s2.data(), bias.data(), e2.data(), w2.data(), rows, classes);
  EXPECT_EQ(e1, e2);
  EXPECT_LT(max_rel_err(w1.data(), w2.data(), w1.size()), 1e-6);
}

struct CcaShape {
  int64_t B, T, Hq, Hkv, dh, t0, t1, rotary;
};

TEST(CpuOps, CcaConvQkValuesMatchReference) {
  CpuBackend be;
  for (CcaShape s : {CcaShape{2, 9, 4, 2, 16, 2, 2, 8}, CcaShape{1, 1, 2, 2, 8, 2, 2, 8},
                     CcaShape{3, 70, 8, 2, 32, 3, 2, 32}, CcaShape{1, 5, 4, 1, 16, 2, 4, 12}}) {
    const int64_t C = (s.Hq + s.Hkv) * s.dh, P = (s.t0 - 1) + (s.t1 - 1), N = s.B * s.T;
    auto u = random_vector(static_cast<size_t>(N * C), 20), w_dw = random_vector(static_cast<size_t>(C * s.t0), 21),
         b_dw = random_vector(static_cast<size_t>(C), 22), w_grp = random_vector(static_cast<size_t>(C * s.dh * s.t1), 23, 0.2),
         b_grp = random_vector(static_cast<size_t>(C), 24), state0 = random_vector(static_cast<size_t>(s.B * P * C), 25);
    auto st1 = state0, st2 = state0;
    auto z1 = poisoned(static_cast<size_t>(N * C)), z2 = poisoned(static_cast<size_t>(N * C));
    CcaConvArgs a{u.data(), st1.data(), w_dw.data(), b_dw.data(), w_grp.data(), b_grp.data(), z1.data(),
                  s.B, s.T, C, s.t0, s.t1, s.dh};
    be.cca_conv(a);
    a.state = st2.data();
    a.z = z2.data();
    reference::cca_conv(a);
    EXPECT_LT(max_rel_err(z1.data(), z2.data(), z1.size()), 1e-5);
    EXPECT_EQ(st1, st2);

    auto temp = random_vector(static_cast<size_t>(s.Hkv), 26);
    std::vector<int64_t> pos(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) pos[size_t(n)] = 3 * n + 1000;
    auto q1 = poisoned(static_cast<size_t>(N * s.Hq * s.dh)), q2 = q1, k1 = poisoned(static_cast<size_t>(N * s.Hkv * s.dh)), k2 = k1;
    CcaQkArgs qa{z1.data(), u.data(), temp.data(), pos.data(), q1.data(), k1.data(), N, s.Hq, s.Hkv, s.dh,
                 s.rotary, 1e4};
    be.cca_qk(qa);
    qa.q = q2.data();
    qa.k = k2.data();
    reference::cca_qk(qa);
    EXPECT_LT(max_rel_err(q1.data(), q2.data(), q1.size()), 1e-5);
    EXPECT_LT(max_rel_err(k1.data(), k2.data(), k1.size()), 1e-5);

    const int64_t half = s.Hkv * s.dh / 2;
    auto vc = random_vector(static_cast<size_t>(N * half), 27), vd = random_vector(static_cast<size_t>(N * half), 28),
         vs0 = random_vector(static_cast<size_t>(s.B * half), 29);
    auto vs1 = vs0, vs2 = vs0;
    auto v1 = poisoned(static_cast<size_t>(N * 2 * half)), v2 = v1;
    CcaValueArgs va{vc.data(), vd.data(), vs1.data(), v1.data(), s.B, s.T, half};
    be.cca_values(va);
    va.v_state = vs2.data();
    va.v = v2.data();
    reference::cca_values(va);
    EXPECT_EQ(std::vector<float>(v1), std::vector<float>(v2));
    EXPECT_EQ(vs1, vs2);
  }
}

struct AttnShape {
  int64_t B, T, Hq, Hkv, dh, pos0, window;
};

TEST(CpuOps, AttentionMatchesReference) {
  CpuBackend be;
  for (AttnShape s : {AttnShape{2, 13, 4, 2, 16, 0, 0}, AttnShape{1, 1, 8, 2, 32, 300, 0},
                      AttnShape{2, 150, 4, 1, 16, 0, 0}, AttnShape{1, 200, 4, 4, 16, 57, 37},
                      AttnShape{1, 3, 2, 1, 64, 140, 5}}) {
    const int64_t S = s.pos0 + s.T + 2, kv = s.Hkv * s.dh;
    auto q = random_vector(static_cast<size_t>(s.B * s.T * s.Hq * s.dh), 30, 2.0);
    auto k = random_vector(static_cast<size_t>(s.B * S * kv), 31, 2.0), v = random_vector(static_cast<size_t>(s.B * S * kv), 32);
    std::vector<int64_t> pos0(static_cast<size_t>(s.B), s.pos0);
    auto o1 = poisoned(q.size()), o2 = poisoned(q.size());
    AttentionArgs a{q.data(), k.data(), v.data(), o1.data(), pos0.data(), s.B, s.T, S, s.Hq, s.Hkv, s.dh,
                    s.window, 1.0f / std::sqrt(float(s.dh))};
    be.attention(a);
    a.out = o2.data();
    reference::attention(a);
    EXPECT_LT(max_rel_err(o1.data(), o2.data(), o1.size()), 1e-5) << "T=" << s.T << " window=" << s.window;
  }
}

TEST(CpuOps, MoeMatchesReferenceInBothSkipModes) {
  CpuBackend be;
  const int64_t N = 41, D = 24, I = 16, E = 5;
  auto x = random_vector(static_cast<size_t>(N * D), 40), gu = random_vector(static_cast<size_t>(E * 2 * I * D), 41, 0.3),
       dn = random_vector(static_cast<size_t>(E * D * I), 42, 0.3), w = random_vector(static_cast<size_t>(N), 43);
  std::vector<int32_t> expert(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) expert[size_t(n)] = int32_t((n * 7) % (E + 1));  // includes skip and expert gaps
  expert[3] = 2;
  for (bool identity : {false, true}) {
    auto o1 = poisoned(static_cast<size_t>(N * D)), o2 = poisoned(static_cast<size_t>(N * D));
    MoeArgs a{x.data(), expert.data(), w.data(), gu.data(), dn.data(), o1.data(), N, D, I, E, identity};
    be.moe(a);
    a.out = o2.data();
    reference::moe(a);
    EXPECT_LT(max_rel_err(o1.data(), o2.data(), o1.size()), 1e-5) << "identity=" << identity;
  }
}

}  // namespace
}  // namespace zaya
