// The few-rows linear (gpu_gemv.h): one warp per output column n, its lanes along K reading
// w[n, :] once (8 weights at a time where the layout allows: one 16-byte load of bf16, two of
// fp32) and, for each of the at most kLinearGemvMaxRows rows, the matching fp32 x elements; one
// warp sum per row, then the bias and the accumulation in the store. Any warp size (CUDA and HIP
// alike).
#include "backend/cuda/gpu_gemv.h"

#include <string>

namespace zaya {
namespace {

// y's column n: the warp's sums over K of x's rows times w[n, :] (TW: bf16_t or float).
template <typename TW>
__device__ inline void linear_gemv_column(int64_t n, int lane, int64_t M, int64_t K, const float* x, const TW* w,
                                          int64_t ldw, const float* bias, int accumulate, float* y, int64_t ldy,
                                          int vec8) {
  const TW* wn = w + n * ldw;
  float acc[kLinearGemvMaxRows] = {};
  if (vec8) {
    for (int64_t k = int64_t(lane) * 8; k < K; k += int64_t(GPU_WARP_SIZE) * 8) {
      const auto wv = load8(wn + k);
#pragma unroll
      for (int m = 0; m < kLinearGemvMaxRows; ++m)
        if (m < M) acc[m] += dot8(x + m * K + k, wv);
    }
  } else {
    for (int64_t k = lane; k < K; k += GPU_WARP_SIZE) {
      const float wk = as_f32(wn[k]);
#pragma unroll
      for (int m = 0; m < kLinearGemvMaxRows; ++m)
        if (m < M) acc[m] += wk * x[m * K + k];
    }
  }
  const float b = bias != nullptr ? bias[n] : 0.0f;
#pragma unroll
  for (int m = 0; m < kLinearGemvMaxRows; ++m) {
    if (m < M) {  // M is the same for every lane: the warp sum runs in every lane
      const float sum = warp_sum(acc[m]) + b;
      if (lane == 0) {
        float* out = y + m * ldy + n;
        *out = accumulate ? *out + sum : sum;
      }
    }
  }
}

// grid: column tiles of the block's warps, striding on past the grid's last (gpu_blocks caps
// it). vec8: K and ldw multiples of 8 and x, w 16-byte aligned, so each lane reads 8 weights and
// 8 activations a row at once.
template <typename TW>
__global__ void k_linear_gemv(int64_t M, int64_t N, int64_t K, const float* x, const TW* w, int64_t ldw,
                              const float* bias, int accumulate, float* y, int64_t ldy, int vec8) {
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE, warps = int(blockDim.x) / GPU_WARP_SIZE;
  for (int64_t n = int64_t(blockIdx.x) * warps + int(threadIdx.x) / GPU_WARP_SIZE; n < N;
       n += int64_t(gridDim.x) * warps)
    linear_gemv_column(n, lane, M, K, x, w, ldw, bias, accumulate, y, ldy, vec8);
}

template <typename TW>
void launch_linear_gemv(gpuStream_t s, int warp_size, int64_t M, int64_t N, int64_t K, const float* x, const TW* w,
                        int64_t ldw, const float* bias, bool accumulate, float* y, int64_t ldy) {
  if (M <= 0 || N <= 0) return;
  if (M > kLinearGemvMaxRows)
    fail("cuda", "linear_gemv: " + std::to_string(M) + " rows, more than the few-rows linear's " +
                     std::to_string(kLinearGemvMaxRows));
  const int warps = kGpuThreads / warp_size;
  const bool vec8 = K % 8 == 0 && ldw % 8 == 0 && gpu_aligned(x) && gpu_aligned(w);
  gpu_launch(k_linear_gemv<TW>, gpu_blocks(N, warps), kGpuThreads, 0, s, M, N, K, x, w, ldw, bias,
             accumulate ? 1 : 0, y, ldy, vec8 ? 1 : 0);
  GPU_LAUNCH_CHECK();
}

}  // namespace

void linear_gemv(gpuStream_t s, int warp_size, int64_t M, int64_t N, int64_t K, const float* x, const bf16_t* w,
                 int64_t ldw, const float* bias, bool accumulate, float* y, int64_t ldy) {
  launch_linear_gemv(s, warp_size, M, N, K, x, w, ldw, bias, accumulate, y, ldy);
}

void linear_gemv(gpuStream_t s, int warp_size, int64_t M, int64_t N, int64_t K, const float* x, const float* w,
                 int64_t ldw, const float* bias, bool accumulate, float* y, int64_t ldy) {
  launch_linear_gemv(s, warp_size, M, N, K, x, w, ldw, bias, accumulate, y, ldy);
}

}  // namespace zaya
