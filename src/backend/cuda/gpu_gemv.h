// The few-rows linear (gpu_gemv.cu): a decode step's linear y = x W^T + bias for a few token
// rows, as one kernel that reads the fp32 activations as they are and the weights as the policy
// has them: the weight's bf16 copy (a shadow while the weights are frozen) for the dense linears
// under the bf16 policy, so the call needs neither a conversion of x to bf16 nor a separate bias
// pass (one launch where the GEMM path takes two or three); the fp32 weights as stored for the
// fp32 linears (the router's and generation's logits, spec A.11, and every linear under the fp32
// policy), exact fp32 arithmetic as the GEMM's, where a GEMM tile of a few rows leaves most of
// its work empty. Memory-bound: every weight is read once.
//
// One launch serves several weight matrices of the same input (the attention's four input
// projections) and may apply the exact GELU to its sums (the router MLP's layers), so that a
// decode step pays one launch for what the layer's code asks as four linears, or as a linear
// and an activation.
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_device.h"

namespace zaya {

// The most token rows the few-rows linear takes: each warp reads the rows of x for its column
// from the L1 cache, so their traffic grows with the rows while the weights' does not; past a
// few rows the BLASLt GEMM (which reads each x element once per tile) serves.
constexpr int64_t kLinearGemvMaxRows = 4;
// The most weight matrices one launch takes.
constexpr int kLinearGemvMaxOutputs = 4;

// One weight matrix of a few-rows linear and where its output goes: y[m, n] = sum_k x[m, k]
// w[n, k] + bias[n] (+ y[m, n] when accumulating) for n < N; w stored [N, K] with row stride
// ldw, bf16 or fp32 as the call says; bias fp32 [N] or null; y fp32 with row stride ldy. With
// the GELU, y receives gelu(sum) and pre (when not null) the sum itself.
struct GemvOutput {
  const void* w = nullptr;
  int64_t ldw = 0;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t N = 0;
  float* pre = nullptr;
};

// The linears of outs[0..count) over the same x fp32 [M, K] (row stride K) in one launch:
// fp32 accumulation, any warp size (warp_size: the device's). M at most kLinearGemvMaxRows,
// count at most kLinearGemvMaxOutputs; gelu: y = 0.5 s (1 + erf(s / sqrt 2)) of the sum s, the
// CPU's GELU (no accumulation then).
void linear_gemv(gpuStream_t s, int warp_size, int64_t M, int64_t K, const float* x, bool bf16_weights,
                 const GemvOutput* outs, int count, bool accumulate, bool gelu);

}  // namespace zaya
