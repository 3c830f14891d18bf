// The few-rows kind of the grouped expert products (gpu_grouped_gemm.h, grouped_gemv_rows): a
// decode step's MoE has a handful of routed tokens, so each (row, output column) is one dot
// product over K read straight from the row's expert, which the kernel finds in the device
// offsets (no host round trip, no 128-row tile mostly empty). Memory-bound by design: each
// row reads its expert's weights once, in 16-byte loads where the layout allows.
//   weights stored [N, K] (b_trans): one warp per output column, its lanes along K, then a
//                                    warp sum;
//   weights stored [K, N]:           one thread per output column, down K (adjacent threads
//                                    read adjacent columns).
// The MoE forward of a few tokens runs on two fused forms of the first, token by token from the
// router's classes, with no plan (moe_gate_up_swiglu_tokens: SwiGLU folded in;
// moe_down_weighted_tokens: the router weight folded in, each token's row stored in place). bf16 weights, bf16 or fp32 activations, fp32 accumulation, fp32 output; any warp
// size (CUDA and HIP alike).
#include "backend/cuda/gpu_grouped_gemm.h"

#include <string>

namespace zaya {
namespace {

// The expert owning grouped row r: the largest e with offsets[e] <= r (offsets ascending).
__device__ inline int64_t expert_of_row(const int32_t* offsets, int64_t E, int64_t r) {
  int64_t lo = 0, hi = E - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// One lane's share of the dot product of a[0, K) with b[0, K) (bf16), the lanes of a warp
// taking 8 elements at a time in 16-byte loads (vec8: a, b 16-byte aligned and K a multiple of
// 8) or one at a time; the warp's sum of the shares is the product.
template <typename TA>
__device__ inline float lane_dot(const TA* a, const bf16_t* b, int64_t K, int lane, int vec8) {
  float acc = 0.0f;
  if (vec8) {
    for (int64_t k = int64_t(lane) * 8; k < K; k += int64_t(GPU_WARP_SIZE) * 8) acc += dot8(a + k, load8(b + k));
  } else {
    for (int64_t k = lane; k < K; k += GPU_WARP_SIZE) acc += as_f32(a[k]) * bf16_to_f32(b[k]);
  }
  return acc;
}

// grid (column tiles of the block's warps, striding on past the grid's last, rows); vec8: K,
// lda, ldb and stride_b multiples of 8 and A, B 16-byte aligned, so each lane reads 8 elements
// at once. A: bf16, or fp32 as stored.
template <typename TA>
__global__ void k_gemv_rows_bt(const int32_t* offsets, int64_t E, int64_t N, int64_t K, float alpha,
                               const TA* A, int64_t lda, const bf16_t* B, int64_t ldb, int64_t stride_b,
                               float beta, float* C, int64_t ldc, int vec8) {
  const int64_t r = blockIdx.y;
  if (r >= offsets[E]) return;  // a skip-class row, or past the routed ones
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE, warps = int(blockDim.x) / GPU_WARP_SIZE;
  const TA* a = A + r * lda;
  const bf16_t* expert_b = B + expert_of_row(offsets, E, r) * stride_b;
  for (int64_t n = int64_t(blockIdx.x) * warps + int(threadIdx.x) / GPU_WARP_SIZE; n < N;
       n += int64_t(gridDim.x) * warps) {
    const float acc = warp_sum(lane_dot(a, expert_b + n * ldb, K, lane, vec8));
    if (lane == 0) {
      float* c = C + r * ldc + n;
      *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
    }
  }
}

// grid (column tiles of blockDim.x, striding on past the grid's last, rows).
template <typename TA>
__global__ void k_gemv_rows_bn(const int32_t* offsets, int64_t E, int64_t N, int64_t K, float alpha,
                               const TA* A, int64_t lda, const bf16_t* B, int64_t ldb, int64_t stride_b,
                               float beta, float* C, int64_t ldc) {
  const int64_t r = blockIdx.y;
  if (r >= offsets[E]) return;
  const TA* a = A + r * lda;
  const bf16_t* expert_b = B + expert_of_row(offsets, E, r) * stride_b;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    const bf16_t* b = expert_b + n;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) acc += as_f32(a[k]) * bf16_to_f32(b[k * ldb]);
    float* c = C + r * ldc + n;
    *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
  }
}

// The two dot products of token n's gate and up columns j and I + j with its expert's weights
// (as k_gemv_rows_bt: the same lanes' terms, then warp sums), and their SwiGLU (as k_swiglu).
__global__ void k_moe_gate_up_swiglu(const int32_t* expert, int64_t E, int64_t I, int64_t D, const float* x,
                                     const bf16_t* gate_up, int64_t ldw, int64_t stride_w, float* act, int vec8) {
  const int64_t n = blockIdx.y, e = expert[n];
  if (e < 0 || e >= E) return;  // the skip class
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE, warps = int(blockDim.x) / GPU_WARP_SIZE;
  const float* a = x + n * D;
  const bf16_t* w = gate_up + e * stride_w;
  for (int64_t j = int64_t(blockIdx.x) * warps + int(threadIdx.x) / GPU_WARP_SIZE; j < I;
       j += int64_t(gridDim.x) * warps) {
    const float g = warp_sum(lane_dot(a, w + j * ldw, D, lane, vec8));
    const float u = warp_sum(lane_dot(a, w + (I + j) * ldw, D, lane, vec8));
    if (lane == 0) act[n * I + j] = g / (1.0f + expf(-g)) * u;
  }
}

// Token n's output columns d: a warp's dot product of act[n] with its expert's down row d, times
// the token's router weight; a skip-class token's threads write weight * x or 0 straight (as
// k_moe_scatter).
__global__ void k_moe_down_weighted(const int32_t* expert, int64_t E, int64_t D, int64_t I, const float* act,
                                    const bf16_t* down, int64_t ldw, int64_t stride_w, const float* weight,
                                    const float* x, int skip_identity, float* out, int vec8) {
  const int64_t n = blockIdx.y, e = expert[n];
  const float wt = weight[n];
  float* o = out + n * D;
  if (e < 0 || e >= E) {
    for (int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; d < D; d += int64_t(gridDim.x) * blockDim.x)
      o[d] = skip_identity ? wt * x[n * D + d] : 0.0f;
    return;
  }
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE, warps = int(blockDim.x) / GPU_WARP_SIZE;
  const float* a = act + n * I;
  const bf16_t* w = down + e * stride_w;
  for (int64_t d = int64_t(blockIdx.x) * warps + int(threadIdx.x) / GPU_WARP_SIZE; d < D;
       d += int64_t(gridDim.x) * warps) {
    const float acc = warp_sum(lane_dot(a, w + d * ldw, I, lane, vec8));
    if (lane == 0) o[d] = wt * acc;
  }
}

void check_few_rows(int64_t N, const char* what) {
  if (N > kGroupedGemvMaxRows)
    fail("cuda", std::string(what) + ": " + std::to_string(N) + " rows, more than the few-rows kind's " +
                     std::to_string(kGroupedGemvMaxRows));
}

template <typename TA>
void launch_gemv_rows(gpuStream_t s, int warp_size, const int32_t* offsets, int64_t E, int64_t max_rows, int64_t N,
                      int64_t K, float alpha, const TA* A, int64_t lda, const bf16_t* B, int64_t ldb, bool b_trans,
                      int64_t stride_b, float beta, float* C, int64_t ldc) {
  if (E <= 0 || max_rows <= 0 || N <= 0) return;
  check_few_rows(max_rows, "grouped_gemv_rows");
  if (b_trans) {
    const int warps = kGpuThreads / warp_size;
    const bool vec8 = K % 8 == 0 && lda % 8 == 0 && ldb % 8 == 0 && stride_b % 8 == 0 && gpu_aligned(A) &&
                      gpu_aligned(B);
    gpu_launch(k_gemv_rows_bt<TA>, dim3(gpu_blocks(N, warps), unsigned(max_rows)), kGpuThreads, 0, s, offsets,
               E, N, K, alpha, A, lda, B, ldb, stride_b, beta, C, ldc, vec8 ? 1 : 0);
  } else {
    gpu_launch(k_gemv_rows_bn<TA>, dim3(gpu_blocks(N), unsigned(max_rows)), kGpuThreads, 0, s,
               offsets, E, N, K, alpha, A, lda, B, ldb, stride_b, beta, C, ldc);
  }
  GPU_LAUNCH_CHECK();
}

}  // namespace

void grouped_gemv_rows(gpuStream_t s, int warp_size, const int32_t* offsets, int64_t E, int64_t max_rows, int64_t N,
                       int64_t K, float alpha, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb,
                       bool b_trans, int64_t stride_b, float beta, float* C, int64_t ldc) {
  launch_gemv_rows(s, warp_size, offsets, E, max_rows, N, K, alpha, A, lda, B, ldb, b_trans, stride_b, beta, C, ldc);
}

void grouped_gemv_rows(gpuStream_t s, int warp_size, const int32_t* offsets, int64_t E, int64_t max_rows, int64_t N,
                       int64_t K, float alpha, const float* A, int64_t lda, const bf16_t* B, int64_t ldb,
                       bool b_trans, int64_t stride_b, float beta, float* C, int64_t ldc) {
  launch_gemv_rows(s, warp_size, offsets, E, max_rows, N, K, alpha, A, lda, B, ldb, b_trans, stride_b, beta, C, ldc);
}

void moe_gate_up_swiglu_tokens(gpuStream_t s, int warp_size, const int32_t* expert, int64_t E, int64_t N, int64_t I,
                               int64_t D, const float* x, const bf16_t* gate_up, int64_t ld_gate_up,
                               int64_t stride_gate_up, float* act) {
  if (N <= 0 || I <= 0) return;
  check_few_rows(N, "moe_gate_up_swiglu_tokens");
  const int warps = kGpuThreads / warp_size;
  const bool vec8 = D % 8 == 0 && ld_gate_up % 8 == 0 && stride_gate_up % 8 == 0 && gpu_aligned(x) &&
                    gpu_aligned(gate_up);
  gpu_launch(k_moe_gate_up_swiglu, dim3(gpu_blocks(I, warps), unsigned(N)), kGpuThreads, 0, s, expert, E, I, D, x,
             gate_up, ld_gate_up, stride_gate_up, act, vec8 ? 1 : 0);
  GPU_LAUNCH_CHECK();
}

void moe_down_weighted_tokens(gpuStream_t s, int warp_size, const int32_t* expert, int64_t E, int64_t N, int64_t D,
                              int64_t I, const float* act, const bf16_t* down, int64_t ld_down, int64_t stride_down,
                              const float* weight, const float* x, bool skip_identity, float* out) {
  if (N <= 0 || D <= 0) return;
  check_few_rows(N, "moe_down_weighted_tokens");
  const int warps = kGpuThreads / warp_size;
  const bool vec8 = I % 8 == 0 && ld_down % 8 == 0 && stride_down % 8 == 0 && gpu_aligned(act) && gpu_aligned(down);
  gpu_launch(k_moe_down_weighted, dim3(gpu_blocks(D, warps), unsigned(N)), kGpuThreads, 0, s, expert, E, D, I, act,
             down, ld_down, stride_down, weight, x, skip_identity ? 1 : 0, out, vec8 ? 1 : 0);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
