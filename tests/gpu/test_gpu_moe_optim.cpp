// MoE, optimizer and memory ops of the GPU backend against the CPU backend: the routed
// SwiGLU experts with both skip modes (forward and backward, every GEMM mode, routings that
// change from call to call, wide shapes and edge routings, bitwise determinism), Newton-Schulz
// (wide, square, tall), Muon momentum/update, AdamW, sum of squares, scaling, copy/fill and
// host transfers. Skipped ("skipped: no GPU") without a device. Passed on an H100.
#include <cstring>

#include "gpu_test_support.h"

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
    expect_close(gout.get(), out, GetParam().tol, what + " out");

    auto dout = rnd(size_t(N * D)), dx0 = rnd(size_t(N * D)), dgu0 = rnd(size_t(E * 2 * I * D)),
         ddn0 = rnd(size_t(E * D * I));
    std::vector<float> dx = dx0, dwt(static_cast<size_t>(N)), dgu = dgu0, ddn = ddn0;
    cpu.moe_backward(a, dout.data(), dx.data(), dwt.data(), weight_grads ? dgu.data() : nullptr,
                     weight_grads ? ddn.data() : nullptr);
    DevBuf gdo(*gpu, dout), gdx(*gpu, dx0), gdwt(*gpu, N), gdgu(*gpu, dgu0), gddn(*gpu, ddn0);
    gpu->moe_backward(g, gdo.f(), gdx.f(), gdwt.f(), weight_grads ? gdgu.f() : nullptr,
                      weight_grads ? gddn.f() : nullptr);
    expect_close(gdx.get(), dx, GetParam().tol, what + " dx");
    // dweight[n] = dout[n] . ys[n] (ys: the expert's output; x for an identity skip, so the
    // same formula) cancels towards zero for some tokens, so each is held to the magnitudes it
    // is summed from rather than to the largest dweight: sum_d |dout_d| m_d with m_d = |ys_d|.
    // Under bf16 operands ys_d is itself a GEMM output (sum_j down_dj act_j, act_j =
    // silu(g_j) u_j, g and u GEMM outputs of x) whose terms, not its sum, are rounded, and it
    // can cancel too, so m_d adds r_d, the root sum of squares of those terms (the typical size
    // of their rounding error in units of the rounding):
    //   r_d = sqrt(sum_j (down_dj a_j)^2),  a_j = |act_j| + |silu(g_j)| U_j + |silu'(g_j)| |u_j| G_j,
    // G_j, U_j the root sums of squares of the gate_up x terms of g_j, u_j. For skip tokens
    // m_d = |ys_d| (|x_d| or 0): zero-skip tokens must come out exactly 0.
    const bool bf16_terms = GetParam().bf16;
    std::vector<double> dot_scale(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) {
      const float* xn = x.data() + n * D;
      std::vector<double> m(static_cast<size_t>(D));
      if (expert[size_t(n)] == E) {
        for (int64_t d = 0; d < D; ++d) m[size_t(d)] = identity ? std::fabs(double(xn[d])) : 0.0;
      } else {
        const float* GU = gu.data() + int64_t(expert[size_t(n)]) * 2 * I * D;
        const float* DN = dn.data() + int64_t(expert[size_t(n)]) * D * I;
        std::vector<double> act(static_cast<size_t>(I)), act_mag(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) {
          double g = 0, u = 0, G = 0, U = 0;
          for (int64_t k = 0; k < D; ++k) {
            const double gt = double(GU[j * D + k]) * xn[k], ut = double(GU[(I + j) * D + k]) * xn[k];
            g += gt;
            u += ut;
            G += gt * gt;
            U += ut * ut;
          }
          const double sigmoid = 1.0 / (1.0 + std::exp(-g)), silu = g * sigmoid;
          const double silu_slope = sigmoid * (1.0 + g * (1.0 - sigmoid));
          act[size_t(j)] = silu * u;
          act_mag[size_t(j)] =
              std::fabs(silu * u) + std::fabs(silu) * std::sqrt(U) + std::fabs(silu_slope * u) * std::sqrt(G);
        }
        for (int64_t d = 0; d < D; ++d) {
          double ys = 0, r2 = 0;
          for (int64_t j = 0; j < I; ++j) {
            ys += double(DN[d * I + j]) * act[size_t(j)];
            r2 += std::pow(double(DN[d * I + j]) * act_mag[size_t(j)], 2);
          }
          m[size_t(d)] = std::fabs(ys) + (bf16_terms ? std::sqrt(r2) : 0.0);
        }
      }
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += std::fabs(double(dout[size_t(n * D + d)])) * m[size_t(d)];
      dot_scale[size_t(n)] = s;
    }
    const std::vector<float> got_dwt = gdwt.get();
    const double dwt_err = test::max_err_over_scale(got_dwt.data(), dwt.data(), dot_scale.data(), size_t(N));
    EXPECT_LT(dwt_err, GetParam().tol) << what << " dweight: max error over the magnitudes it is summed from " << dwt_err;
    expect_close(gdgu.get(), dgu, GetParam().tol, what + " dgate_up");  // unchanged without weight_grads
    expect_close(gddn.get(), ddn, GetParam().tol, what + " ddown");
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
