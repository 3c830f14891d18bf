// Grouped GEMMs over expert-contiguous rows whose extents live in device memory: expert e owns
// rows offsets[e] .. offsets[e + 1] (the MoE routing plan's offsets, never copied to the host),
// so a layer's experts run as one launch each with no host round trip. bf16 operands, fp32
// accumulation and an fp32 output: on the tensor cores in a CUDA build (the caller asks for them
// only on sm_80 or newer: CudaBackend::wmma(), CudaBackend::mma_sync()) or with FMAs on any target
// (HIP included): see GroupedCores.
// Opt-in (CudaBackendOptions::moe_device_grouped): the WMMA kernels lost to per-expert cuBLASLt
// GEMMs; the pipelined ones have not run yet.
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_device.h"
#include "backend/cuda/gpu_runtime.h"

namespace zaya {

// A bf16 matrix as stored: element (r, c) of the logical matrix is p[r * ld + c], or
// p[c * ld + r] when trans.
struct Bf16View {
  const bf16_t* p = nullptr;
  int64_t ld = 0;
  bool trans = false;
};

// The cores the grouped GEMMs run on.
enum class GroupedCores {
  fma,       // FMAs: any target (HIP, the portable kernels, devices before sm_80)
  wmma,      // bf16 WMMA tiles on the tensor cores (CUDA, sm_80 and newer)
  mma_sync,  // the pipelined mma.sync kernels where the shapes allow, else WMMA (CUDA, sm_80 and
             // newer, where the start-up check of the mma.sync primitives passed)
};

// Rows kind. For the rows r of every expert e:
//   C[r, 0:N] = alpha * A[r, 0:K] op(B_e) + beta * C[r, 0:N]
// A: [rows, K] row-major (lda). B_e = B + e * stride_b, its logical [K, N] stored [N, K]
// (b_trans, the weights as stored) or [K, N]. C fp32 (ldc). max_rows >= offsets[E] sizes the
// grid (the token count). beta == 0 never reads C.
void grouped_gemm_rows(gpuStream_t s, GroupedCores cores, const int32_t* offsets, int64_t E, int64_t max_rows,
                       int64_t N, int64_t K, float alpha, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb,
                       bool b_trans, int64_t stride_b, float beta, float* C, int64_t ldc);

// Weights kind (K = the expert's rows). For every expert e:
//   C_e[0:M, 0:N] = alpha * A_e^T B_e + beta * C_e
// A_e, B_e: expert e's rows of A [rows, M] (lda) and B [rows, N] (ldb); C_e = C + e * stride_c,
// fp32 [M, N] (ldc). An expert with no rows gets beta * C_e.
void grouped_gemm_weights(gpuStream_t s, GroupedCores cores, const int32_t* offsets, int64_t E, int64_t M, int64_t N,
                          float alpha, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, float beta,
                          float* C, int64_t ldc, int64_t stride_c);

// The same two products through the pipelined tensor-core kernels (gpu_grouped_gemm_mma.cu,
// CUDA sm_80+ only: the caller checks the device). They return false, launching nothing, when
// the shapes or strides are not multiples of 8 elements or an operand is not 16-byte aligned
// (and always on HIP); grouped_gemm_rows / grouped_gemm_weights try them first for
// GroupedCores::mma_sync.
bool grouped_gemm_rows_mma(gpuStream_t s, const int32_t* offsets, int64_t E, int64_t max_rows, int64_t N, int64_t K,
                           float alpha, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, bool b_trans,
                           int64_t stride_b, float beta, float* C, int64_t ldc);
bool grouped_gemm_weights_mma(gpuStream_t s, const int32_t* offsets, int64_t E, int64_t M, int64_t N, float alpha,
                              const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C,
                              int64_t ldc, int64_t stride_c);

// Few-rows kind (gpu_grouped_gemv.cu): the rows kind's product for at most kGroupedGemvMaxRows
// grouped rows (a decode step's tokens), as one dot product per (row, column) straight from the
// row's expert (found in the device offsets): memory-bound, with no tile padding. Rows past the
// routed ones (offsets[E]) are left as they are. warp_size: the device's (the launch's warps).
// A is bf16, or fp32 as stored (the forward's activations, with no conversion pass first).
constexpr int64_t kGroupedGemvMaxRows = 16;
void grouped_gemv_rows(gpuStream_t s, int warp_size, const int32_t* offsets, int64_t E, int64_t max_rows, int64_t N,
                       int64_t K, float alpha, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb,
                       bool b_trans, int64_t stride_b, float beta, float* C, int64_t ldc);
void grouped_gemv_rows(gpuStream_t s, int warp_size, const int32_t* offsets, int64_t E, int64_t max_rows, int64_t N,
                       int64_t K, float alpha, const float* A, int64_t lda, const bf16_t* B, int64_t ldb,
                       bool b_trans, int64_t stride_b, float beta, float* C, int64_t ldc);

// The MoE forward of a few tokens (gpu_grouped_gemv.cu) in two launches instead of six (routing
// plan, row gather, gate_up GEMV, SwiGLU, down GEMV, scatter), for at most kGroupedGemvMaxRows
// tokens: each token's products read its expert's weights straight from expert[n] (classes
// 0..E, E = skip), so no plan is needed; the same terms in the same order as the six, so the
// same bits. Each expert's weights bf16, stored [2I, D] (gate_up) and [D, I] (down), stride_*
// elements apart. A class outside 0..E-1 is taken as the skip class (the router makes none).
// act[n, j] = silu(x[n] . GU_e[j]) * (x[n] . GU_e[I + j]) for the routed tokens n < N (x fp32
// [N, D]; e = expert[n]). Rows of skip-class tokens are left as they are.
void moe_gate_up_swiglu_tokens(gpuStream_t s, int warp_size, const int32_t* expert, int64_t E, int64_t N, int64_t I,
                               int64_t D, const float* x, const bf16_t* gate_up, int64_t ld_gate_up,
                               int64_t stride_gate_up, float* act);
// out[n, d] = weight[n] * (act[n] . DN_e[d]) for the routed tokens, and weight * x or 0
// (skip_identity or not) for the skip-class ones: every token's row of out is written.
void moe_down_weighted_tokens(gpuStream_t s, int warp_size, const int32_t* expert, int64_t E, int64_t N, int64_t D,
                              int64_t I, const float* act, const bf16_t* down, int64_t ld_down, int64_t stride_down,
                              const float* weight, const float* x, bool skip_identity, float* out);

// The virtual architecture (e.g. 90 for compute_90) the grouped kernels were compiled for on
// this device (CUDA), or 0 (HIP, or no usable device): the WMMA path needs 80 or more.
int grouped_gemm_compiled_arch();

}  // namespace zaya
