// MoE, optimizer and memory ops of the GPU backend against the CPU backend: the routed
// SwiGLU experts with both skip modes (forward and backward, every GEMM mode, routings that
// change from call to call, wide shapes and edge routings, bitwise determinism), Newton-Schulz
// (wide, square, tall), Muon momentum/update, AdamW, sum of squares, scaling, copy/fill and
// host transfers. Skipped ("skipped: no GPU") without a device. Passed on an H100.
#include <cstring>

#include "gpu_test_support.h"
#if defined(ZAYA_SIMT)
#include "backend/cuda/ops_moe_common.h"  // gpu_plan_moe, whose plan the host emulation reads directly
#include "simt_host_api.h"                // the emulated runtime's counts
#endif

namespace zaya {
namespace {

using namespace gpu_test;

// A CPU backend and a GPU backend in the GEMM mode of the parameter (skips without a GPU).
class GpuVsCpu : public ::testing::TestWithParam<GemmMode> {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
    gpu = make_gpu(GetParam());
  }
  CpuBackend cpu;
  std::unique_ptr<Backend> gpu;
};

// The magnitudes one routed token's terms have in the MoE op's results, the scales their
// errors are held to. The GEMM outputs (g, u from x; ys from act; dact from dys; dxs from dg,
// du) are sums whose terms, not the sums, are rounded (both operands, in bf16), and they can
// cancel, so each magnitude adds the size of the terms it is summed from, carried through the
// SwiGLU's derivatives (s = silu(g_j), s' and s'' its derivatives):
// clang-format off
//   g_j, u_j = sum_k gate_up_jk x_k    G_j, U_j: the size of the terms gate_up_jk x_k
//   act_j = s u_j                      A_j = |act_j| + |s| U_j + |s' u_j| G_j
//   ys_d = sum_j down_dj act_j         Y_d: the size of the terms down_dj A_j
//   dact_j = sum_d down_dj dys_d       R_j: the size of the terms down_dj dys_d
//   dg_j = dact_j u_j s'               Dg_j = |dg_j| + |u_j s'| R_j + |dact_j s'| U_j + |dact_j u_j s''| G_j
//   du_j = dact_j s                    Du_j = |du_j| + |s| R_j + |dact_j s'| G_j
//   dxs_k = sum_j dg_j gate_up_jk + du_j gate_up_(I+j)k
//                                      X_k: the size of the terms Dg_j gate_up_jk, Du_j gate_up_(I+j)k
// clang-format on
// The size of terms is the sum of their magnitudes: with operands rounded to bf16 (unit
// u = 2^-8) each product is off by at most 2u of itself, so to first order no result is off by
// more than 2u = 0.0078 of its magnitude, below 1e-2 for any inputs, and in fp32 modes by far
// less than 1e-4. (Held to the typical size instead, the root sum of squares, a single
// product's two roundings left the weight gradients no room: 0.0087 of 1e-2 in 45 runs; and in
// fp32 modes held to the results' own magnitudes, out and dx were off by up to 0.18.)
// The router weight's gradient keeps the typical size (typical_ys, bf16 modes only: the root
// sum of squares of the terms down_dj A_j with A_j from root sums of squares, plus |ys_d|; in
// fp32 modes |ys_d| alone), which held in every run and keeps that check as tight as it was.
struct TokenMagnitudes {
  std::vector<double> act, dg, du;  // A, Dg, Du (I each)
  std::vector<double> ys, dxs;      // Y, X (D each)
  std::vector<double> typical_ys;   // (D)
};

// The size of terms both ways: the sum of their magnitudes and of their squares.
struct TermSize {
  double magnitudes = 0, squares = 0;
  void add(double term) { magnitudes += std::fabs(term), squares += term * term; }
};

TokenMagnitudes token_magnitudes(const float* x, const float* gate_up, const float* down,
                                 const std::vector<double>& dys, int64_t D, int64_t I, bool bf16_terms) {
  const auto zeros = [](int64_t n) { return std::vector<double>(static_cast<size_t>(n)); };
  TokenMagnitudes t{zeros(I), zeros(I), zeros(I), zeros(D), zeros(D), zeros(D)};
  std::vector<double> act = zeros(I), typical_act = zeros(I);
  for (int64_t j = 0; j < I; ++j) {
    double g = 0, u = 0, dact = 0;
    TermSize G, U, R;
    for (int64_t k = 0; k < D; ++k) {
      const double gt = double(gate_up[j * D + k]) * x[k], ut = double(gate_up[(I + j) * D + k]) * x[k];
      g += gt, u += ut;
      G.add(gt), U.add(ut);
    }
    for (int64_t d = 0; d < D; ++d) {
      const double term = double(down[d * I + j]) * dys[size_t(d)];
      dact += term;
      R.add(term);
    }
    const double sigmoid = 1.0 / (1.0 + std::exp(-g)), s = g * sigmoid;
    const double s1 = sigmoid * (1.0 + g * (1.0 - sigmoid));
    const double s2 = sigmoid * (1.0 - sigmoid) * (2.0 + g * (1.0 - 2.0 * sigmoid));
    act[size_t(j)] = s * u;
    t.act[size_t(j)] = std::fabs(s * u) + std::fabs(s) * U.magnitudes + std::fabs(s1 * u) * G.magnitudes;
    t.dg[size_t(j)] = std::fabs(dact * u * s1) + std::fabs(u * s1) * R.magnitudes +
                      std::fabs(dact * s1) * U.magnitudes + std::fabs(dact * u * s2) * G.magnitudes;
    t.du[size_t(j)] = std::fabs(dact * s) + std::fabs(s) * R.magnitudes + std::fabs(dact * s1) * G.magnitudes;
    typical_act[size_t(j)] =
        std::fabs(s * u) + std::fabs(s) * std::sqrt(U.squares) + std::fabs(s1 * u) * std::sqrt(G.squares);
  }
  for (int64_t d = 0; d < D; ++d) {
    double ys = 0;
    TermSize typical;
    for (int64_t j = 0; j < I; ++j) {
      ys += double(down[d * I + j]) * act[size_t(j)];
      t.ys[size_t(d)] += std::fabs(double(down[d * I + j])) * t.act[size_t(j)];
      typical.add(double(down[d * I + j]) * typical_act[size_t(j)]);
    }
    t.typical_ys[size_t(d)] = std::fabs(ys) + (bf16_terms ? std::sqrt(typical.squares) : 0.0);
  }
  for (int64_t j = 0; j < I; ++j)
    for (int64_t k = 0; k < D; ++k)
      t.dxs[size_t(k)] += t.dg[size_t(j)] * std::fabs(double(gate_up[j * D + k])) +
                          t.du[size_t(j)] * std::fabs(double(gate_up[(I + j) * D + k]));
  return t;
}

// The largest error of an accumulated gradient (got and want: start + this call's gradient)
// over the magnitude its element is summed from (scale), after the fp32 rounding that adding
// into the start costs: an element that `terms` terms were added into goes through at most
// terms + 1 roundings at the running sum's magnitude, so each side may be off by
// (terms + 1) 2^-24 |start| beyond its gradient's own error; one with no terms must equal its
// start exactly. Infinite for a NaN, or for an error where nothing was summed (scale 0).
double accumulated_err_over_scale(const std::vector<float>& got, const std::vector<float>& want,
                                  const std::vector<float>& start, const std::vector<double>& terms,
                                  const std::vector<double>& scale) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (!std::isfinite(d)) return INFINITY;
    const double roundings = terms[i] > 0 ? terms[i] + 1.0 : 0.0;
    const double beyond_rounding = d - std::ldexp(roundings * std::fabs(double(start[i])), -23);
    if (beyond_rounding <= 0) continue;
    if (!(scale[i] > 0)) return INFINITY;
    worst = std::max(worst, beyond_rounding / scale[i]);
  }
  return worst;
}

// How many elements of got differ from want in their bits (a count, not two dumped tensors).
size_t bitwise_differences(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::max(got.size(), want.size());
  size_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) n += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  return n;
}

class GpuMoe : public GpuVsCpu {
 protected:
  // Forward and backward of the MoE op with this routing (expert[n] in [0, E], E = skip) on
  // both backends, outputs and every gradient compared.
  // weight_grads = false: the experts' weight gradients are not asked for (frozen experts).
  void check(int64_t D, int64_t I, int64_t E, bool identity, const std::vector<int32_t>& expert,
             bool weight_grads = true) {
    const int64_t N = int64_t(expert.size());
    const std::string what = std::string(identity ? "moe identity" : "moe zero") + " N=" + std::to_string(N);
    auto x = rnd(size_t(N * D)), gu = rnd(size_t(E * 2 * I * D), 0.15), dn = rnd(size_t(E * D * I), 0.15);
    auto weight = rnd_positive(size_t(N), 0.05, 1.0);
    std::vector<float> out(size_t(N * D));
    MoeArgs a;
    a.x = x.data(); a.expert = expert.data(); a.weight = weight.data(); a.gate_up = gu.data(); a.down = dn.data();
    a.out = out.data(); a.N = N; a.D = D; a.I = I; a.E = E; a.skip_identity = identity;
    cpu.moe(a);
    DevBuf gx(*gpu, x), ge(*gpu, expert), gw(*gpu, weight), ggu(*gpu, gu), gdn(*gpu, dn), gout(*gpu, N * D);
    MoeArgs g = a;
    g.x = gx.f(); g.expert = ge.i(); g.weight = gw.f(); g.gate_up = ggu.f(); g.down = gdn.f(); g.out = gout.f();
    gpu->moe(g);

    auto dout = rnd(size_t(N * D)), dx0 = rnd(size_t(N * D)), dgu0 = rnd(size_t(E * 2 * I * D)),
         ddn0 = rnd(size_t(E * D * I));
    std::vector<float> dx = dx0, dwt(static_cast<size_t>(N)), dgu = dgu0, ddn = ddn0;
    cpu.moe_backward(a, dout.data(), dx.data(), dwt.data(), weight_grads ? dgu.data() : nullptr,
                     weight_grads ? ddn.data() : nullptr);
    DevBuf gdo(*gpu, dout), gdx(*gpu, dx0), gdwt(*gpu, N), gdgu(*gpu, dgu0), gddn(*gpu, ddn0);
    gpu->moe_backward(g, gdo.f(), gdx.f(), gdwt.f(), weight_grads ? gdgu.f() : nullptr,
                      weight_grads ? gddn.f() : nullptr);

    // Every result cancels towards zero for some elements (dot products; sums over a few tokens
    // when experts are many), so each element is held to the magnitudes it is summed from
    // (token_magnitudes) rather than to the tensor's largest:
    //   out[n][d]: weight_n Y_d (skip tokens: |weight_n x_d| or 0)
    //   dx[n][k]: X_k (skip tokens: |weight_n dout_nk| or 0)
    //   dweight[n]: sum_d |dout_nd| typical Y_d (skip tokens: |dout_nd x_d| or 0)
    //   ddown[e][d][j]: sum over e's tokens of |dys_nd| A_j       (dys = weight_n dout_n)
    //   dgate_up[e][j][k], [e][I + j][k]: sum over e's tokens of Dg_j |x_k|, Du_j |x_k|
    // A zero skip leaves nothing to round: its out, dx and dweight must be exact.
    // (Held to the whole tensor's largest element, as before, out came 1.06e-2 off and the
    // experts' weight gradients 1.1e-2 in 45 runs with 300 experts of about 2 tokens each:
    // 15 seeds, 3 bf16 modes.)
    std::vector<double> dot_scale(static_cast<size_t>(N)), ddn_scale(static_cast<size_t>(E * D * I)),
        dgu_scale(static_cast<size_t>(E * 2 * I * D));
    // Terms added into each accumulated element: the tokens of its expert (ddown, dgate_up);
    // one for a dx row that is routed or an identity skip, none for a zero skip.
    std::vector<double> ddn_terms(ddn_scale.size()), dgu_terms(dgu_scale.size());
    std::vector<double> out_scale(static_cast<size_t>(N * D)), dx_scale(static_cast<size_t>(N * D)),
        dx_terms(static_cast<size_t>(N * D));
    for (int64_t n = 0; n < N; ++n) {
      const float* xn = x.data() + n * D;
      const float* dout_n = dout.data() + n * D;
      const int64_t e = expert[size_t(n)];
      const double w = weight[size_t(n)];
      if (e == E) {
        if (!identity) continue;
        for (int64_t d = 0; d < D; ++d) {
          dot_scale[size_t(n)] += std::fabs(double(dout_n[d]) * xn[d]);
          out_scale[size_t(n * D + d)] = std::fabs(w * xn[d]);
          dx_scale[size_t(n * D + d)] = std::fabs(w * dout_n[d]);
          dx_terms[size_t(n * D + d)] = 1;
        }
        continue;
      }
      std::vector<double> dys(static_cast<size_t>(D));
      for (int64_t d = 0; d < D; ++d) dys[size_t(d)] = w * dout_n[d];
      const TokenMagnitudes t =
          token_magnitudes(xn, gu.data() + e * 2 * I * D, dn.data() + e * D * I, dys, D, I, GetParam().bf16);
      for (int64_t i = 0; i < D * I; ++i) ddn_terms[size_t(e * D * I + i)] += 1;
      for (int64_t i = 0; i < 2 * I * D; ++i) dgu_terms[size_t(e * 2 * I * D + i)] += 1;
      for (int64_t d = 0; d < D; ++d) {
        dot_scale[size_t(n)] += std::fabs(double(dout_n[d])) * t.typical_ys[size_t(d)];
        out_scale[size_t(n * D + d)] = w * t.ys[size_t(d)];
        dx_scale[size_t(n * D + d)] = t.dxs[size_t(d)];
        dx_terms[size_t(n * D + d)] = 1;
        for (int64_t j = 0; j < I; ++j)
          ddn_scale[size_t((e * D + d) * I + j)] += std::fabs(dys[size_t(d)]) * t.act[size_t(j)];
      }
      for (int64_t j = 0; j < I; ++j)
        for (int64_t k = 0; k < D; ++k) {
          dgu_scale[size_t((e * 2 * I + j) * D + k)] += t.dg[size_t(j)] * std::fabs(double(xn[k]));
          dgu_scale[size_t((e * 2 * I + I + j) * D + k)] += t.du[size_t(j)] * std::fabs(double(xn[k]));
        }
    }
    const std::vector<float> got_out = gout.get();
    const double out_err = test::max_err_over_scale(got_out.data(), out.data(), out_scale.data(), out.size());
    EXPECT_LT(out_err, GetParam().tol)
        << what << " out: max error over the magnitudes it is summed from " << out_err;
    const double dx_err = accumulated_err_over_scale(gdx.get(), dx, dx0, dx_terms, dx_scale);
    EXPECT_LT(dx_err, GetParam().tol)
        << what << " dx: max error over the magnitudes it is summed from " << dx_err;
    const std::vector<float> got_dwt = gdwt.get();
    const double dwt_err = test::max_err_over_scale(got_dwt.data(), dwt.data(), dot_scale.data(), size_t(N));
    EXPECT_LT(dwt_err, GetParam().tol) << what << " dweight: max error over the magnitudes it is summed from " << dwt_err;
    if (weight_grads) {
      const double ddn_err = accumulated_err_over_scale(gddn.get(), ddn, ddn0, ddn_terms, ddn_scale);
      EXPECT_LT(ddn_err, GetParam().tol)
          << what << " ddown: max error over the magnitudes it is summed from " << ddn_err;
      const double dgu_err = accumulated_err_over_scale(gdgu.get(), dgu, dgu0, dgu_terms, dgu_scale);
      EXPECT_LT(dgu_err, GetParam().tol)
          << what << " dgate_up: max error over the magnitudes it is summed from " << dgu_err;
    } else {  // frozen experts: the accumulators are left exactly as they were
      EXPECT_EQ(bitwise_differences(gddn.get(), ddn0), 0u) << what << " ddown changed without weight_grads";
      EXPECT_EQ(bitwise_differences(gdgu.get(), dgu0), 0u)
          << what << " dgate_up changed without weight_grads";
    }
  }
};

TEST_P(GpuMoe, ForwardBackward) {
  const int64_t N = 150, E = 5;
  for (bool identity : {false, true}) {
    auto expert = rnd_ints(size_t(N), int32_t(E + 1));
    for (int64_t n = 0; n < 7; ++n) expert[size_t(n)] = int32_t(E);  // some skip tokens for sure
    for (int64_t n = 7; n < N; ++n)
      if (expert[size_t(n)] == 2) expert[size_t(n)] = 1;  // expert 2 gets no tokens
    check(64, 48, E, identity, expert);
  }
}

// One backend through routings whose per-expert row counts change from call to call and cross
// powers of two (the ragged GEMM plans are shared up to each bound), with token counts spanning
// several tiles of the routing plan's kernels, and a skewed routing (one expert takes most).
TEST_P(GpuMoe, ChangingRoutings) {
  const int64_t E = 4;
  for (int64_t N : {int64_t(37), int64_t(300), int64_t(1100), int64_t(2100)}) {
    auto expert = rnd_ints(size_t(N), int32_t(E + 1));
    check(32, 40, E, N % 2 == 1, expert);
    for (int64_t n = 0; n < N; ++n)
      if (n % 7 != 0) expert[size_t(n)] = 3;  // expert 3 takes 6/7 of the tokens
    check(32, 40, E, false, expert);
  }
}

// Widths past one 128-column tile of the grouped kernels (D = 160, 2I = 272) with K not a
// multiple of their 32-step (160, 136), then routings at the edges: one token, every token
// skipped (no routed rows), one expert, more classes than a routing-plan tile has threads
// (300 experts), and frozen experts (no weight gradients asked for). Widths that are not
// multiples of 8 (D = 36, I = 20) keep the grouped mode on its plain kernels, every other shape
// here takes the pipelined ones.
TEST_P(GpuMoe, WideShapesAndEdgeRoutings) {
  check(160, 136, 3, false, rnd_ints(300, 4));
  check(36, 20, 3, false, rnd_ints(200, 4));
  check(160, 136, 3, true, rnd_ints(300, 4), /*weight_grads=*/false);
  check(32, 40, 4, true, {4});
  check(32, 40, 4, false, {2});
  check(32, 40, 4, true, std::vector<int32_t>(40, 4));
  check(32, 40, 1, false, rnd_ints(90, 2));
  check(16, 24, 300, false, rnd_ints(700, 301));
}

// Calls of at most 16 tokens, as decode makes them: under the bf16 policy the experts' products
// run as device GEMVs from the device offsets (no host round trip; the weight gradients as
// grouped GEMMs): one token, a few with skipped ones and experts left empty, 16 tokens over 300
// experts (the row's expert found among many offsets), widths whose K is a multiple of 8 (the
// 16-byte loads; once past a warp's 256 or 512 elements) and not (36, 20), and 17 tokens, the
// first count past the few-rows form; in the host emulation, that the form engages, in two
// launches.
TEST_P(GpuMoe, FewTokensAsDecodeRunsThem) {
  for (int64_t N : {int64_t(1), int64_t(5), int64_t(16), int64_t(17)}) {
    auto expert = rnd_ints(size_t(N), 9);  // 8 experts and the skip class
    if (N > 1) expert[0] = 8;
    check(64, 48, 8, N % 2 == 0, expert);
    check(36, 20, 8, false, expert);
  }
  check(32, 24, 300, true, rnd_ints(16, 301));
  check(528, 264, 8, false, rnd_ints(5, 9));  // K past one pass of a warp's 16-byte loads (512 at 64 lanes)
#if defined(ZAYA_SIMT)
  // The form taken, from the emulated runtime's copies to the host: none for 16 tokens under the
  // bf16 policy (the plan stays on the device), one for 17 (the per-expert GEMMs' offsets).
  const GemmMode& mode = GetParam();
  for (int64_t N : {int64_t(16), int64_t(17)}) {
    const int64_t D = 16, I = 8, E = 4;
    auto expert = rnd_ints(size_t(N), int32_t(E + 1));
    DevBuf gx(*gpu, rnd(size_t(N * D))), ge(*gpu, expert), gw(*gpu, rnd_positive(size_t(N), 0.05, 1.0)),
        ggu(*gpu, rnd(size_t(E * 2 * I * D))), gdn(*gpu, rnd(size_t(E * D * I))), gout(*gpu, N * D);
    MoeArgs g;
    g.x = gx.f(); g.expert = ge.i(); g.weight = gw.f(); g.gate_up = ggu.f(); g.down = gdn.f(); g.out = gout.f();
    g.N = N; g.D = D; g.I = I; g.E = E; g.skip_identity = false;
    gpu->set_weights_frozen(true);  // as decode runs: the first call makes the weights' bf16 copies
    gpu->moe(g);
    const simt::ApiCounts before = simt::api_counts();
    gpu->moe(g);
    const simt::ApiCounts after = simt::api_counts();
    gpu->set_weights_frozen(false);
    const bool device_plan = mode.moe_grouped || (mode.bf16 && N <= 16);
    EXPECT_EQ(after.copies_to_host - before.copies_to_host, device_plan ? 0 : 1)
        << mode.name << " N=" << N << ": copies to the host in the MoE forward";
    // The few-rows form is two launches and no plan: gate_up with SwiGLU, down with the router
    // weight, token by token.
    if (!mode.moe_grouped && mode.bf16 && N <= 16) {
      EXPECT_EQ(after.launches - before.launches, 2) << mode.name << " N=" << N << ": launches in the MoE forward";
    }
  }
#endif
}

#if defined(ZAYA_SIMT)
// The routing plan is a stable counting sort of the tokens by class: offsets[c] counts the
// tokens of the classes before c, and class c's grouped rows list its tokens in token order (so
// each expert's sums run in a fixed order). One tile's worth of tokens (the one-launch plan, up
// to 256) and several tiles (three kernels), at the tile's edges; the offsets on the device and
// as copied to the host.
TEST(GpuMoePlan, IsAStableCountingSort) {
  auto gpu = make_gpu(gemm_modes()[0]);
  auto* be = dynamic_cast<CudaBackend*>(gpu.get());
  ASSERT_NE(be, nullptr);
  for (int64_t N : {int64_t(1), int64_t(37), int64_t(255), int64_t(256), int64_t(257), int64_t(700)}) {
    const int64_t E = 9;
    const std::vector<int32_t> expert = rnd_ints(size_t(N), int32_t(E + 1));  // 9 experts and the skip class
    std::vector<int32_t> want_offsets(size_t(E + 2), 0), want_perm;
    for (int32_t e : expert) ++want_offsets[size_t(e) + 1];
    for (size_t c = 1; c < want_offsets.size(); ++c) want_offsets[c] += want_offsets[c - 1];
    for (int32_t c = 0; c <= int32_t(E); ++c)
      for (int64_t n = 0; n < N; ++n)
        if (expert[size_t(n)] == c) want_perm.push_back(int32_t(n));
    DevBuf ge(*gpu, expert);
    const GpuMoePlan plan = gpu_plan_moe(*be, ge.i(), N, E, /*to_host=*/true);
    std::vector<int32_t> perm(static_cast<size_t>(N)), offsets(static_cast<size_t>(E + 2));
    gpu->to_host(perm.data(), plan.perm.i(), N * 4);
    gpu->to_host(offsets.data(), plan.offsets_dev.i(), (E + 2) * 4);
    EXPECT_EQ(offsets, want_offsets) << "N=" << N << ": offsets on the device";
    EXPECT_EQ(plan.offsets, want_offsets) << "N=" << N << ": offsets on the host";
    EXPECT_EQ(perm, want_perm) << "N=" << N << ": permutation";
  }
}
#endif

// The same inputs twice give bitwise the same outputs and gradients: the routing plan is
// integer-only and every reduction has a fixed order.
TEST_P(GpuMoe, Deterministic) {
  const int64_t N = 1500, D = 32, I = 24, E = 6;
  auto x = rnd(size_t(N * D)), gu = rnd(size_t(E * 2 * I * D), 0.15), dn = rnd(size_t(E * D * I), 0.15);
  auto expert = rnd_ints(size_t(N), int32_t(E + 1));
  auto weight = rnd_positive(size_t(N), 0.05, 1.0), dout = rnd(size_t(N * D));
  DevBuf gx(*gpu, x), ge(*gpu, expert), gw(*gpu, weight), ggu(*gpu, gu), gdn(*gpu, dn), gdo(*gpu, dout);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DevBuf out(*gpu, N * D), dx(*gpu, N * D), dwt(*gpu, N), dgu(*gpu, E * 2 * I * D), ddn(*gpu, E * D * I);
    gpu->fill(dx.f(), 0.0f, N * D);
    gpu->fill(dgu.f(), 0.0f, E * 2 * I * D);
    gpu->fill(ddn.f(), 0.0f, E * D * I);
    MoeArgs g;
    g.x = gx.f(); g.expert = ge.i(); g.weight = gw.f(); g.gate_up = ggu.f(); g.down = gdn.f(); g.out = out.f();
    g.N = N; g.D = D; g.I = I; g.E = E; g.skip_identity = false;
    gpu->moe(g);
    gpu->moe_backward(g, gdo.f(), dx.f(), dwt.f(), dgu.f(), ddn.f());
    std::vector<float> all = out.get();
    for (const DevBuf* b : {&dx, &dwt, &dgu, &ddn}) {
      const std::vector<float> v = b->get();
      all.insert(all.end(), v.begin(), v.end());
    }
    runs.push_back(all);
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4), 0) << "two identical MoE runs differ";
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuMoe, ::testing::ValuesIn(moe_modes()),
                         [](const auto& info) { return std::string(info.param.name); });

class GpuOptim : public GpuVsCpu {};

// The optimizer state is fp32 in every mode, so every check here is at the fp32 tolerance,
// except Newton-Schulz, whose GEMM operands follow the mode (bf16 under the bf16 policy).
TEST_P(GpuOptim, NewtonSchulz) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{32, 96}, {64, 64}, {130, 40}, {1, 17}};
  for (auto [rows, cols] : shapes) {
    auto x = rnd(size_t(rows * cols));
    std::vector<float> xc = x;
    cpu.newton_schulz(xc.data(), rows, cols, 5);
    DevBuf gx(*gpu, x);
    gpu->newton_schulz(gx.f(), rows, cols, 5);
    expect_close(gx.get(), xc, GetParam().tol, "newton_schulz " + std::to_string(rows) + "x" + std::to_string(cols));
  }
  std::vector<float> zero(64, 0.0f);
  DevBuf gz(*gpu, zero);
  gpu->newton_schulz(gz.f(), 8, 8, 5);
  EXPECT_EQ(gz.get(), zero) << "a zero matrix stays zero";
}

// A tensor's experts in one call: each matrix orthogonalised on its own norm, as the CPU does
// matrix by matrix (wide and tall shapes; matrices of very different scales).
TEST_P(GpuOptim, NewtonSchulzBatched) {
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{48, 80}, {96, 40}}) {
    const int64_t batch = 3, n = rows * cols;
    auto x = rnd(size_t(batch * n));
    for (int64_t i = 0; i < n; ++i) x[size_t(n + i)] *= 100.0f;  // matrix 1: another scale
    std::vector<float> xc = x;
    for (int64_t b = 0; b < batch; ++b) cpu.newton_schulz(xc.data() + b * n, rows, cols, 5);
    DevBuf gx(*gpu, x);
    gpu->newton_schulz_batched(gx.f(), batch, rows, cols, 5);
    expect_close(gx.get(), xc, GetParam().tol,
                 "newton_schulz_batched 3x" + std::to_string(rows) + "x" + std::to_string(cols));
  }
}

TEST_P(GpuOptim, ElementwiseUpdates) {
  const int64_t n = 100003;
  for (bool nesterov : {false, true}) {
    auto m0 = rnd(static_cast<size_t>(n)), g = rnd(static_cast<size_t>(n));
    std::vector<float> m = m0, u(static_cast<size_t>(n));
    cpu.muon_momentum(m.data(), g.data(), u.data(), n, 0.95f, nesterov);
    DevBuf gm(*gpu, m0), gg(*gpu, g), gu(*gpu, n);
    gpu->muon_momentum(gm.f(), gg.f(), gu.f(), n, 0.95f, nesterov);
    expect_close(gm.get(), m, kTolF32, "muon_momentum m");
    expect_close(gu.get(), u, kTolF32, "muon_momentum u");
  }
  {
    auto w0 = rnd(static_cast<size_t>(n)), x = rnd(static_cast<size_t>(n));
    std::vector<float> w = w0;
    cpu.muon_update(w.data(), x.data(), n, 0.02f, 1.6f, 0.1f);
    DevBuf gw(*gpu, w0), gx(*gpu, x);
    gpu->muon_update(gw.f(), gx.f(), n, 0.02f, 1.6f, 0.1f);
    expect_close(gw.get(), w, kTolF32, "muon_update");
  }
  for (int64_t t : {1, 2, 50}) {
    auto w0 = rnd(static_cast<size_t>(n)), g = rnd(static_cast<size_t>(n)), m0 = rnd(size_t(n), 0.1), v0 = rnd_positive(size_t(n), 0.0, 0.1);
    std::vector<float> w = w0, m = m0, v = v0;
    cpu.adamw_update(w.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    DevBuf gw(*gpu, w0), gg(*gpu, g), gm(*gpu, m0), gv(*gpu, v0);
    gpu->adamw_update(gw.f(), gg.f(), gm.f(), gv.f(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    expect_close(gw.get(), w, kTolF32, "adamw w, t " + std::to_string(t));
    expect_close(gm.get(), m, kTolF32, "adamw m");
    expect_close(gv.get(), v, kTolF32, "adamw v");
  }
  {
    auto x = rnd(static_cast<size_t>(n));
    DevBuf gx(*gpu, x);
    const double ref = cpu.sum_squares(x.data(), n);
    EXPECT_NEAR(gpu->sum_squares(gx.f(), n), ref, 1e-10 * ref) << "sum_squares";
    EXPECT_EQ(gpu->sum_squares(gx.f(), 0), 0.0);
    std::vector<float> xc = x;
    cpu.scale_inplace(xc.data(), 0.37f, n);
    gpu->scale_inplace(gx.f(), 0.37f, n);
    expect_close(gx.get(), xc, kTolF32, "scale_inplace");
  }
}

TEST_P(GpuOptim, MemoryOps) {
  const int64_t n = 12345;
  auto x = rnd(static_cast<size_t>(n));
  DevBuf a(*gpu, x), b(*gpu, n);
  gpu->copy(b.f(), a.f(), n);
  EXPECT_EQ(b.get(), x) << "copy";
  gpu->fill(b.f(), 2.5f, n);
  EXPECT_EQ(b.get(), std::vector<float>(size_t(n), 2.5f)) << "fill";
  std::vector<float> back(static_cast<size_t>(n));
  gpu->to_host(back.data(), a.f(), n * 4);
  EXPECT_EQ(back, x) << "from_host / to_host round trip";
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuOptim, ::testing::ValuesIn(gemm_modes()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zaya
