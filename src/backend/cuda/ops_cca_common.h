// Pieces shared by the CCA forward and backward on the GPU: the virtual "ext" rows (state
// rows, then the chunk's raw q||k rows), the depthwise stage, the grouped stage as GEMMs, and
// the packed-document row expansion (the same re-layout as backend/cpu/ops_cca_segments.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/gpu_runtime.h"

namespace zaya {

class CudaBackend;

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(ZAYA_SIMT)
// Row `row` of concat(state [P, C], u [T, C]) for sequence b; a null state reads as zeros.
__device__ inline float conv_ext(const float* u, const float* state, int64_t b, int64_t row, int64_t c, int64_t T,
                                 int64_t C, int64_t P) {
  if (row < P) return state ? state[(b * P + row) * C + c] : 0.0f;
  return u[(b * T + row - P) * C + c];
}
#endif

// y[b, s, c] = b_dw[c] + sum_i w_dw[c, i] * ext(b, s + i, c) for s < T + t1 - 1.
void launch_conv_depthwise(gpuStream_t s, const float* u, const float* state, const float* w_dw, const float* b_dw,
                           float* y, int64_t B, int64_t T, int64_t C, int64_t P, int64_t t0, int64_t t1);
// The grouped stage through the GEMM engine (ops_cca_grouped_gemm.cu), y: [B, T + t1 - 1, C].
// z[b, t, c] = b_grp[c] + sum_{ci, j} w_grp[c, ci, j] y[b, t + j, (c / G) * G + ci]
void grouped_conv_gemm(CudaBackend& be, const float* y, const float* w_grp, const float* b_grp, float* z, int64_t B,
                       int64_t T, int64_t C, int64_t G, int64_t t1);
// Its backward: dy (overwritten, [B, T + t1 - 1, C]) and, when dw_grp is set, dw_grp += dL/dw.
void grouped_conv_gemm_backward(CudaBackend& be, const float* dz, const float* y, const float* w_grp, float* dy,
                                float* dw_grp, int64_t B, int64_t T, int64_t C, int64_t G, int64_t t1);
// Chunks of at least this many tokens take the GEMM path forward; shorter ones (decode) one
// kernel, so that a decode step is not t1 * B library calls.
constexpr int64_t kConvGemmMinTokens = 64;

// The NeoX RoPE table of N tokens at device positions[n]: cs/sn[n * half + k] = cos/sin of
// positions[n] * theta^(-2k / rotary_dim), in double (ops_cca_qk_kernels.h's k_rope_table).
// The forward and the backward of cca_qk both build it.
void launch_rope_table(gpuStream_t s, const int64_t* positions, int64_t N, int64_t half, int64_t rotary_dim,
                       double theta, float* cs, float* sn);

// dst[rows[t], :] (+)= src[t, :] for t < T (rows of width C).
void launch_scatter_rows(gpuStream_t s, const float* src, const int32_t* rows, int64_t T, int64_t C, float* dst,
                         bool accumulate);
// dst[t, :] (+)= src[rows[t], :] for t < T.
void launch_gather_rows(gpuStream_t s, const float* src, const int32_t* rows, int64_t T, int64_t C, float* dst,
                        bool accumulate);

// Expanded row of every token of one packed row (P zero rows before each document start after
// the first); returns the expanded length. seg_start is host memory.
inline int64_t expanded_rows(const int32_t* seg_start, int64_t T, int64_t P, std::vector<int32_t>& row_of) {
  row_of.resize(static_cast<size_t>(T));
  int64_t inserted = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (t > 0 && seg_start[t] == t) inserted += P;
    row_of[size_t(t)] = int32_t(t + inserted);
  }
  return T + inserted;
}

}  // namespace zaya
