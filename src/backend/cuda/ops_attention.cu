// GPU causal GQA attention over a KV cache, flash-style: one block per (query tile, head,
// sequence), key/value tiles staged in shared memory, an online softmax per query kept in
// registers by one warp, so memory is O(tile) rather than O(T^2). fp32 scores and softmax
// (CUDA cores). Supports per-sequence start positions (chunked prefill, decode), sliding windows
// and packed-document starts. Used for short chunks (decode); chunks of kAttnGemmMinQueries or
// more queries go through the GEMM engine (ops_attention_gemm.cu) or, when asked, the
// tensor-core flash kernel (ops_attention_flash_tc.cu).
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_attention_common.h"

namespace zaya {

namespace {

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

}  // namespace

void CudaBackend::attention(const AttentionArgs& a) {
  if (a.B * a.T == 0) return;
  if (a.T >= kAttnGemmMinQueries) return attention_flash_tc_applies(a) ? attention_flash_tc(a) : attention_gemm(a);
  DeviceBuffer pos0, seg;
  AttnParams p = attn_params(*this, a, warp_size_, "attention", pos0, seg);
  p.out = a.out;
  const int64_t tile_q = int64_t(kAttnWarps) * kQueriesPerWarp;
  dim3 grid(unsigned((a.T + tile_q - 1) / tile_q), unsigned(a.Hq), unsigned(a.B));
  k_attention<<<grid, unsigned(kAttnWarps * warp_size_), 0, stream_>>>(p);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
