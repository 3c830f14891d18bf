// Shared by the GPU attention forward and backward: the kernel parameter block and its setup
// from AttentionArgs, the visibility rule (causal, sliding window, packed-document start), the
// query tile of a block, and the lane layout of a head vector inside one warp (element
// d = lane + e * GPU_WARP_SIZE, at most 4 per lane, so head_dim <= 128 on 32-wide warps and on
// 64-wide wavefronts alike).
#pragma once

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_device.h"
#include "core/error.h"

namespace zaya {

constexpr int kAttnWarps = 4;       // warps per block
constexpr int kAttnMaxPerLane = 4;  // head_dim <= 4 * 32
constexpr int kAttnKeyTile = 32;    // keys staged in shared memory per step (forward, dQ)
constexpr int kAttnQueryTile = 32;  // queries staged per step (dK/dV)
constexpr int kAttnMaxDh = 128;

struct AttnParams {
  const float* q = nullptr;     // [B, T, Hq, dh]
  const float* k = nullptr;     // [B, S, Hkv, dh]
  const float* v = nullptr;     // [B, S, Hkv, dh]
  const float* o = nullptr;     // [B, T, Hq, dh] forward output (backward input)
  const float* dout = nullptr;  // [B, T, Hq, dh]
  float* out = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  float* lse = nullptr;   // [B, T, Hq] backward: row log-sum-exp
  float* drow = nullptr;  // [B, T, Hq] backward: rowsum(dO * O)
  const int64_t* pos0 = nullptr;  // [B] device
  const int32_t* seg = nullptr;   // [B*T] device or null
  int64_t B = 0, T = 0, S = 0, Hq = 0, Hkv = 0, dh = 0, window = 0;
  float scale = 1.0f;
  // Forward of short chunks with its keys split over `splits` blocks per query tile
  // (attention_key_splits.h; 1: no split): each block's slice, per query row r = (b T + t) Hq + h
  // and split j, at part[(r splits + j) (dh + 2)]: the unnormalised output, then the running max
  // and sum of its online softmax (max -inf and sum 0 when the slice saw no key).
  int64_t splits = 1;
  float* part = nullptr;
};

// The inputs of `a` as kernel parameters (outputs left null): pos0 and seg_start are uploaded
// into the two holders, which must outlive the launches. Fails unless the head dim fits the
// lane layout of `warp_size`-wide warps, or unless every query's position fits the cache
// (check_attention_rows). `op` names the operation in the message.
inline AttnParams attn_params(CudaBackend& be, const AttentionArgs& a, int warp_size, const char* op,
                              DeviceBuffer& pos0, DeviceBuffer& seg) {
  if (a.dh > kAttnMaxDh || a.dh > int64_t(kAttnMaxPerLane) * warp_size)
    fail("cuda", std::string(op) + ": head_dim " + std::to_string(a.dh) + " is not supported (at most 128)");
  check_attention_rows(a, "cuda", op);
  pos0 = be.upload(a.pos0, a.B * 8);
  if (a.seg_start) seg = be.upload(a.seg_start, a.B * a.T * 4);
  AttnParams p;
  p.q = a.q; p.k = a.k_cache; p.v = a.v_cache;
  p.pos0 = pos0.l(); p.seg = a.seg_start ? seg.i() : nullptr;
  p.B = a.B; p.T = a.T; p.S = a.S; p.Hq = a.Hq; p.Hkv = a.Hkv; p.dh = a.dh; p.window = a.window; p.scale = a.scale;
  return p;
}

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(ZAYA_SIMT)
// The queries of one block of the forward and dQ kernels (grid: query tiles times key splits,
// heads, sequences): rows [t_begin, t_begin + kAttnWarps * queries_per_warp) of head h (KV group
// g) of sequence b, and the keys [s_begin, s_end) that any of them may see (all of the tile's
// splits; the forward takes its slice of them).
struct AttnQueryTile {
  int64_t b, h, g, t_begin, s_begin, s_end;
};

__device__ inline AttnQueryTile attn_query_tile(const AttnParams& p, int queries_per_warp) {
  AttnQueryTile q;
  q.b = blockIdx.z;
  q.h = blockIdx.y;
  q.g = q.h / (p.Hq / p.Hkv);
  const int64_t tile_q = int64_t(kAttnWarps) * queries_per_warp;
  q.t_begin = int64_t(blockIdx.x) / p.splits * tile_q;
  const int64_t t_end = q.t_begin + tile_q < p.T ? q.t_begin + tile_q : p.T;
  const int64_t p_first = p.pos0[q.b] + q.t_begin, p_last = p.pos0[q.b] + t_end - 1;
  q.s_begin = p.window > 0 ? (p_first - p.window + 1 > 0 ? p_first - p.window + 1 : 0) : 0;
  if (p.seg) q.s_begin = q.s_begin > p.seg[q.b * p.T + q.t_begin] ? q.s_begin : p.seg[q.b * p.T + q.t_begin];
  q.s_end = p_last + 1;
  return q;
}

__device__ inline bool attn_visible(const AttnParams& p, int64_t b, int64_t t, int64_t s) {
  const int64_t pos = p.pos0[b] + t;
  if (s > pos) return false;
  if (p.window > 0 && pos - s >= p.window) return false;
  if (p.seg && s < int64_t(p.seg[b * p.T + t])) return false;
  return true;
}

// Dot product of a lane-distributed head vector with a row in shared memory, summed over the warp.
__device__ inline float lane_dot(const float (&x)[kAttnMaxPerLane], const float* row, int lane, int64_t dh) {
  float s = 0.0f;
  for (int e = 0; e < kAttnMaxPerLane; ++e) {
    const int64_t d = lane + int64_t(e) * GPU_WARP_SIZE;
    if (d < dh) s += x[e] * row[d];
  }
  return warp_sum(s);
}

__device__ inline void lane_load(float (&x)[kAttnMaxPerLane], const float* src, int lane, int64_t dh) {
  for (int e = 0; e < kAttnMaxPerLane; ++e) {
    const int64_t d = lane + int64_t(e) * GPU_WARP_SIZE;
    x[e] = d < dh ? src[d] : 0.0f;
  }
}

__device__ inline void lane_store(const float (&x)[kAttnMaxPerLane], float* dst, int lane, int64_t dh) {
  for (int e = 0; e < kAttnMaxPerLane; ++e) {
    const int64_t d = lane + int64_t(e) * GPU_WARP_SIZE;
    if (d < dh) dst[d] = x[e];
  }
}

// x += w * row for a lane-distributed head vector x and a row (in shared or global memory).
__device__ inline void lane_axpy(float (&x)[kAttnMaxPerLane], float w, const float* row, int lane, int64_t dh) {
  for (int e = 0; e < kAttnMaxPerLane; ++e) {
    const int64_t d = lane + int64_t(e) * GPU_WARP_SIZE;
    if (d < dh) x[e] += w * row[d];
  }
}

// Stages rows [r0, r0 + n) of a [.., H, dh] tensor (head hh of sequence b) into sh[n][dh].
__device__ inline void stage_rows(float* sh, const float* src, int64_t b, int64_t rows_per_seq, int64_t H, int64_t hh,
                                  int64_t dh, int64_t r0, int64_t n) {
  for (int64_t i = threadIdx.x; i < n * dh; i += blockDim.x) {
    const int64_t r = i / dh, d = i % dh;
    sh[i] = src[((b * rows_per_seq + r0 + r) * H + hh) * dh + d];
  }
}
#endif

}  // namespace zaya
