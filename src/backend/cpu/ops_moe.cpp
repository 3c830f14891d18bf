// CPU mixture-of-experts op: plan (per-expert histogram, offsets, token permutation), gather
// each expert's tokens into contiguous rows, one GEMM pair per expert (SwiGLU), and a scatter
// that applies the unbiased router weight. Skip-class tokens output 0 or weight*x.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace zaya {

MoePlan plan_moe(const int32_t* expert, int64_t N, int64_t E) {
  MoePlan p;
  p.offsets.assign(static_cast<size_t>(E + 2), 0);
  for (int64_t n = 0; n < N; ++n) p.offsets[size_t(expert[n]) + 1]++;
  for (int64_t e = 0; e <= E; ++e) p.offsets[size_t(e + 1)] += p.offsets[size_t(e)];
  p.perm.resize(static_cast<size_t>(N));
  std::vector<int64_t> cursor(p.offsets.begin(), p.offsets.end() - 1);
  for (int64_t n = 0; n < N; ++n) p.perm[size_t(cursor[size_t(expert[n])]++)] = n;
  return p;
}

void CpuBackend::moe(const MoeArgs& a) {
  const int64_t N = a.N, D = a.D, I = a.I, E = a.E;
  const MoePlan plan = plan_moe(a.expert, N, E);
  const std::vector<int64_t>& offsets = plan.offsets;
  const std::vector<int64_t>& perm = plan.perm;

  const int64_t routed = offsets[size_t(E)];
  std::vector<float> xs(static_cast<size_t>(routed * D)), hidden(static_cast<size_t>(routed * 2 * I)), act(static_cast<size_t>(routed * I)),
      ys(static_cast<size_t>(routed * D));
#pragma omp parallel for if (routed * D > 65536)
  for (int64_t i = 0; i < routed; ++i) std::memcpy(xs.data() + i * D, a.x + perm[size_t(i)] * D, size_t(D) * 4);

  // Experts run in parallel, one per thread (each GEMM single-threaded inside the region):
  // experts hold few rows each, so splitting every small GEMM across threads costs more.
  const bool par_experts = routed * D > 65536;
  run_team(par_experts, [&] {
#pragma omp for schedule(dynamic)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets[size_t(e)], rows = offsets[size_t(e + 1)] - r0;
      if (rows == 0) continue;
      cpu_gemm(true, rows, 2 * I, D, 1.0f, xs.data() + r0 * D, D, a.gate_up + e * 2 * I * D, D, 0.0f,
               hidden.data() + r0 * 2 * I, 2 * I);
    }
  });
#pragma omp parallel for if (routed * I > 65536)
  for (int64_t i = 0; i < routed; ++i) {
    const float* gate = hidden.data() + i * 2 * I;
    const float* up = gate + I;
    float* o = act.data() + i * I;
    for (int64_t j = 0; j < I; ++j) o[j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
  }
  run_team(par_experts, [&] {
#pragma omp for schedule(dynamic)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets[size_t(e)], rows = offsets[size_t(e + 1)] - r0;
      if (rows == 0) continue;
      cpu_gemm(true, rows, D, I, 1.0f, act.data() + r0 * I, I, a.down + e * D * I, I, 0.0f,
               ys.data() + r0 * D, D);
    }
  });
  // Scatter every row: routed tokens get weight*expert(x); skip tokens 0 or weight*x.
#pragma omp parallel for if (N * D > 65536)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t n = perm[size_t(i)];
    float* out = a.out + n * D;
    const float w = a.weight[n];
    if (i < routed) {
      const float* y = ys.data() + i * D;
      for (int64_t d = 0; d < D; ++d) out[d] = w * y[d];
    } else if (a.skip_identity) {
      const float* x = a.x + n * D;
      for (int64_t d = 0; d < D; ++d) out[d] = w * x[d];
    } else {
      std::memset(out, 0, size_t(D) * 4);
    }
  }
}

}  // namespace zaya
