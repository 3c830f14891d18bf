// Shared by the GPU MoE forward and backward: the routing plan built on the device (class
// histogram, offsets, a stable token permutation grouping tokens by class, class E = skip
// last, identical to backend/cpu's plan_moe), row gathers, SwiGLU, the experts' GEMMs over
// their contiguous rows (per expert from host offsets, or grouped from device offsets) and the
// experts' gate_up half (forward, and recomputed in the backward).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_grouped_gemm.h"

namespace zaya {

struct GpuMoePlan {
  DeviceBuffer perm;             // [N] int32: token of each grouped row
  DeviceBuffer offsets_dev;      // [E + 2] int32 on the device: class e owns grouped rows offsets[e]..offsets[e+1]
  std::vector<int32_t> offsets;  // the same on the host; empty when the plan stays on the device
  int64_t routed = -1;           // tokens sent to an expert (= offsets[E]); -1 when the plan stays on the device
  // Device pointer to the routed count (offsets_dev[E]): what the scatter kernels read.
  const int32_t* routed_dev(int64_t E) const { return offsets_dev.i() + E; }
};

// Builds the plan on the device. With to_host, copies the E + 2 offsets to the host (one
// synchronisation) so that per-expert GEMMs can be launched from there.
GpuMoePlan gpu_plan_moe(CudaBackend& be, const int32_t* expert, int64_t N, int64_t E, bool to_host);

// dst[i, :] = src[perm[i], :] * (row_scale ? row_scale[perm[i]] : 1) for i < rows.
void gpu_gather_rows(gpuStream_t s, const float* src, const int32_t* perm, const float* row_scale, int64_t rows,
                     int64_t D, float* dst);
// act[i, j] = silu(hid[i, j]) * hid[i, I + j] for i < rows, and i < *rows_dev when given (the
// routed count on the device: rows past it are not computed).
void gpu_swiglu(gpuStream_t s, const float* hid, float* act, int64_t rows, int64_t I,
                const int32_t* rows_dev = nullptr);

// The same operand starting `rows` stored rows further down.
inline GemmOperand operand_rows(GemmOperand o, int64_t rows) {
  const int64_t elem = o.type == GemmType::BF16 ? 2 : 4;
  o.ptr = static_cast<const char*>(o.ptr) + rows * o.ld * elem;
  return o;
}

// The experts' GEMMs of one MoE call over the plan's grouped rows. Operands come from
// CudaBackend::operand (bf16 under the bf16 policy). Three forms:
//   device-grouped  (asked for, bf16 policy): one grouped-GEMM launch per product from the
//                   device offsets;
//   few rows        (bf16 policy, at most kGroupedGemvMaxRows tokens: decode; unless
//                   CudaBackendOptions::moe_few_rows_gemv is off): the products as
//                   device GEMVs from the device offsets (grouped_gemv_rows), the weight
//                   gradients as grouped GEMMs;
//   per expert      (otherwise): the offsets copied to the host (one synchronisation), then one
//                   ragged-plan BLASLt GEMM per expert with rows.
// The first two never copy the plan to the host.
class ExpertGemms {
 public:
  // Builds the routing plan of expert[N] (classes 0..E, E = skip).
  ExpertGemms(CudaBackend& be, const int32_t* expert, int64_t N, int64_t E);
  // Whether a call of N tokens on this backend takes the few-rows form (the MoE forward then
  // runs its two fused kernels without building a plan).
  static bool few_rows_for(const CudaBackend& be, int64_t N) {
    return !be.moe_device_grouped() && be.bf16_matmul() && be.moe_few_rows_gemv() && N <= kGroupedGemvMaxRows;
  }
  const GpuMoePlan& plan() const { return plan_; }
  // Whether the offsets stay on the device (device-grouped or few rows).
  bool device_offsets() const { return grouped_ || few_rows_; }
  // Whether by_rows runs as device GEMVs (few rows), which read an fp32 A as stored: the
  // backward's recompute of a few-rows call then reads the forward's fp32 rows, as the forward's
  // fused kernels (moe_gate_up_swiglu_tokens) did.
  bool few_rows() const { return few_rows_; }
  // Rows of the grouped-row buffers: the routed count (host offsets), or N (device offsets:
  // rows past the routed ones are not computed and must not be read).
  int64_t rows() const { return rows_; }
  // With device offsets: the routed count on the device (the grouped rows that are computed);
  // else nullptr (all rows() are).
  const int32_t* routed_rows_dev() const { return device_offsets() ? plan_.routed_dev(E_) : nullptr; }
  // C[r, :] = A[r, :] op(W_e) + beta * C[r, :] for the rows r of every expert e. A: [rows, K]
  // as stored (bf16 under the bf16 policy; fp32 too in the few-rows form); W_e = W + e *
  // stride_w elements, its logical [K, N] stored [N, K] (W.trans) or [K, N]; C fp32 with row
  // stride ldc.
  void by_rows(int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& W, int64_t stride_w, float beta,
               float* C, int64_t ldc) const;
  // C_e += A_e^T B_e for every expert e over its rows: A [rows, M], B [rows, N] as stored
  // (A.trans and B.trans false); C_e = C + e * stride_c, fp32 [M, N] with row stride ldc.
  void weight_grads(int64_t M, int64_t N, const GemmOperand& A, const GemmOperand& B, float* C, int64_t ldc,
                    int64_t stride_c) const;

 private:
  CudaBackend& be_;
  int64_t E_;
  bool grouped_;    // device-grouped GEMMs (asked for)
  bool few_rows_;   // device GEMVs for at most kGroupedGemvMaxRows tokens (not grouped_)
  GpuMoePlan plan_;
  int64_t rows_;
};

// The gate_up half of every expert over the grouped rows: hid [rows, 2I] = xs GU_e^T per
// expert (xo: the gathered inputs [rows, D]; guo: all experts' gate_up, each [2I, D],
// transposed), then act [rows, I] = SwiGLU(hid).
void gpu_moe_gate_up(CudaBackend& be, const ExpertGemms& experts, int64_t I, int64_t D, const GemmOperand& xo,
                     const GemmOperand& guo, float* hid, float* act);

}  // namespace zaya
