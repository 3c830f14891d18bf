// Every CPU op against its plain reference (backend/reference): fresh random inputs per case,
// outputs poisoned with NaN before each run so an unwritten element fails the comparison.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// The merge fused with the norm that reads it is the two ops in one pass: bitwise equal to
// residual_scale then rmsnorm, and its backward to rmsnorm_backward (accumulating) then
// residual_scale_backward. Shapes below and above the threading threshold (rows * dim > 65536,
// where the parameter gradients are summed per thread); the forward in place and not.
::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ << " of " << a.size() << " elements differ in their bits";
}

TEST(CpuOps, ResidualScaleRmsnormIsTheTwoOpsBitwise) {
  CpuBackend be;
  for (auto [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{37, 80}, {301, 260}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
    const size_t n = size_t(rows * dim), d = size_t(dim);
    uint64_t seed = 100 + uint64_t(rows);
    auto vec = [&](size_t k, double scale = 1.0) { return random_vector(k, seed++, scale); };
    auto r = vec(n, 3.0), h = vec(n), hs = vec(d), hb = vec(d), rs = vec(d), rb = vec(d), w = vec(d);
    ResidualNormArgs a;
    a.r = r.data(); a.h = h.data(); a.hidden_scale = hs.data(); a.hidden_bias = hb.data();
    a.residual_scale = rs.data(); a.residual_bias = rb.data(); a.norm_weight = w.data();
    a.eps = 1e-5f; a.rows = rows; a.dim = dim;

    auto r_two = r, y_two = poisoned(n);
    be.residual_scale(r_two.data(), h.data(), hs.data(), hb.data(), rs.data(), rb.data(), rows, dim);
    be.rmsnorm(r_two.data(), w.data(), a.eps, y_two.data(), rows, dim);
    auto r_out = poisoned(n), y = poisoned(n);
    be.residual_scale_rmsnorm(a, r_out.data(), y.data());
    EXPECT_TRUE(same_bits(r_out, r_two));
    EXPECT_TRUE(same_bits(y, y_two));
    auto r_in_place = r, y_in_place = poisoned(n);  // r_out == a.r, as the model calls it
    ResidualNormArgs in_place = a;
    in_place.r = r_in_place.data();
    be.residual_scale_rmsnorm(in_place, r_in_place.data(), y_in_place.data());
    EXPECT_TRUE(same_bits(r_in_place, r_two));
    EXPECT_TRUE(same_bits(y_in_place, y_two));

    const auto dy = vec(n), dr0 = vec(n);
    std::vector<std::vector<float>> g0;
    for (int k = 0; k < 5; ++k) g0.push_back(vec(d));
    auto dr_two = dr0, dh_two = poisoned(n);
    auto g_two = g0;
    be.rmsnorm_backward(r_out.data(), w.data(), dy.data(), a.eps, dr_two.data(), g_two[4].data(), rows, dim, true);
    be.residual_scale_backward(r.data(), h.data(), hs.data(), hb.data(), rs.data(), rb.data(), dr_two.data(),
                               dh_two.data(), g_two[0].data(), g_two[1].data(), g_two[2].data(), g_two[3].data(),
                               rows, dim);
    auto dr = dr0, dh = poisoned(n);
    auto g = g0;
    be.residual_scale_rmsnorm_backward(a, r_out.data(), dy.data(), dr.data(), dh.data(),
                                       {g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data()});
    EXPECT_TRUE(same_bits(dr, dr_two));
    EXPECT_TRUE(same_bits(dh, dh_two));
    for (int k = 0; k < 5; ++k) EXPECT_TRUE(same_bits(g[size_t(k)], g_two[size_t(k)])) << "parameter gradient " << k;
  }
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

// Queries past the cache (pos0[b] + T > S, or pos0 < 0) are a caller's bug that every kernel
// would turn into reads outside the cache: forward and backward fail first, naming the sequence.
TEST(CpuOps, AttentionFailsClearlyWhenTheQueriesPassTheCache) {
  CpuBackend be;
  const int64_t B = 2, T = 4, S = 10, H = 2, dh = 16;
  auto q = random_vector(static_cast<size_t>(B * T * H * dh), 33), kv = random_vector(static_cast<size_t>(B * S * H * dh), 34);
  auto out = poisoned(q.size()), dq = poisoned(q.size()), dk = poisoned(kv.size()), dv = poisoned(kv.size());
  for (const std::vector<int64_t>& pos0 : {std::vector<int64_t>{0, 7}, std::vector<int64_t>{6, -1}}) {
    AttentionArgs a{q.data(), kv.data(), kv.data(), out.data(), pos0.data(), B, T, S, H, H, dh, 0, 0.25f};
    const std::string first = std::to_string(pos0[1]) + ".." + std::to_string(pos0[1] + T - 1);
    test::expect_error([&] { be.attention(a); }, {"attention:", "sequence 1", first, "holds 10 rows"});
    test::expect_error([&] { be.attention_backward(a, out.data(), dq.data(), dk.data(), dv.data()); },
                       {"attention_backward:", "sequence 1", first, "holds 10 rows"});
  }
  const std::vector<int64_t> fits = {6, 0};  // the last query of sequence 0 at the cache's last row
  AttentionArgs a{q.data(), kv.data(), kv.data(), out.data(), fits.data(), B, T, S, H, H, dh, 0, 0.25f};
  be.attention(a);
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
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

// The MoE's float64 backward, token by token (plain loops): dx accumulates, dweight is
// overwritten, the weight gradients accumulate.
struct MoeGrads {
  std::vector<double> dx, dweight, dgate_up, ddown;
};
MoeGrads moe_backward_float64(const MoeArgs& a, const std::vector<float>& dout) {
  const int64_t N = a.N, D = a.D, I = a.I, E = a.E;
  MoeGrads g{std::vector<double>(size_t(N * D)), std::vector<double>(size_t(N)),
             std::vector<double>(size_t(E * 2 * I * D)), std::vector<double>(size_t(E * D * I))};
  std::vector<double> h(static_cast<size_t>(2 * I)), act(static_cast<size_t>(I)),
      dact(static_cast<size_t>(I)), dh(static_cast<size_t>(2 * I));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t e = a.expert[n];
    const float* x = a.x + n * D;
    const float* dy = dout.data() + n * D;
    const double w = a.weight[n];
    if (e == E) {
      for (int64_t d = 0; d < D && a.skip_identity; ++d) {
        g.dweight[size_t(n)] += double(dy[d]) * x[d];
        g.dx[size_t(n * D + d)] += w * dy[d];
      }
      continue;
    }
    const float* GU = a.gate_up + e * 2 * I * D;
    const float* DN = a.down + e * D * I;
    for (int64_t j = 0; j < 2 * I; ++j) {
      h[size_t(j)] = 0;
      for (int64_t d = 0; d < D; ++d) h[size_t(j)] += double(GU[j * D + d]) * x[d];
    }
    for (int64_t j = 0; j < I; ++j) {
      const double gate = h[size_t(j)], sg = 1.0 / (1.0 + std::exp(-gate));
      act[size_t(j)] = gate * sg * h[size_t(I + j)];
      dact[size_t(j)] = 0;
      for (int64_t d = 0; d < D; ++d) dact[size_t(j)] += w * dy[d] * DN[d * I + j];
      dh[size_t(j)] = dact[size_t(j)] * h[size_t(I + j)] * sg * (1.0 + gate * (1.0 - sg));
      dh[size_t(I + j)] = dact[size_t(j)] * gate * sg;
    }
    for (int64_t d = 0; d < D; ++d) {
      double y = 0;
      for (int64_t j = 0; j < I; ++j) {
        y += double(DN[d * I + j]) * act[size_t(j)];
        g.ddown[size_t(e * D * I + d * I + j)] += w * dy[d] * act[size_t(j)];
      }
      g.dweight[size_t(n)] += double(dy[d]) * y;
    }
    for (int64_t j = 0; j < 2 * I; ++j)
      for (int64_t d = 0; d < D; ++d) {
        g.dx[size_t(n * D + d)] += dh[size_t(j)] * GU[j * D + d];
        g.dgate_up[size_t(e * 2 * I * D + j * D + d)] += dh[size_t(j)] * x[d];
      }
  }
  return g;
}

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// Enough tokens that the op runs its tiles on an OpenMP team, with an unbalanced router: expert
// 0 takes about 70% of them (several row tiles of kMoeRowTile), expert 1 a partial tile, expert
// 2 none, the rest skip. Forward against the reference, backward against float64 loops, and
// both bitwise the same on one thread and on several (the tiles are fixed, not per thread).
TEST(CpuOps, MoeTilesAnUnbalancedRouterAndMatchesFloat64) {
  CpuBackend be;
  const int64_t N = 3 * kMoeRowTile + 200, D = 96, I = 40, E = 3;
  auto x = random_vector(size_t(N * D), 50), gu = random_vector(size_t(E * 2 * I * D), 51, 0.3),
       dn = random_vector(size_t(E * D * I), 52, 0.3), w = random_vector(size_t(N), 53),
       dout = random_vector(size_t(N * D), 54);
  std::vector<int32_t> expert(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) expert[size_t(n)] = n % 10 < 7 ? 0 : n % 10 < 9 ? 1 : int32_t(E);
  int64_t rows0 = 0, routed = 0;
  for (int32_t e : expert) rows0 += e == 0, routed += e < E;
  ASSERT_GT(rows0, 2 * kMoeRowTile);
  ASSERT_GT(routed * D, 65536);  // the threshold of the op's OpenMP team
  const std::vector<float> dx0 = random_vector(size_t(N * D), 55), dgu0 = random_vector(gu.size(), 56),
                           ddn0 = random_vector(dn.size(), 57);
  for (bool identity : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "skip_identity " << identity);
    std::vector<std::vector<float>> outs, dxs, dws, dgus, ddns;
    const int threads = omp_get_max_threads();
    for (int t : {std::max(2, threads), 1}) {  // at least 2 threads, even where OpenMP is set to 1
      omp_set_num_threads(t);
      auto out = poisoned(size_t(N * D)), dw = poisoned(size_t(N));
      auto dx = dx0, dgu = dgu0, ddn = ddn0;
      MoeArgs a{x.data(), expert.data(), w.data(), gu.data(), dn.data(), out.data(), N, D, I, E, identity};
      be.moe(a);
      be.moe_backward(a, dout.data(), dx.data(), dw.data(), dgu.data(), ddn.data());
      outs.push_back(out), dxs.push_back(dx), dws.push_back(dw), dgus.push_back(dgu), ddns.push_back(ddn);
    }
    omp_set_num_threads(threads);
    EXPECT_EQ(outs[0], outs[1]);
    EXPECT_EQ(dxs[0], dxs[1]);
    EXPECT_EQ(dws[0], dws[1]);
    EXPECT_EQ(dgus[0], dgus[1]);
    EXPECT_EQ(ddns[0], ddns[1]);

    auto ref = poisoned(size_t(N * D));
    MoeArgs a{x.data(), expert.data(), w.data(), gu.data(), dn.data(), ref.data(), N, D, I, E, identity};
    reference::moe(a);
    EXPECT_LT(max_rel_err(outs[0].data(), ref.data(), ref.size()), 1e-5);
    MoeGrads g = moe_backward_float64(a, dout);
    for (size_t i = 0; i < g.dx.size(); ++i) g.dx[i] += dx0[i];
    for (size_t i = 0; i < g.dgate_up.size(); ++i) g.dgate_up[i] += dgu0[i];
    for (size_t i = 0; i < g.ddown.size(); ++i) g.ddown[i] += ddn0[i];
    test::expect_close(dxs[0], to_float(g.dx), 1e-5, "dx");
    test::expect_close(dws[0], to_float(g.dweight), 1e-5, "dweight");
    test::expect_close(dgus[0], to_float(g.dgate_up), 1e-5, "dgate_up");
    test::expect_close(ddns[0], to_float(g.ddown), 1e-5, "ddown");
    // The expert with no tokens keeps its gradients exactly.
    for (int64_t i = 0; i < 2 * I * D; ++i)
      ASSERT_EQ(dgus[0][size_t(2 * 2 * I * D + i)], dgu0[size_t(2 * 2 * I * D + i)]);
    for (int64_t i = 0; i < D * I; ++i)
      ASSERT_EQ(ddns[0][size_t(2 * D * I + i)], ddn0[size_t(2 * D * I + i)]);
  }
}

}  // namespace
}  // namespace zaya
