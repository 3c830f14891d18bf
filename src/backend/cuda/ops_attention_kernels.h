// The kernels of the CUDA-core causal GQA attention forward for short chunks (ops_attention.cu
// launches them and describes them): one warp per kQueriesPerWarp queries (a tile of at most that
// many, as in decode or a chunk's last tile: every warp on the same queries over its share of the
// keys), K/V tiles in shared
// memory, an online softmax in registers, head vectors spread over the lanes of any warp size (32,
// or 64 on CDNA); with the keys split over several blocks per query tile (decode over a long
// cache), each block's slice and the kernel that merges the slices. A header so that the host
// emulation of the GPU (tests/simt, ZAYA_SIMT) compiles the very same kernels, with 32- and
// 64-lane warps, and checks them without a GPU.
#pragma once

#include <cstdint>

#include "backend/cuda/attention_key_splits.h"
#include "backend/cuda/ops_attention_common.h"

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(ZAYA_SIMT)

namespace zaya::attention_fwd {

constexpr int kQueriesPerWarp = 4;

// Merges n partial online-softmax states of one query row (each: dh unnormalised output values,
// then the running max and sum, `stride` floats apart) into acc, m and l, in order: with M the
// largest max, acc = sum_j e^(m_j - M) acc_j and l = sum_j e^(m_j - M) l_j. A state that saw no
// key (sum 0) is left out; one that met a NaN score (sum NaN, its max finite or -inf) is not, so
// the NaN carries to the output as it does through one state.
__device__ inline void merge_partials(const float* parts, int64_t n, int64_t stride, int lane, int64_t dh,
                                      float (&acc)[kAttnMaxPerLane], float& m, float& l) {
  m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = fmaxf(m, parts[j * stride + dh]);
  l = 0.0f;
  for (int e = 0; e < kAttnMaxPerLane; ++e) acc[e] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float* part = parts + j * stride;
    if (part[dh + 1] == 0.0f) continue;  // saw no key
    const float w = expf(part[dh] - m);
    l += w * part[dh + 1];
    lane_axpy(acc, w, part, lane, dh);
  }
}

__global__ void k_attention(AttnParams p) {
  __shared__ float sk[kAttnKeyTile * kAttnMaxDh];
  __shared__ float sv[kAttnKeyTile * kAttnMaxDh];
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE, warp = int(threadIdx.x) / GPU_WARP_SIZE;
  const AttnQueryTile tile = attn_query_tile(p, kQueriesPerWarp);
  const int64_t b = tile.b, h = tile.h, g = tile.g, dh = p.dh;
  // A tile of at most kQueriesPerWarp queries (decode: one per sequence and head; or a chunk's
  // last tile) would leave every warp but the first without work: then every warp takes the same
  // queries and every kAttnWarps-th key of each staged tile, and the warps' states are merged at
  // the end through sk, which holds them all.
  static_assert(kAttnWarps * kQueriesPerWarp * (kAttnMaxDh + 2) <= kAttnKeyTile * kAttnMaxDh);
  const int64_t tile_queries = p.T - tile.t_begin < int64_t(kAttnWarps) * kQueriesPerWarp
                                   ? p.T - tile.t_begin
                                   : int64_t(kAttnWarps) * kQueriesPerWarp;
  const bool keys_over_warps = tile_queries <= kQueriesPerWarp;  // uniform across the block
  const int query_warp = keys_over_warps ? 0 : warp;             // whose queries this warp serves
  const int key_first = keys_over_warps ? warp : 0, key_step = keys_over_warps ? kAttnWarps : 1;

  float qr[kQueriesPerWarp][kAttnMaxPerLane], acc[kQueriesPerWarp][kAttnMaxPerLane];
  float m[kQueriesPerWarp], l[kQueriesPerWarp];
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = tile.t_begin + query_warp * kQueriesPerWarp + i;
    if (t < p.T) lane_load(qr[i], p.q + ((b * p.T + t) * p.Hq + h) * dh, lane, dh);
    for (int e = 0; e < kAttnMaxPerLane; ++e) acc[i][e] = 0.0f;
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  // This block's keys: the tile's, or its slice of them when the keys are split.
  const int64_t split = int64_t(blockIdx.x) % p.splits;
  const AttnKeySlice keys = attention_key_slice(tile.s_begin, tile.s_end, split, p.splits, kAttnKeyTile);
  for (int64_t s0 = keys.begin; s0 < keys.end; s0 += kAttnKeyTile) {
    const int64_t nk = keys.end - s0 < kAttnKeyTile ? keys.end - s0 : kAttnKeyTile;
    stage_rows(sk, p.k, b, p.S, p.Hkv, g, dh, s0, nk);
    stage_rows(sv, p.v, b, p.S, p.Hkv, g, dh, s0, nk);
    __syncthreads();
    for (int64_t j = key_first; j < nk; j += key_step) {
      for (int i = 0; i < kQueriesPerWarp; ++i) {
        const int64_t t = tile.t_begin + query_warp * kQueriesPerWarp + i;
        if (t >= p.T || !attn_visible(p, b, t, s0 + j)) continue;  // uniform across the warp
        const float sc = lane_dot(qr[i], sk + j * dh, lane, dh) * p.scale;
        if (sc == -INFINITY) continue;  // weight 0 (an infinite q or k), as on the CPU
        float w;
        if (sc > m[i]) {
          const float corr = expf(m[i] - sc);
          l[i] = l[i] * corr + 1.0f;
          for (int e = 0; e < kAttnMaxPerLane; ++e) acc[i][e] *= corr;
          m[i] = sc;
          w = 1.0f;
        } else {
          w = expf(sc - m[i]);
          l[i] += w;
        }
        lane_axpy(acc[i], w, sv + j * dh, lane, dh);
      }
    }
    __syncthreads();
  }
  if (keys_over_warps) {  // the warps' states of each query, through shared memory (sk is free)
    const int64_t stride = dh + 2;
    for (int i = 0; i < tile_queries; ++i) {
      float* state = sk + (int64_t(i) * kAttnWarps + warp) * stride;
      lane_store(acc[i], state, lane, dh);
      if (lane == 0) {
        state[dh] = m[i];
        state[dh + 1] = l[i];
      }
    }
    __syncthreads();
    if (warp != 0) return;  // no barrier follows
    for (int i = 0; i < tile_queries; ++i)
      merge_partials(sk + int64_t(i) * kAttnWarps * stride, kAttnWarps, stride, lane, dh, acc[i], m[i], l[i]);
  }
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = tile.t_begin + query_warp * kQueriesPerWarp + i;
    if (t >= p.T) continue;
    const int64_t row = (b * p.T + t) * p.Hq + h;
    if (p.splits > 1) {  // this slice's share, merged by k_attention_merge
      float* part = p.part + (row * p.splits + split) * (dh + 2);
      lane_store(acc[i], part, lane, dh);
      if (lane == 0) {
        part[dh] = m[i];
        part[dh + 1] = l[i];
      }
      continue;
    }
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    for (int e = 0; e < kAttnMaxPerLane; ++e) acc[i][e] *= inv;
    lane_store(acc[i], p.out + row * dh, lane, dh);
  }
}

// Merges the key slices of k_attention (p.splits > 1) into p.out, one warp per query row (a
// grid-stride loop over the rows), over the slices in order (so the result repeats bitwise):
// out = acc / l of merge_partials, and 0 for a row that saw no key.
__global__ void k_attention_merge(AttnParams p) {
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE;
  const int64_t rows = p.B * p.T * p.Hq, warps = int64_t(gridDim.x) * blockDim.x / GPU_WARP_SIZE;
  const int64_t dh = p.dh, stride = dh + 2;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / GPU_WARP_SIZE; row < rows; row += warps) {
    float acc[kAttnMaxPerLane], m, l;
    merge_partials(p.part + row * p.splits * stride, p.splits, stride, lane, dh, acc, m, l);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int e = 0; e < kAttnMaxPerLane; ++e) acc[e] *= inv;
    lane_store(acc, p.out + row * dh, lane, dh);
  }
}

}  // namespace zaya::attention_fwd

#endif
