// Shared by the GPU MoE forward and backward: the routing plan built on the device (class
// histogram, offsets, a stable token permutation grouping tokens by class, class E = skip
// last, identical to backend/cpu's plan_moe), row gathers, SwiGLU, operand offsets, the loop
// over experts and the experts' gate_up half (forward, and recomputed in the backward).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace zaya {

struct GpuMoePlan {
  DeviceBuffer perm;             // [N] int32: token of each grouped row
  std::vector<int32_t> offsets;  // host [E + 2]: class e owns grouped rows offsets[e]..offsets[e+1]
  int64_t routed = 0;            // tokens sent to an expert: grouped rows [0, routed) (= offsets[E])
};

// Builds the plan on the device; copies the E + 2 offsets to the host (one synchronisation)
// so that the per-expert GEMMs can be launched.
GpuMoePlan gpu_plan_moe(CudaBackend& be, const int32_t* expert, int64_t N, int64_t E);

// dst[i, :] = src[perm[i], :] * (row_scale ? row_scale[perm[i]] : 1) for i < rows.
void gpu_gather_rows(gpuStream_t s, const float* src, const int32_t* perm, const float* row_scale, int64_t rows,
                     int64_t D, float* dst);
// act[i, j] = silu(hid[i, j]) * hid[i, I + j]
void gpu_swiglu(gpuStream_t s, const float* hid, float* act, int64_t rows, int64_t I);
// dhid from dact and hid (SwiGLU backward).
void gpu_swiglu_backward(gpuStream_t s, const float* hid, const float* dact, float* dhid, int64_t rows, int64_t I);

// The same operand starting `rows` stored rows further down.
inline GemmOperand operand_rows(GemmOperand o, int64_t rows) {
  const int64_t elem = o.type == GemmType::BF16 ? 2 : 4;
  o.ptr = static_cast<const char*>(o.ptr) + rows * o.ld * elem;
  return o;
}

// Calls f(e, r0, rows) for each of the E experts that has tokens: grouped rows [r0, r0 + rows).
template <class F>
void for_each_expert(const GpuMoePlan& plan, int64_t E, F&& f) {
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = plan.offsets[size_t(e)], rows = plan.offsets[size_t(e + 1)] - r0;
    if (rows > 0) f(e, r0, rows);
  }
}

// The gate_up half of every expert over the `routed` grouped rows: hid [routed, 2I] = xs GU_e^T
// per expert (xo: the gathered inputs [routed, D]; guo: all experts' gate_up, each [2I, D],
// transposed), then act [routed, I] = SwiGLU(hid).
void gpu_moe_gate_up(CudaBackend& be, const GpuMoePlan& plan, int64_t E, int64_t I, int64_t D, int64_t routed,
                     const GemmOperand& xo, const GemmOperand& guo, float* hid, float* act);

}  // namespace zaya
