// Finite-difference gradient checks of every backward op of the CPU backend (grad_check.h has
// the method). For each op: a fixed random cotangent c is the output gradient, the analytic
// gradients from the backward op are compared with central differences of L = sum(c * f(x))
// evaluated with the forward op. Outputs documented as "overwritten" are poisoned with NaN
// first; outputs documented as accumulating are pre-filled with random values and the check
// runs on (after - before), so both write modes are verified too.
//
// Tolerance: 1e-3 for every op, element-wise (|g - fd| relative to |fd| + rms of the checked fd)
// and directional (see grad_check.h). Steps are 1e-2 of the tensor's rms (5e-3 for attention,
// 1e-3 for GELU and the router, whose selection must not flip); the objective is summed in double.
// Worst errors measured with these settings (ZAYA_GRAD_VERBOSE=1): ~1e-8..7e-5 for ops linear in
// the perturbed input (pure float32 rounding, ~eps32 / step) and <= 2e-4 for the nonlinear ones
// (RMSNorm, softmax, router softmax, CCA QK-norm + RoPE, attention, SwiGLU, LM-head log-sum-exp).
// 1e-3 is therefore ~5x above float32 noise, yet real bugs fail it widely. Mutation runs (each
// backward kernel edited in a scratch copy, never in src/; worst error reported): dropping
// RMSNorm's mean term -> 0.55, its eps -> 2.0; GELU without the pdf term -> 0.38; the CCA key
// mean path without `/ rep` -> 0.45; a RoPE sign -> 0.37; dtemp scaled by 0.9 -> 0.055; conv du
// off by one row -> 0.5; attention without the rowsum(dO*O) term -> 8.8; its window test off by
// one -> 0.019..0.41; dQ scaled by 1.01 -> 0.007; SwiGLU's silu' reduced to sigmoid -> 0.42; the
// LM head reading targets without the chunk offset -> 1.3, or dw from the first chunk only ->
// 0.88; linear dw overwritten instead of accumulated -> 0.88.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "grad_check.h"

namespace zaya {
namespace {

using test::check_gradient;
using test::fd_accumulated;
using test::fd_dot;
using test::FdOptions;
using Vec = std::vector<float>;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Vec randn(size_t n, uint64_t seed, double scale = 1.0) { return test::fd_randn(n, seed, scale); }
Vec nans(size_t n) { return Vec(n, kNaN); }
size_t sz(int64_t n) { return static_cast<size_t>(n); }

FdOptions opts(double rel_step, int64_t max_elements = 32, uint64_t seed = 0x5eed) {
  FdOptions o;
  o.rel_step = rel_step;
  o.max_elements = max_elements;
  o.seed = seed;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Dense ops

TEST(CpuGrads, Linear) {
  CpuBackend be;
  struct Case {
    int64_t M, K, N, pad;
    bool accumulate, bias;
  };
  for (Case s : {Case{3, 5, 4, 0, false, true}, Case{6, 7, 5, 3, true, true}, Case{37, 29, 23, 2, false, true},
                 Case{37, 29, 23, 0, true, false}}) {
    SCOPED_TRACE(::testing::Message() << s.M << "x" << s.K << "x" << s.N << " pad " << s.pad << " acc "
                                      << s.accumulate << " bias " << s.bias);
    const int64_t ld = s.N + s.pad;
    auto x = randn(sz(s.M * s.K), 1), w = randn(sz(s.N * s.K), 2, 0.5), b = randn(sz(s.N), 3);
    auto c = randn(sz(s.M * ld), 4);
    for (int64_t m = 0; m < s.M; ++m)
      for (int64_t n = s.N; n < ld; ++n) c[sz(m * ld + n)] = kNaN;  // dy padding must never be read
    auto loss = [&] {
      Vec y(sz(s.M * s.N));
      be.linear(x.data(), w.data(), s.bias ? b.data() : nullptr, y.data(), s.M, s.K, s.N, false, 0);
      double l = 0;
      for (int64_t m = 0; m < s.M; ++m) l += fd_dot(c.data() + m * ld, y.data() + m * s.N, sz(s.N));
      return l;
    };
    const auto dx0 = s.accumulate ? randn(sz(s.M * s.K), 5) : nans(sz(s.M * s.K));
    const auto dw0 = randn(sz(s.N * s.K), 6), db0 = randn(sz(s.N), 7);
    auto dx = dx0, dw = dw0, db = db0;
    be.linear_backward(x.data(), w.data(), c.data(), dx.data(), dw.data(), s.bias ? db.data() : nullptr, s.M, s.K,
                       s.N, s.accumulate, s.pad ? ld : 0);
    const auto gx = s.accumulate ? fd_accumulated(dx, dx0) : dx;
    const auto gw = fd_accumulated(dw, dw0), gb = fd_accumulated(db, db0);
    EXPECT_TRUE(check_gradient("linear dx", x.data(), s.M * s.K, gx.data(), loss, opts(1e-2)));
    EXPECT_TRUE(check_gradient("linear dw", w.data(), s.N * s.K, gw.data(), loss, opts(1e-2)));
    if (s.bias) EXPECT_TRUE(check_gradient("linear db", b.data(), s.N, gb.data(), loss, opts(1e-2)));
    else EXPECT_EQ(db, db0);
    // Null outputs are skipped: dw alone gives the same dw.
    auto dw_only = dw0;
    be.linear_backward(x.data(), w.data(), c.data(), nullptr, dw_only.data(), nullptr, s.M, s.K, s.N, false,
                       s.pad ? ld : 0);
    EXPECT_EQ(dw_only, dw);
  }
}

TEST(CpuGrads, Embedding) {
  CpuBackend be;
  const int64_t V = 11, D = 6, N = 17;
  std::vector<int32_t> ids(sz(N));
  for (int64_t n = 0; n < N; ++n) ids[sz(n)] = int32_t((n * 5) % 9);  // repeats; rows 9, 10 unused
  auto table = randn(sz(V * D), 10), c = randn(sz(N * D), 11);
  auto loss = [&] {
    Vec out(sz(N * D));
    be.embedding(table.data(), ids.data(), out.data(), N, D);
    return fd_dot(c, out);
  };
  const auto d0 = randn(sz(V * D), 12);
  auto dt = d0;
  be.embedding_backward(ids.data(), c.data(), dt.data(), N, D);
  const auto g = fd_accumulated(dt, d0);
  EXPECT_TRUE(check_gradient("embedding dtable", table.data(), V * D, g.data(), loss, opts(1e-2, 100)));
}

TEST(CpuGrads, RmsNorm) {
  CpuBackend be;
  // The third case has rows with mean(x^2) ~ 1e-6 < eps, where the eps term dominates.
  for (auto [rows, dim, xscale, accumulate] : std::vector<std::tuple<int64_t, int64_t, double, bool>>{
           {7, 24, 3.0, false}, {5, 40, 1.0, true}, {3, 16, 1e-3, false}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim << " scale " << xscale);
    const float eps = 1e-5f;
    auto x = randn(sz(rows * dim), 20, xscale), w = randn(sz(dim), 21), c = randn(sz(rows * dim), 22);
    auto loss = [&] {
      Vec y(sz(rows * dim));
      be.rmsnorm(x.data(), w.data(), eps, y.data(), rows, dim);
      return fd_dot(c, y);
    };
    const auto dx0 = accumulate ? randn(sz(rows * dim), 23) : nans(sz(rows * dim));
    const auto dw0 = randn(sz(dim), 24);
    auto dx = dx0, dw = dw0;
    be.rmsnorm_backward(x.data(), w.data(), c.data(), eps, dx.data(), dw.data(), rows, dim, accumulate);
    const auto gx = accumulate ? fd_accumulated(dx, dx0) : dx;
    const auto gw = fd_accumulated(dw, dw0);
    EXPECT_TRUE(check_gradient("rmsnorm dx", x.data(), rows * dim, gx.data(), loss, opts(1e-2, 64)));
    EXPECT_TRUE(check_gradient("rmsnorm dw", w.data(), dim, gw.data(), loss, opts(1e-2, 64)));
  }
}

TEST(CpuGrads, Affine) {
  CpuBackend be;
  const int64_t rows = 9, dim = 12;
  auto x = randn(sz(rows * dim), 30), scale = randn(sz(dim), 31), bias = randn(sz(dim), 32),
       c = randn(sz(rows * dim), 33);
  auto loss = [&] {
    Vec y = x;
    be.affine(y.data(), scale.data(), bias.data(), rows, dim);
    return fd_dot(c, y);
  };
  const auto ds0 = randn(sz(dim), 34), db0 = randn(sz(dim), 35);
  auto d = c, ds = ds0, db = db0;
  be.affine_backward(x.data(), scale.data(), bias.data(), d.data(), ds.data(), db.data(), rows, dim);
  const auto gs = fd_accumulated(ds, ds0), gb = fd_accumulated(db, db0);
  EXPECT_TRUE(check_gradient("affine dx", x.data(), rows * dim, d.data(), loss, opts(1e-2, 200)));
  EXPECT_TRUE(check_gradient("affine dscale", scale.data(), dim, gs.data(), loss, opts(1e-2)));
  EXPECT_TRUE(check_gradient("affine dbias", bias.data(), dim, gb.data(), loss, opts(1e-2)));
}

TEST(CpuGrads, ResidualScale) {
  CpuBackend be;
  const int64_t rows = 9, dim = 12, n = rows * dim;
  auto r = randn(sz(n), 40), h = randn(sz(n), 41), hs = randn(sz(dim), 42), hb = randn(sz(dim), 43),
       rs = randn(sz(dim), 44), rb = randn(sz(dim), 45), c = randn(sz(n), 46);
  auto loss = [&] {
    Vec y = r;
    be.residual_scale(y.data(), h.data(), hs.data(), hb.data(), rs.data(), rb.data(), rows, dim);
    return fd_dot(c, y);
  };
  const auto dhs0 = randn(sz(dim), 47), dhb0 = randn(sz(dim), 48), drs0 = randn(sz(dim), 49),
             drb0 = randn(sz(dim), 50);
  auto dr = c, dh = nans(sz(n)), dhs = dhs0, dhb = dhb0, drs = drs0, drb = drb0;
  be.residual_scale_backward(r.data(), h.data(), hs.data(), hb.data(), rs.data(), rb.data(), dr.data(), dh.data(),
                             dhs.data(), dhb.data(), drs.data(), drb.data(), rows, dim);
  const auto ghs = fd_accumulated(dhs, dhs0), ghb = fd_accumulated(dhb, dhb0), grs = fd_accumulated(drs, drs0),
             grb = fd_accumulated(drb, drb0);
  const auto o = opts(1e-2, 200);
  EXPECT_TRUE(check_gradient("residual_scale dr", r.data(), n, dr.data(), loss, o));
  EXPECT_TRUE(check_gradient("residual_scale dh", h.data(), n, dh.data(), loss, o));
  EXPECT_TRUE(check_gradient("residual_scale dhs", hs.data(), dim, ghs.data(), loss, o));
  EXPECT_TRUE(check_gradient("residual_scale dhb", hb.data(), dim, ghb.data(), loss, o));
  EXPECT_TRUE(check_gradient("residual_scale drs", rs.data(), dim, grs.data(), loss, o));
  EXPECT_TRUE(check_gradient("residual_scale drb", rb.data(), dim, grb.data(), loss, o));
}

// The merge and the norm as one op: L = sum(c_r * r_out) + sum(c_y * y), so both outputs carry
// gradient (dr comes in as c_r, the merged stream's other readers, and dy as c_y).
TEST(CpuGrads, ResidualScaleRmsnorm) {
  CpuBackend be;
  const int64_t rows = 9, dim = 12, n = rows * dim;
  auto r = randn(sz(n), 60), h = randn(sz(n), 61), hs = randn(sz(dim), 62), hb = randn(sz(dim), 63),
       rs = randn(sz(dim), 64), rb = randn(sz(dim), 65), w = randn(sz(dim), 66), c_r = randn(sz(n), 67),
       c_y = randn(sz(n), 68);
  ResidualNormArgs a;
  a.r = r.data(); a.h = h.data(); a.hidden_scale = hs.data(); a.hidden_bias = hb.data();
  a.residual_scale = rs.data(); a.residual_bias = rb.data(); a.norm_weight = w.data();
  a.eps = 1e-5f; a.rows = rows; a.dim = dim;
  auto loss = [&] {
    Vec r_out(sz(n)), y(sz(n));
    be.residual_scale_rmsnorm(a, r_out.data(), y.data());
    return fd_dot(c_r, r_out) + fd_dot(c_y, y);
  };
  Vec r_out(sz(n)), y(sz(n));
  be.residual_scale_rmsnorm(a, r_out.data(), y.data());
  std::vector<Vec> g0;
  for (uint64_t seed = 70; seed < 75; ++seed) g0.push_back(randn(sz(dim), seed));
  auto g = g0;
  ResidualNormGrads grads{g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data()};
  auto dr = c_r, dh = nans(sz(n));
  be.residual_scale_rmsnorm_backward(a, r_out.data(), c_y.data(), dr.data(), dh.data(), grads);
  const auto o = opts(1e-2, 200);
  EXPECT_TRUE(check_gradient("residual_scale_rmsnorm dr", r.data(), n, dr.data(), loss, o));
  EXPECT_TRUE(check_gradient("residual_scale_rmsnorm dh", h.data(), n, dh.data(), loss, o));
  const char* names[] = {"dhidden_scale", "dhidden_bias", "dresidual_scale", "dresidual_bias", "dnorm_weight"};
  float* params[] = {hs.data(), hb.data(), rs.data(), rb.data(), w.data()};
  for (size_t k = 0; k < 5; ++k) {
    const auto gk = fd_accumulated(g[k], g0[k]);
    EXPECT_TRUE(check_gradient(names[k], params[k], dim, gk.data(), loss, o));
  }
}

TEST(CpuGrads, ScaledAdd) {
  CpuBackend be;
  const int64_t rows = 8, dim = 10, n = rows * dim;
  auto y0 = randn(sz(n), 50), x = randn(sz(n), 51), scale = randn(sz(dim), 52), c = randn(sz(n), 53);
  auto loss = [&] {
    Vec y = y0;
    be.scaled_add(y.data(), x.data(), scale.data(), rows, dim);
    return fd_dot(c, y);
  };
  const auto dx0 = randn(sz(n), 54), ds0 = randn(sz(dim), 55);
  auto dx = dx0, ds = ds0;
  be.scaled_add_backward(x.data(), scale.data(), c.data(), dx.data(), ds.data(), rows, dim);
  const auto gx = fd_accumulated(dx, dx0), gs = fd_accumulated(ds, ds0);
  EXPECT_TRUE(check_gradient("scaled_add dx", x.data(), n, gx.data(), loss, opts(1e-2, 200)));
  EXPECT_TRUE(check_gradient("scaled_add dscale", scale.data(), dim, gs.data(), loss, opts(1e-2)));
}

TEST(CpuGrads, Gelu) {
  CpuBackend be;
  auto x = randn(60, 60, 2.5);
  for (float v : {0.0f, 1e-3f, -1e-3f, 0.7071f, -0.7071f, 4.0f, -4.0f, 6.0f, -6.0f}) x.push_back(v);
  const int64_t n = int64_t(x.size());
  auto c = randn(sz(n), 61);
  auto loss = [&] {
    Vec y = x;
    be.gelu(y.data(), n);
    return fd_dot(c, y);
  };
  auto d = c;
  be.gelu_backward(x.data(), d.data(), n);
  EXPECT_TRUE(check_gradient("gelu dx", x.data(), n, d.data(), loss, opts(1e-3, 100)));
}

TEST(CpuGrads, Softmax) {
  CpuBackend be;
  for (auto [rows, cols, scale] : std::vector<std::tuple<int64_t, int64_t, double>>{{6, 9, 3.0}, {3, 130, 1.0}}) {
    auto s = randn(sz(rows * cols), 70, scale), c = randn(sz(rows * cols), 71);
    auto loss = [&] {
      Vec p = s;
      be.softmax(p.data(), rows, cols);
      return fd_dot(c, p);
    };
    Vec p = s;
    be.softmax(p.data(), rows, cols);
    auto d = c;
    be.softmax_backward(p.data(), d.data(), rows, cols);
    EXPECT_TRUE(check_gradient("softmax ds", s.data(), rows * cols, d.data(), loss, opts(1e-2, 64)));
  }
}

// Routing: weight[n] = p[n, expert[n]] with the argmax held fixed (it is piecewise constant), so
// the loss asserts no perturbation flips a selection (the setup makes every margin >= 0.1).
TEST(CpuGrads, Route) {
  CpuBackend be;
  const int64_t N = 12, E = 6;
  auto s = randn(sz(N * E), 80, 1.5), bias = randn(sz(E), 81, 0.02), c = randn(sz(N), 82);
  for (int64_t n = 0; n < N; ++n) {  // a winner by 1 in logits, every class used (probabilities not saturated)
    float mx = s[sz(n * E)];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, s[sz(n * E + e)]);
    s[sz(n * E + (n * 5) % E)] = mx + 1.0f;
  }
  Vec p0 = s;
  be.softmax(p0.data(), N, E);
  std::vector<int32_t> expert(sz(N));
  Vec weight(sz(N));
  be.route_select(p0.data(), bias.data(), expert.data(), weight.data(), N, E);
  for (int64_t n = 0; n < N; ++n) {
    ASSERT_EQ(expert[sz(n)], int32_t((n * 5) % E));
    for (int64_t e = 0; e < E; ++e)
      if (e != expert[sz(n)]) {
        ASSERT_GT(p0[sz(n * E + expert[sz(n)])] + bias[sz(expert[sz(n)])] - p0[sz(n * E + e)] - bias[sz(e)], 0.1f);
      }
  }
  auto weight_loss = [&](const Vec& probs) {
    std::vector<int32_t> ex(sz(N));
    Vec wt(sz(N));
    be.route_select(probs.data(), bias.data(), ex.data(), wt.data(), N, E);
    if (ex != expert) return double(kNaN);
    return fd_dot(c, wt);
  };
  Vec dprobs = nans(sz(N * E));
  be.route_backward(expert.data(), c.data(), dprobs.data(), N, E);
  // Directly with respect to the probabilities ...
  Vec probs = p0;
  EXPECT_TRUE(check_gradient("route dprobs", probs.data(), N * E, dprobs.data(), [&] { return weight_loss(probs); },
                             opts(1e-3, 100)));
  // ... and through the router softmax: the gradient of the selected probability.
  auto ds = dprobs;
  be.softmax_backward(p0.data(), ds.data(), N, E);
  EXPECT_TRUE(check_gradient("route+softmax ds", s.data(), N * E, ds.data(),
                             [&] {
                               Vec p = s;
                               be.softmax(p.data(), N, E);
                               return weight_loss(p);
                             },
                             opts(1e-3, 100)));
}

// ---------------------------------------------------------------------------------------------
// CCA ops

TEST(CpuGrads, CcaConv) {
  CpuBackend be;
  struct Case {
    int64_t B, T, heads, dh, t0, t1;
  };
  for (Case s : {Case{2, 9, 6, 8, 2, 2}, Case{2, 9, 6, 8, 3, 2}, Case{1, 2, 3, 8, 3, 2}, Case{1, 7, 2, 4, 2, 4}}) {
    SCOPED_TRACE(::testing::Message() << "B " << s.B << " T " << s.T << " t0/t1 " << s.t0 << "/" << s.t1);
    const int64_t C = s.heads * s.dh, G = s.dh, P = (s.t0 - 1) + (s.t1 - 1), N = s.B * s.T;
    auto u = randn(sz(N * C), 90), w_dw = randn(sz(C * s.t0), 91), b_dw = randn(sz(C), 92),
         w_grp = randn(sz(C * G * s.t1), 93, 0.3), b_grp = randn(sz(C), 94), c = randn(sz(N * C), 95);
    Vec state(sz(s.B * P * C), 0.0f), z(sz(N * C));
    CcaConvArgs a{u.data(), state.data(), w_dw.data(), b_dw.data(), w_grp.data(), b_grp.data(), z.data(),
                  s.B, s.T, C, s.t0, s.t1, G};
    auto loss = [&] {
      std::fill(state.begin(), state.end(), 0.0f);  // fresh sequences
      be.cca_conv(a);
      return fd_dot(c, z);
    };
    loss();
    std::fill(state.begin(), state.end(), 0.0f);
    const auto du0 = randn(u.size(), 96), dwd0 = randn(w_dw.size(), 97), dbd0 = randn(b_dw.size(), 98),
               dwg0 = randn(w_grp.size(), 99), dbg0 = randn(b_grp.size(), 100);
    auto du = du0, dwd = dwd0, dbd = dbd0, dwg = dwg0, dbg = dbg0;
    be.cca_conv_backward(a, c.data(), du.data(), dwd.data(), dbd.data(), dwg.data(), dbg.data());
    const auto gu = fd_accumulated(du, du0), gwd = fd_accumulated(dwd, dwd0), gbd = fd_accumulated(dbd, dbd0),
               gwg = fd_accumulated(dwg, dwg0), gbg = fd_accumulated(dbg, dbg0);
    // The first (reads the zero state) and last row of every sequence are always checked.
    std::vector<int64_t> edges;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t t : {int64_t(0), s.T - 1}) edges.push_back((b * s.T + t) * C + (b * 7 + t) % C);
    const auto o = opts(1e-2, 48);
    EXPECT_TRUE(check_gradient("cca_conv du", u.data(), N * C, gu.data(), loss, o, edges));
    EXPECT_TRUE(check_gradient("cca_conv dw_dw", w_dw.data(), C * s.t0, gwd.data(), loss, o));
    EXPECT_TRUE(check_gradient("cca_conv db_dw", b_dw.data(), C, gbd.data(), loss, o));
    EXPECT_TRUE(check_gradient("cca_conv dw_grp", w_grp.data(), C * G * s.t1, gwg.data(), loss, o));
    EXPECT_TRUE(check_gradient("cca_conv db_grp", b_grp.data(), C, gbg.data(), loss, o));
  }
}

// Chunks large enough for the parallel path (the sequences split over threads, each into its own
// partial weight gradients): the gradients match a plain double-precision evaluation of the
// conv's backward, and are bitwise the same on 1 and 2 threads.
TEST(CpuGrads, CcaConvBackwardOfLargeChunksMatchesPlainSumsOnAnyThreadCount) {
  CpuBackend be;
  const int64_t B = 6, T = 64, heads = 6, G = 32, C = heads * G, t0 = 2, t1 = 2, P = (t0 - 1) + (t1 - 1);
  const int64_t Ly = T + t1 - 1;
  ASSERT_GT(T * C * G * t1 * B, int64_t(1) << 18) << "the case must take the parallel path";
  ASSERT_GT(B * T * C, 65536) << "and be large enough for any threaded column sum";
  auto u = randn(sz(B * T * C), 130), w_dw = randn(sz(C * t0), 131), b_dw = randn(sz(C), 132),
       w_grp = randn(sz(C * G * t1), 133, 0.3), b_grp = randn(sz(C), 134), dz = randn(sz(B * T * C), 135);
  Vec state(sz(B * P * C), 0.0f), z(sz(B * T * C));
  CcaConvArgs a{
      u.data(), state.data(), w_dw.data(), b_dw.data(), w_grp.data(), b_grp.data(), z.data(), B, T, C, t0, t1,
      G};

  // The plain sums, in double: ext = P zero rows then u; y = depthwise(ext) over Ly rows;
  // z(t)[c] = b_grp[c] + sum_j sum_ci w_grp[c, ci, j] y(t + j)[head(c) * G + ci].
  std::vector<double> du(u.size(), 0), dwd(w_dw.size(), 0), dbd(b_dw.size(), 0), dwg(w_grp.size(), 0),
      dbg(b_grp.size(), 0);
  for (int64_t b = 0; b < B; ++b) {
    auto ext = [&](int64_t row, int64_t c) {
      return row < P ? 0.0 : double(u[sz((b * T + row - P) * C + c)]);
    };
    std::vector<double> y(sz(Ly * C)), dy(sz(Ly * C), 0);
    for (int64_t s = 0; s < Ly; ++s)
      for (int64_t c = 0; c < C; ++c) {
        double acc = b_dw[sz(c)];
        for (int64_t i = 0; i < t0; ++i) acc += double(w_dw[sz(c * t0 + i)]) * ext(s + i, c);
        y[sz(s * C + c)] = acc;
      }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double g = dz[sz((b * T + t) * C + c)];
        dbg[sz(c)] += g;
        for (int64_t j = 0; j < t1; ++j)
          for (int64_t ci = 0; ci < G; ++ci) {
            const int64_t yc = (c / G) * G + ci;
            dy[sz((t + j) * C + yc)] += g * w_grp[sz((c * G + ci) * t1 + j)];
            dwg[sz((c * G + ci) * t1 + j)] += g * y[sz((t + j) * C + yc)];
          }
      }
    for (int64_t s = 0; s < Ly; ++s)
      for (int64_t c = 0; c < C; ++c) {
        const double g = dy[sz(s * C + c)];
        dbd[sz(c)] += g;
        for (int64_t i = 0; i < t0; ++i) {
          dwd[sz(c * t0 + i)] += g * ext(s + i, c);
          if (s + i >= P) du[sz((b * T + s + i - P) * C + c)] += double(w_dw[sz(c * t0 + i)]) * g;
        }
      }
  }

  struct Grads {
    Vec du, dwd, dbd, dwg, dbg;
  };
  const int threads_before = omp_get_max_threads();
  std::vector<Grads> runs;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Grads g{Vec(u.size(), 0.0f), Vec(w_dw.size(), 0.0f), Vec(b_dw.size(), 0.0f), Vec(w_grp.size(), 0.0f),
            Vec(b_grp.size(), 0.0f)};
    be.cca_conv_backward(a, dz.data(), g.du.data(), g.dwd.data(), g.dbd.data(), g.dwg.data(), g.dbg.data());
    runs.push_back(std::move(g));
  }
  omp_set_num_threads(threads_before);
  // Error relative to the largest gradient of the tensor (the sums cancel, so single entries
  // can be near zero).
  auto close = [](const Vec& x, const std::vector<double>& ref, const char* what) {
    double scale = 0, worst = 0;
    for (double r : ref) scale = std::max(scale, std::abs(r));
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double(x[i]) - ref[i]));
    EXPECT_LT(worst / scale, 1e-5) << what;
  };
  close(runs[0].du, du, "du");
  close(runs[0].dwd, dwd, "dw_dw");
  close(runs[0].dbd, dbd, "db_dw");
  close(runs[0].dwg, dwg, "dw_grp");
  close(runs[0].dbg, dbg, "db_grp");
  EXPECT_EQ(runs[0].du, runs[1].du);
  EXPECT_EQ(runs[0].dwd, runs[1].dwd);
  EXPECT_EQ(runs[0].dbd, runs[1].dbd);
  EXPECT_EQ(runs[0].dwg, runs[1].dwg);
  EXPECT_EQ(runs[0].dbg, runs[1].dbg);
}

TEST(CpuGrads, CcaQk) {
  CpuBackend be;
  struct Case {
    int64_t N, Hq, Hkv, dh, rotary;
  };
  // GQA ratios 1, 2, 4; partial and full rotary.
  for (Case s : {Case{6, 2, 2, 16, 8}, Case{6, 2, 2, 8, 8}, Case{5, 4, 2, 16, 16}, Case{5, 4, 2, 16, 4},
                 Case{4, 8, 2, 16, 16}, Case{4, 4, 1, 8, 4}}) {
    SCOPED_TRACE(::testing::Message() << "Hq " << s.Hq << " Hkv " << s.Hkv << " dh " << s.dh << " rotary " << s.rotary);
    const int64_t C = (s.Hq + s.Hkv) * s.dh, nq = s.N * s.Hq * s.dh, nk = s.N * s.Hkv * s.dh;
    auto z = randn(sz(s.N * C), 110), u = randn(sz(s.N * C), 111), temp = randn(sz(s.Hkv), 112, 0.3);
    for (auto& t : temp) t += 1.0f;
    auto cq = randn(sz(nq), 113), ck = randn(sz(nk), 114);
    std::vector<int64_t> pos(sz(s.N));
    for (int64_t n = 0; n < s.N; ++n) pos[sz(n)] = n % 3 + 7 * (n / 3);  // two short "sequences", varied angles
    Vec q(sz(nq)), k(sz(nk));
    CcaQkArgs a{z.data(), u.data(), temp.data(), pos.data(), q.data(), k.data(), s.N, s.Hq, s.Hkv, s.dh,
                s.rotary, 1e4};
    auto loss = [&] {
      be.cca_qk(a);
      return fd_dot(cq, q) + fd_dot(ck, k);
    };
    const auto du0 = randn(u.size(), 115), dt0 = randn(temp.size(), 116);
    auto dz = nans(z.size()), du = du0, dt = dt0;
    be.cca_qk_backward(a, cq.data(), ck.data(), dz.data(), du.data(), dt.data());
    const auto gu = fd_accumulated(du, du0), gt = fd_accumulated(dt, dt0);
    const auto o = opts(1e-2, 48);
    EXPECT_TRUE(check_gradient("cca_qk dz", z.data(), s.N * C, dz.data(), loss, o));
    EXPECT_TRUE(check_gradient("cca_qk du", u.data(), s.N * C, gu.data(), loss, o));
    EXPECT_TRUE(check_gradient("cca_qk dtemp", temp.data(), s.Hkv, gt.data(), loss, o));
  }
}

TEST(CpuGrads, CcaValues) {
  CpuBackend be;
  const int64_t B = 2, T = 5, half = 6, n = B * T * half;
  auto vc = randn(sz(n), 120), vd = randn(sz(n), 121), c = randn(sz(2 * n), 122);
  Vec state(sz(B * half)), v(sz(2 * n));
  CcaValueArgs a{vc.data(), vd.data(), state.data(), v.data(), B, T, half};
  auto loss = [&] {
    std::fill(state.begin(), state.end(), 0.0f);
    be.cca_values(a);
    return fd_dot(c, v);
  };
  auto dvc = nans(sz(n)), dvd = nans(sz(n));
  be.cca_values_backward(c.data(), dvc.data(), dvd.data(), B, T, half, nullptr);
  EXPECT_TRUE(check_gradient("cca_values dv_cur", vc.data(), n, dvc.data(), loss, opts(1e-2, 100)));
  EXPECT_TRUE(check_gradient("cca_values dv_del", vd.data(), n, dvd.data(), loss, opts(1e-2, 100)));
}

// ---------------------------------------------------------------------------------------------
// Attention (training layout: S = T, pos0 = 0). The CPU kernels block queries by 64 and keys by
// 128; rows at and around those boundaries are always among the checked elements.

TEST(CpuGrads, Attention) {
  CpuBackend be;
  struct Case {
    int64_t B, T, Hq, Hkv, dh, window;
  };
  for (Case s : {Case{2, 13, 4, 2, 8, 0}, Case{1, 140, 4, 1, 8, 0}, Case{1, 140, 4, 2, 8, 37},
                 Case{1, 140, 2, 2, 8, 100}, Case{2, 70, 2, 1, 8, 2}}) {
    SCOPED_TRACE(::testing::Message() << "B " << s.B << " T " << s.T << " Hq " << s.Hq << " Hkv " << s.Hkv
                                      << " window " << s.window);
    const int64_t nq = s.B * s.T * s.Hq * s.dh, nkv = s.B * s.T * s.Hkv * s.dh;
    auto q = randn(sz(nq), 130, 1.5), k = randn(sz(nkv), 131, 1.5), v = randn(sz(nkv), 132), c = randn(sz(nq), 133);
    std::vector<int64_t> pos0(sz(s.B), 0);
    Vec out(sz(nq));
    AttentionArgs a{q.data(), k.data(), v.data(), out.data(), pos0.data(), s.B, s.T, s.T, s.Hq, s.Hkv, s.dh,
                    s.window, 1.0f / std::sqrt(float(s.dh))};
    auto loss = [&] {
      be.attention(a);
      return fd_dot(c, out);
    };
    loss();  // a.out holds the forward output the backward expects
    auto dq = nans(sz(nq)), dk = nans(sz(nkv)), dv = nans(sz(nkv));
    be.attention_backward(a, c.data(), dq.data(), dk.data(), dv.data());
    std::vector<int64_t> eq, ekv;
    for (int64_t t : {int64_t(0), int64_t(63), int64_t(64), int64_t(127), int64_t(128), int64_t(129), s.T - 1})
      if (t < s.T)
        for (int64_t b = 0; b < s.B; ++b) {
          eq.push_back(((b * s.T + t) * s.Hq + (t + b) % s.Hq) * s.dh + t % s.dh);
          ekv.push_back(((b * s.T + t) * s.Hkv + (t + b) % s.Hkv) * s.dh + (t + 3) % s.dh);
        }
    const auto o = opts(5e-3, s.T > 64 ? 12 : 64);
    EXPECT_TRUE(check_gradient("attention dq", q.data(), nq, dq.data(), loss, o, eq));
    EXPECT_TRUE(check_gradient("attention dk", k.data(), nkv, dk.data(), loss, o, ekv));
    EXPECT_TRUE(check_gradient("attention dv", v.data(), nkv, dv.data(), loss, o, ekv));
  }
}

// A context-parallel chunk: queries at positions pos0..pos0+Tc-1 over the whole sequence's S
// keys (S > pos0 + Tc: keys after the chunk are invisible and get no gradient). Checked by finite
// differences, and against the full sequence: the chunks' dq are the full dq's rows, and their
// dk/dv summed over chunks are the full dk/dv.
TEST(CpuGrads, AttentionChunkAtAnOffsetOverTheWholeSequence) {
  CpuBackend be;
  const int64_t S = 150, Hq = 4, Hkv = 2, dh = 8, qs = Hq * dh, kvs = Hkv * dh;
  for (int64_t window : {int64_t(0), int64_t(37)}) {
    SCOPED_TRACE(::testing::Message() << "window " << window);
    auto qf = randn(sz(S * qs), 140, 1.5), k = randn(sz(S * kvs), 141, 1.5), v = randn(sz(S * kvs), 142),
         cf = randn(sz(S * qs), 143);
    // The full sequence's backward.
    std::vector<int64_t> zero(1, 0);
    Vec outf(sz(S * qs));
    AttentionArgs full{qf.data(), k.data(), v.data(), outf.data(), zero.data(), 1, S, S, Hq, Hkv, dh, window,
                       1.0f / std::sqrt(float(dh))};
    be.attention(full);
    auto dqf = nans(sz(S * qs)), dkf = nans(sz(S * kvs)), dvf = nans(sz(S * kvs));
    be.attention_backward(full, cf.data(), dqf.data(), dkf.data(), dvf.data());
    // Three chunks [0, 50), [50, 120), [120, 150), each over all S keys.
    Vec dk_sum(sz(S * kvs), 0.0f), dv_sum(sz(S * kvs), 0.0f);
    for (auto [t0, Tc] : {std::pair<int64_t, int64_t>{0, 50}, {50, 70}, {120, 30}}) {
      SCOPED_TRACE(::testing::Message() << "chunk at " << t0);
      Vec q(qf.begin() + t0 * qs, qf.begin() + (t0 + Tc) * qs), c(cf.begin() + t0 * qs, cf.begin() + (t0 + Tc) * qs);
      std::vector<int64_t> pos0(1, t0);
      Vec out(sz(Tc * qs));
      AttentionArgs a{q.data(), k.data(), v.data(), out.data(), pos0.data(), 1, Tc, S, Hq, Hkv, dh, window,
                      1.0f / std::sqrt(float(dh))};
      auto loss = [&] {
        be.attention(a);
        return fd_dot(c, out);
      };
      loss();
      auto dq = nans(sz(Tc * qs)), dk = nans(sz(S * kvs)), dv = nans(sz(S * kvs));
      be.attention_backward(a, c.data(), dq.data(), dk.data(), dv.data());
      for (int64_t i = 0; i < Tc * qs; ++i)
        ASSERT_NEAR(dq[sz(i)], dqf[sz(t0 * qs + i)], 1e-5f * (1 + std::fabs(dqf[sz(t0 * qs + i)]))) << i;
      for (int64_t i = (t0 + Tc) * kvs; i < S * kvs; ++i) ASSERT_EQ(dk[sz(i)], 0.0f) << "key after the chunk";
      for (int64_t i = 0; i < S * kvs; ++i) {
        dk_sum[sz(i)] += dk[sz(i)];
        dv_sum[sz(i)] += dv[sz(i)];
      }
      std::vector<int64_t> ekv;
      for (int64_t t : {t0, t0 + Tc - 1, t0 > 0 ? t0 - 1 : int64_t(1)}) ekv.push_back(t * kvs + t % kvs);
      const auto o = opts(5e-3, 12);
      EXPECT_TRUE(check_gradient("chunk attention dq", q.data(), Tc * qs, dq.data(), loss, o));
      EXPECT_TRUE(check_gradient("chunk attention dk", k.data(), S * kvs, dk.data(), loss, o, ekv));
      EXPECT_TRUE(check_gradient("chunk attention dv", v.data(), S * kvs, dv.data(), loss, o, ekv));
    }
    for (int64_t i = 0; i < S * kvs; ++i) {
      ASSERT_NEAR(dk_sum[sz(i)], dkf[sz(i)], 1e-4f * (1 + std::fabs(dkf[sz(i)]))) << i;
      ASSERT_NEAR(dv_sum[sz(i)], dvf[sz(i)], 1e-4f * (1 + std::fabs(dvf[sz(i)]))) << i;
    }
  }
}

// window = 1: every query sees only its own key, so out = v and dq, dk vanish (up to rounding).
TEST(CpuGrads, AttentionWindowOne) {
  CpuBackend be;
  const int64_t B = 2, T = 70, Hq = 4, Hkv = 2, dh = 8, nq = B * T * Hq * dh, nkv = B * T * Hkv * dh;
  auto q = randn(sz(nq), 134, 1.5), k = randn(sz(nkv), 135, 1.5), v = randn(sz(nkv), 136), c = randn(sz(nq), 137);
  std::vector<int64_t> pos0(sz(B), 0);
  Vec out(sz(nq));
  AttentionArgs a{q.data(), k.data(), v.data(), out.data(), pos0.data(), B, T, T, Hq, Hkv, dh, 1,
                  1.0f / std::sqrt(float(dh))};
  be.attention(a);
  auto dq = nans(sz(nq)), dk = nans(sz(nkv)), dv = nans(sz(nkv));
  be.attention_backward(a, c.data(), dq.data(), dk.data(), dv.data());
  for (float g : dq) ASSERT_LT(std::fabs(g), 1e-5f);
  for (float g : dk) ASSERT_LT(std::fabs(g), 1e-5f);
  auto loss = [&] {
    be.attention(a);
    return fd_dot(c, out);
  };
  EXPECT_TRUE(check_gradient("attention(window 1) dv", v.data(), nkv, dv.data(), loss, opts(1e-2, 16)));
}

// ---------------------------------------------------------------------------------------------
// MoE: fixed expert assignment with skip tokens (class E), an expert with no tokens (2) and one
// with a single token (4).

TEST(CpuGrads, Moe) {
  CpuBackend be;
  const int64_t N = 23, D = 8, I = 6, E = 5;
  std::vector<int32_t> expert(sz(N));
  const int32_t pattern[] = {0, 1, 3, 5, 1, 0, 5, 3};
  for (int64_t n = 0; n < N; ++n) expert[sz(n)] = pattern[n % 8];
  expert[11] = 4;
  auto x = randn(sz(N * D), 140), gu = randn(sz(E * 2 * I * D), 141, 0.4), dn = randn(sz(E * D * I), 142, 0.4),
       wt = randn(sz(N), 143), c = randn(sz(N * D), 144);
  for (bool identity : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "skip_identity " << identity);
    Vec out(sz(N * D));
    MoeArgs a{x.data(), expert.data(), wt.data(), gu.data(), dn.data(), out.data(), N, D, I, E, identity};
    auto loss = [&] {
      be.moe(a);
      return fd_dot(c, out);
    };
    const auto dx0 = randn(x.size(), 145), dgu0 = randn(gu.size(), 146), ddn0 = randn(dn.size(), 147);
    auto dx = dx0, dw = nans(sz(N)), dgu = dgu0, ddn = ddn0;
    be.moe_backward(a, c.data(), dx.data(), dw.data(), dgu.data(), ddn.data());
    const auto gx = fd_accumulated(dx, dx0), ggu = fd_accumulated(dgu, dgu0), gdn = fd_accumulated(ddn, ddn0);
    // Always check: a skip token's x, the empty expert's and the single-token expert's weights.
    const std::vector<int64_t> ex = {3 * D + 1, 6 * D + 5, 11 * D + 2};
    const std::vector<int64_t> egu = {2 * 2 * I * D + 5, 2 * 2 * I * D + I * D + 7, 4 * 2 * I * D + 3,
                                      4 * 2 * I * D + I * D + 9};
    const std::vector<int64_t> edn = {2 * D * I + 4, 4 * D * I + 11};
    const auto o = opts(1e-2, 64);
    EXPECT_TRUE(check_gradient("moe dx", x.data(), N * D, gx.data(), loss, o, ex));
    EXPECT_TRUE(check_gradient("moe dweight", wt.data(), N, dw.data(), loss, o));
    EXPECT_TRUE(check_gradient("moe dgate_up", gu.data(), E * 2 * I * D, ggu.data(), loss, o, egu));
    EXPECT_TRUE(check_gradient("moe ddown", dn.data(), E * D * I, gdn.data(), loss, o, edn));
    // The empty expert gets exactly no gradient.
    for (int64_t i = 0; i < 2 * I * D; ++i) ASSERT_EQ(ggu[sz(2 * 2 * I * D + i)], 0.0f);
    for (int64_t i = 0; i < D * I; ++i) ASSERT_EQ(gdn[sz(2 * D * I + i)], 0.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// LM head + cross-entropy. The objective is the op's own: scale * (sum of row losses over targets
// >= 0), from the forward linear's logits.

struct LmHead {
  CpuBackend& be;
  const Vec &y, &w, &bias;
  const std::vector<int32_t>& target;
  int64_t D, V;
  bool has_bias;
  mutable Vec logits;
  // Sum of the unscaled losses of rows [r0, r1) with a target: logits from the forward linear,
  // one row at a time (small GEMMs stay single-threaded: fast even on a loaded machine),
  // log-sum-exp in double (a float32 per-row loss of ~log V would quantise the differences).
  double loss(int64_t r0, int64_t r1) const {
    logits.resize(sz(V));
    double s = 0;
    for (int64_t r = r0; r < r1; ++r) {
      if (target[sz(r)] < 0) continue;
      be.linear(y.data() + r * D, w.data(), has_bias ? bias.data() : nullptr, logits.data(), 1, D, V, false, 0);
      double mx = logits[0], sum = 0;
      for (float l : logits) mx = std::max(mx, double(l));
      for (float l : logits) sum += std::exp(double(l) - mx);
      s += std::log(sum) + mx - logits[sz(target[sz(r)])];
    }
    return s;
  }
};

TEST(CpuGrads, LmHeadLossSingleChunk) {
  CpuBackend be;
  const int64_t N = 9, D = 16, V = 50;
  const float scale = 0.37f;
  for (bool has_bias : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "bias " << has_bias);
    auto y = randn(sz(N * D), 150), w = randn(sz(V * D), 151, 0.5), bias = randn(sz(V), 152);
    std::vector<int32_t> target(sz(N));
    for (int64_t n = 0; n < N; ++n) target[sz(n)] = int32_t((n * 13 + 4) % V);
    target[2] = target[7] = -1;  // ignored rows
    LmHead head{be, y, w, bias, target, D, V, has_bias, {}};
    auto loss = [&] { return double(scale) * head.loss(0, N); };
    const auto dw0 = randn(w.size(), 153), db0 = randn(bias.size(), 154);
    auto dy = nans(y.size()), dw = dw0, db = db0;
    const double total = be.lm_head_loss(y.data(), w.data(), has_bias ? bias.data() : nullptr, target.data(), N, D,
                                         V, scale, dy.data(), dw.data(), has_bias ? db.data() : nullptr);
    EXPECT_NEAR(total, head.loss(0, N), 1e-5 * std::fabs(total));
    const auto gw = fd_accumulated(dw, dw0), gb = fd_accumulated(db, db0);
    const auto o = opts(1e-2, 64);
    EXPECT_TRUE(check_gradient("lm_head dy", y.data(), N * D, dy.data(), loss, o));
    for (int64_t i : {int64_t(2), int64_t(7)})
      for (int64_t d = 0; d < D; ++d) ASSERT_EQ(dy[sz(i * D + d)], 0.0f) << "ignored row " << i;
    EXPECT_TRUE(check_gradient("lm_head dw", w.data(), V * D, gw.data(), loss, o));
    if (has_bias) EXPECT_TRUE(check_gradient("lm_head dbias", bias.data(), V, gb.data(), loss, o));
    else EXPECT_EQ(db, db0);
  }
}

// V = 2^14, so the op processes rows in chunks of 2^22 / V = 256: N = 513 rows give chunks
// [0, 256), [256, 512), [512, 513). Most rows are ignored (target -1) to keep the evaluations of
// the objective cheap; the rows with targets sit on both sides of each chunk boundary. y is
// checked with the rows' losses cached (a row's loss depends on its own row of y only).
TEST(CpuGrads, LmHeadLossSeveralChunks) {
  CpuBackend be;
  const int64_t N = 513, D = 4, V = int64_t(1) << 14;
  ASSERT_EQ((int64_t(1) << 22) / V, 256);
  const float scale = 0.5f;
  Vec y = randn(sz(N * D), 160), w = randn(sz(V * D), 161, 0.5), bias = randn(sz(V), 162, 0.5);
  std::vector<int32_t> target(sz(N), -1);
  target[0] = 17;
  target[255] = int32_t(V - 1);
  target[256] = 17;  // same class as row 0: dw/dbias rows shared across chunks
  target[511] = 9000;
  target[512] = 0;
  LmHead head{be, y, w, bias, target, D, V, true, {}};
  auto loss = [&] { return double(scale) * head.loss(0, N); };
  const Vec dw0 = randn(w.size(), 163, 0.1), db0 = randn(bias.size(), 164, 0.1);
  auto dy = nans(y.size()), dw = dw0, db = db0;
  const double total =
      be.lm_head_loss(y.data(), w.data(), bias.data(), target.data(), N, D, V, scale, dy.data(), dw.data(), db.data());
  std::vector<double> row_loss(sz(N));
  for (int64_t r = 0; r < N; ++r) row_loss[sz(r)] = head.loss(r, r + 1);
  double sum = 0;
  for (double l : row_loss) sum += l;
  EXPECT_NEAR(total, sum, 1e-6 * std::fabs(total));
  {  // loss only (evaluation): the same sum, no gradient written
    auto dw_untouched = dw0;
    const double loss_only = be.lm_head_loss(y.data(), w.data(), bias.data(), target.data(), N, D, V, scale, nullptr,
                                             dw_untouched.data(), nullptr);
    EXPECT_EQ(loss_only, total);
    EXPECT_EQ(dw_untouched, dw0);
  }
  for (int64_t r = 0; r < N; ++r)
    if (target[sz(r)] < 0) {
      for (int64_t d = 0; d < D; ++d) ASSERT_EQ(dy[sz(r * D + d)], 0.0f) << "ignored row " << r;
    }

  const Vec y_ref = y;
  auto loss_cached = [&] {  // recomputes only the rows of y that differ from y_ref
    double s = 0;
    for (int64_t r = 0; r < N; ++r)
      s += std::equal(y.begin() + r * D, y.begin() + (r + 1) * D, y_ref.begin() + r * D) ? row_loss[sz(r)]
                                                                                          : head.loss(r, r + 1);
    return double(scale) * s;
  };
  std::vector<int64_t> ey;
  for (int64_t r : {0, 255, 256, 511, 512})
    for (int64_t d = 0; d < D; ++d) ey.push_back(r * D + d);
  const auto gw = fd_accumulated(dw, dw0), gb = fd_accumulated(db, db0);
  EXPECT_TRUE(check_gradient("lm_head dy", y.data(), N * D, dy.data(), loss_cached, opts(1e-2, 16), ey));
  EXPECT_TRUE(check_gradient("lm_head dw", w.data(), V * D, gw.data(), loss, opts(1e-2, 24),
                             {17 * D, 17 * D + 3, (V - 1) * D + 1, 9000 * D + 2}));
  EXPECT_TRUE(check_gradient("lm_head dbias", bias.data(), V, gb.data(), loss, opts(1e-2, 24), {0, 17, 9000}));
}

}  // namespace
}  // namespace zaya
