// The kernel of the CUDA-core causal GQA attention forward for short chunks (ops_attention.cu
// launches it and describes it): one warp per kQueriesPerWarp queries, K/V tiles in shared
// memory, an online softmax in registers, head vectors spread over the lanes of any warp size (32,
// or 64 on CDNA). A header so that the host emulation of the GPU (tests/simt, ZAYA_SIMT) compiles
// the very same kernel, with 32- and 64-lane warps, and checks it without a GPU.
#pragma once

#include <cstdint>

#include "backend/cuda/ops_attention_common.h"

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(ZAYA_SIMT)

namespace zaya::attention_fwd {

constexpr int kQueriesPerWarp = 4;

__global__ void k_attention(AttnParams p) {
  __shared__ float sk[kAttnKeyTile * kAttnMaxDh];
  __shared__ float sv[kAttnKeyTile * kAttnMaxDh];
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE, warp = int(threadIdx.x) / GPU_WARP_SIZE;
  const AttnQueryTile tile = attn_query_tile(p, kQueriesPerWarp);
  const int64_t b = tile.b, h = tile.h, g = tile.g, dh = p.dh;

  float qr[kQueriesPerWarp][kAttnMaxPerLane], acc[kQueriesPerWarp][kAttnMaxPerLane];
  float m[kQueriesPerWarp], l[kQueriesPerWarp];
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = tile.t_begin + warp * kQueriesPerWarp + i;
    if (t < p.T) lane_load(qr[i], p.q + ((b * p.T + t) * p.Hq + h) * dh, lane, dh);
    for (int e = 0; e < kAttnMaxPerLane; ++e) acc[i][e] = 0.0f;
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  for (int64_t s0 = tile.s_begin; s0 < tile.s_end; s0 += kAttnKeyTile) {
    const int64_t nk = tile.s_end - s0 < kAttnKeyTile ? tile.s_end - s0 : kAttnKeyTile;
    stage_rows(sk, p.k, b, p.S, p.Hkv, g, dh, s0, nk);
    stage_rows(sv, p.v, b, p.S, p.Hkv, g, dh, s0, nk);
    __syncthreads();
    for (int64_t j = 0; j < nk; ++j) {
      for (int i = 0; i < kQueriesPerWarp; ++i) {
        const int64_t t = tile.t_begin + warp * kQueriesPerWarp + i;
        if (t >= p.T || !attn_visible(p, b, t, s0 + j)) continue;  // uniform across the warp
        const float sc = lane_dot(qr[i], sk + j * dh, lane, dh) * p.scale;
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
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = tile.t_begin + warp * kQueriesPerWarp + i;
    if (t >= p.T) continue;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    for (int e = 0; e < kAttnMaxPerLane; ++e) acc[i][e] *= inv;
    lane_store(acc[i], p.out + ((b * p.T + t) * p.Hq + h) * dh, lane, dh);
  }
}

}  // namespace zaya::attention_fwd

#endif
