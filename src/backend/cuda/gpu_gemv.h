// The few-rows linear (gpu_gemv.cu): a decode step's linear y = x W^T + bias for a few token
// rows, as one kernel that reads the fp32 activations as they are and the weights as the policy
// has them: the weight's bf16 copy (a shadow while the weights are frozen) for the dense linears
// under the bf16 policy, so the call needs neither a conversion of x to bf16 nor a separate bias
// pass (one launch where the GEMM path takes two or three); the fp32 weights as stored for the
// fp32 linears (the router's and generation's logits, spec A.11, and every linear under the fp32
// policy), exact fp32 arithmetic as the GEMM's, where a GEMM tile of a few rows leaves most of
// its work empty. Memory-bound: every weight is read once.
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_device.h"

namespace zaya {

// The most token rows the few-rows linear takes: each warp reads the rows of x for its column
// from the L1 cache, so their traffic grows with the rows while the weights' does not; past a
// few rows the BLASLt GEMM (which reads each x element once per tile) serves.
constexpr int64_t kLinearGemvMaxRows = 4;

// y[m, n] = sum_k x[m, k] w[n, k] + bias[n] (+ y[m, n] when accumulate) for m < M, n < N:
// x fp32 [M, K] (row stride K), w bf16 or fp32 stored [N, K] (row stride ldw), bias fp32 [N] or
// null, y fp32 with row stride ldy. fp32 accumulation; any warp size (warp_size: the device's).
// M must be at most kLinearGemvMaxRows.
void linear_gemv(gpuStream_t s, int warp_size, int64_t M, int64_t N, int64_t K, const float* x, const bf16_t* w,
                 int64_t ldw, const float* bias, bool accumulate, float* y, int64_t ldy);
void linear_gemv(gpuStream_t s, int warp_size, int64_t M, int64_t N, int64_t K, const float* x, const float* w,
                 int64_t ldw, const float* bias, bool accumulate, float* y, int64_t ldy);

}  // namespace zaya
