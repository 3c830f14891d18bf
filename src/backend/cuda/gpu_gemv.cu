// The few-rows linear (gpu_gemv.h): one warp per output column, its lanes along K reading the
// column's weights once (8 at a time where the layout allows: one 16-byte load of bf16, two of
// fp32) and, for each of the at most kLinearGemvMaxRows rows, the matching fp32 x elements; one
// warp sum per row, then the bias, the GELU or the accumulation in the store. The columns of
// every weight matrix of the call are numbered one after another, so one grid covers them all.
// Any warp size (CUDA and HIP alike).
#include "backend/cuda/gpu_gemv.h"

#include <string>

namespace zaya {
namespace {

// The call's weight matrices, by value in the kernel's parameters: output o owns the columns
// [first[o], first[o + 1]) of the launch; vec8[o]: K and its ldw multiples of 8 and x and its w
// 16-byte aligned, so each lane reads 8 weights and 8 activations a row at once.
struct GemvOutputs {
  GemvOutput out[kLinearGemvMaxOutputs];
  int64_t first[kLinearGemvMaxOutputs + 1] = {};
  int vec8[kLinearGemvMaxOutputs] = {};
  int count = 0;
};

// Output o's column n: the warp's sums over K of x's rows times w[n, :] (TW: bf16_t or float).
template <typename TW>
__device__ inline void linear_gemv_column(const GemvOutput& o, int64_t n, int lane, int64_t M, int64_t K,
                                          const float* x, int vec8, int accumulate, int gelu) {
  const TW* wn = static_cast<const TW*>(o.w) + n * o.ldw;
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
  const float b = o.bias != nullptr ? o.bias[n] : 0.0f;
#pragma unroll
  for (int m = 0; m < kLinearGemvMaxRows; ++m) {
    if (m < M) {  // M is the same for every lane: the warp sum runs in every lane
      const float sum = warp_sum(acc[m]) + b;
      if (lane == 0) {
        float* out = o.y + m * o.ldy + n;
        if (gelu) {
          if (o.pre != nullptr) o.pre[m * o.ldy + n] = sum;
          *out = gelu_erf(sum);
        } else {
          *out = accumulate ? *out + sum : sum;
        }
      }
    }
  }
}

// grid: column tiles of the block's warps over every output's columns, striding on past the
// grid's last (gpu_blocks caps it).
template <typename TW>
__global__ void k_linear_gemv(GemvOutputs outs, int64_t M, int64_t K, const float* x, int accumulate, int gelu) {
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE, warps = int(blockDim.x) / GPU_WARP_SIZE;
  const int64_t columns = outs.first[outs.count];
  for (int64_t c = int64_t(blockIdx.x) * warps + int(threadIdx.x) / GPU_WARP_SIZE; c < columns;
       c += int64_t(gridDim.x) * warps) {
    // The column's output, picked with constant indices (a parameter indexed by a variable
    // would be copied to local memory).
    GemvOutput o = outs.out[0];
    int64_t first = 0;
    int vec8 = outs.vec8[0];
#pragma unroll
    for (int i = 1; i < kLinearGemvMaxOutputs; ++i)
      if (i < outs.count && c >= outs.first[i]) o = outs.out[i], first = outs.first[i], vec8 = outs.vec8[i];
    linear_gemv_column<TW>(o, c - first, lane, M, K, x, vec8, accumulate, gelu);
  }
}

}  // namespace

void linear_gemv(gpuStream_t s, int warp_size, int64_t M, int64_t K, const float* x, bool bf16_weights,
                 const GemvOutput* outs, int count, bool accumulate, bool gelu) {
  if (M > kLinearGemvMaxRows)
    fail("cuda", "linear_gemv: " + std::to_string(M) + " rows, more than the few-rows linear's " +
                     std::to_string(kLinearGemvMaxRows));
  if (count < 1 || count > kLinearGemvMaxOutputs)
    fail("cuda", "linear_gemv: " + std::to_string(count) + " weight matrices, expected 1 to " +
                     std::to_string(kLinearGemvMaxOutputs));
  GemvOutputs p;
  p.count = count;
  for (int o = 0; o < count; ++o) {
    p.out[o] = outs[o];
    p.first[o + 1] = p.first[o] + outs[o].N;
    p.vec8[o] = K % 8 == 0 && outs[o].ldw % 8 == 0 && gpu_aligned(x) && gpu_aligned(outs[o].w);
  }
  if (M <= 0 || p.first[count] <= 0) return;
  const int warps = kGpuThreads / warp_size;
  if (bf16_weights)
    gpu_launch(k_linear_gemv<bf16_t>, gpu_blocks(p.first[count], warps), kGpuThreads, 0, s, p, M, K, x,
               accumulate ? 1 : 0, gelu ? 1 : 0);
  else
    gpu_launch(k_linear_gemv<float>, gpu_blocks(p.first[count], warps), kGpuThreads, 0, s, p, M, K, x,
               accumulate ? 1 : 0, gelu ? 1 : 0);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
