// CPU backward of the MoE op: recompute each expert's hidden activations over its contiguous
// rows, then per expert dDown += dY^T act, dAct = dY Down, SwiGLU backward, dGateUp += dH^T X,
// dX += dH GateUp; the router weight gets dweight = dout . expert(x) (or dout . x for skip).
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace zaya {

void CpuBackend::moe_backward(const MoeArgs& a, const float* dout, float* dx, float* dweight, float* dgate_up,
                              float* ddown) {
  const int64_t N = a.N, D = a.D, I = a.I, E = a.E;
  const MoePlan plan = plan_moe(a.expert, N, E);
  const std::vector<int64_t>& offsets = plan.offsets;
  const std::vector<int64_t>& perm = plan.perm;
  const int64_t routed = offsets[size_t(E)];

  std::vector<float> xs(static_cast<size_t>(routed * D)), hid(static_cast<size_t>(routed * 2 * I)),
      act(static_cast<size_t>(routed * I)), ys(static_cast<size_t>(routed * D)), dys(static_cast<size_t>(routed * D)),
      dact(static_cast<size_t>(routed * I)), dhid(static_cast<size_t>(routed * 2 * I)),
      dxs(static_cast<size_t>(routed * D));
#pragma omp parallel for if (routed * D > 65536)
  for (int64_t i = 0; i < routed; ++i) {
    const int64_t n = perm[size_t(i)];
    std::memcpy(xs.data() + i * D, a.x + n * D, size_t(D) * 4);
    for (int64_t d = 0; d < D; ++d) dys[size_t(i * D + d)] = a.weight[n] * dout[n * D + d];
  }
  // Experts are independent (each owns its rows and its weight gradients): one per thread.
  run_team(routed * D > 65536, [&] {
#pragma omp for schedule(dynamic)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets[size_t(e)], rows = offsets[size_t(e + 1)] - r0;
      if (rows == 0) continue;
      const float* GU = a.gate_up + e * 2 * I * D;
      const float* DN = a.down + e * D * I;
      cpu_gemm(true, rows, 2 * I, D, 1.0f, xs.data() + r0 * D, D, GU, D, 0.0f, hid.data() + r0 * 2 * I,
               2 * I);
      for (int64_t i = r0; i < r0 + rows; ++i)
        for (int64_t j = 0; j < I; ++j) {
          const float g = hid[size_t(i * 2 * I + j)], u = hid[size_t(i * 2 * I + I + j)];
          act[size_t(i * I + j)] = g / (1.0f + std::exp(-g)) * u;
        }
      cpu_gemm(true, rows, D, I, 1.0f, act.data() + r0 * I, I, DN, I, 0.0f, ys.data() + r0 * D, D);
      if (ddown)
        cpu_gemm_tn(D, I, rows, 1.0f, dys.data() + r0 * D, D, act.data() + r0 * I, I, 1.0f, ddown + e * D * I,
                    I);
      cpu_gemm(false, rows, I, D, 1.0f, dys.data() + r0 * D, D, DN, I, 0.0f, dact.data() + r0 * I, I);
      for (int64_t i = r0; i < r0 + rows; ++i)
        for (int64_t j = 0; j < I; ++j) {
          const float g = hid[size_t(i * 2 * I + j)], u = hid[size_t(i * 2 * I + I + j)];
          const float sg = 1.0f / (1.0f + std::exp(-g));
          const float da = dact[size_t(i * I + j)];
          dhid[size_t(i * 2 * I + j)] = da * u * sg * (1.0f + g * (1.0f - sg));
          dhid[size_t(i * 2 * I + I + j)] = da * g * sg;
        }
      if (dgate_up)
        cpu_gemm_tn(2 * I, D, rows, 1.0f, dhid.data() + r0 * 2 * I, 2 * I, xs.data() + r0 * D, D, 1.0f,
                    dgate_up + e * 2 * I * D, D);
      cpu_gemm(false, rows, D, 2 * I, 1.0f, dhid.data() + r0 * 2 * I, 2 * I, GU, D, 0.0f, dxs.data() + r0 * D,
               D);
    }
  });
#pragma omp parallel for if (N * D > 65536)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t n = perm[size_t(i)];
    const float* g = dout + n * D;
    float* dxn = dx + n * D;
    double dw = 0;
    if (i < routed) {
      for (int64_t d = 0; d < D; ++d) {
        dw += double(g[d]) * ys[size_t(i * D + d)];
        dxn[d] += dxs[size_t(i * D + d)];
      }
    } else if (a.skip_identity) {
      const float* x = a.x + n * D;
      for (int64_t d = 0; d < D; ++d) {
        dw += double(g[d]) * x[d];
        dxn[d] += a.weight[n] * g[d];
      }
    }
    dweight[n] = float(dw);
  }
}

}  // namespace zaya
