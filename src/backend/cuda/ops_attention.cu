// GPU causal GQA attention over a KV cache, flash-style: one block per (query tile, head,
// sequence), key/value tiles staged in shared memory, an online softmax per query kept in
// registers by one warp, so memory is O(tile) rather than O(T^2). fp32 scores and softmax
// (CUDA cores; a tensor-core version is future work). Supports per-sequence start positions
// (chunked prefill, decode), sliding windows and packed-document starts. Not yet run on a GPU.
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
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (p.Hq / p.Hkv), dh = p.dh;
  const int64_t tile_q = int64_t(kAttnWarps) * kQueriesPerWarp;
  const int64_t t_begin = int64_t(blockIdx.x) * tile_q;
  const int64_t t_end = t_begin + tile_q < p.T ? t_begin + tile_q : p.T;
  const int64_t p_first = p.pos0[b] + t_begin, p_last = p.pos0[b] + t_end - 1;
  int64_t s_begin = p.window > 0 ? (p_first - p.window + 1 > 0 ? p_first - p.window + 1 : 0) : 0;
  if (p.seg) s_begin = s_begin > p.seg[b * p.T + t_begin] ? s_begin : p.seg[b * p.T + t_begin];
  const int64_t s_end = p_last + 1;

  float qr[kQueriesPerWarp][kAttnMaxPerLane], acc[kQueriesPerWarp][kAttnMaxPerLane];
  float m[kQueriesPerWarp], l[kQueriesPerWarp];
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = t_begin + warp * kQueriesPerWarp + i;
    if (t < p.T) lane_load(qr[i], p.q + ((b * p.T + t) * p.Hq + h) * dh, lane, dh);
    for (int e = 0; e < kAttnMaxPerLane; ++e) acc[i][e] = 0.0f;
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  for (int64_t s0 = s_begin; s0 < s_end; s0 += kAttnKeyTile) {
    const int64_t nk = s_end - s0 < kAttnKeyTile ? s_end - s0 : kAttnKeyTile;
    stage_rows(sk, p.k, b, p.S, p.Hkv, g, dh, s0, nk);
    stage_rows(sv, p.v, b, p.S, p.Hkv, g, dh, s0, nk);
    __syncthreads();
    for (int64_t j = 0; j < nk; ++j) {
      for (int i = 0; i < kQueriesPerWarp; ++i) {
        const int64_t t = t_begin + warp * kQueriesPerWarp + i;
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
        for (int e = 0; e < kAttnMaxPerLane; ++e) {
          const int64_t d = lane + int64_t(e) * GPU_WARP_SIZE;
          if (d < dh) acc[i][e] += w * sv[j * dh + d];
        }
      }
    }
    __syncthreads();
  }
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = t_begin + warp * kQueriesPerWarp + i;
    if (t >= p.T) continue;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    for (int e = 0; e < kAttnMaxPerLane; ++e) acc[i][e] *= inv;
    lane_store(acc[i], p.out + ((b * p.T + t) * p.Hq + h) * dh, lane, dh);
  }
}

}  // namespace

void CudaBackend::attention(const AttentionArgs& a) {
  if (a.B * a.T == 0) return;
  if (a.dh > kAttnMaxDh || a.dh > int64_t(kAttnMaxPerLane) * warp_size_)
    fail("cuda", "attention: head_dim " + std::to_string(a.dh) + " is not supported (at most 128)");
  DeviceBuffer pos0 = upload(a.pos0, a.B * 8);
  DeviceBuffer seg;
  if (a.seg_start) seg = upload(a.seg_start, a.B * a.T * 4);
  AttnParams p;
  p.q = a.q; p.k = a.k_cache; p.v = a.v_cache; p.out = a.out; p.pos0 = pos0.l();
  p.seg = a.seg_start ? seg.i() : nullptr;
  p.B = a.B; p.T = a.T; p.S = a.S; p.Hq = a.Hq; p.Hkv = a.Hkv; p.dh = a.dh; p.window = a.window; p.scale = a.scale;
  const int64_t tile_q = int64_t(kAttnWarps) * kQueriesPerWarp;
  dim3 grid(unsigned((a.T + tile_q - 1) / tile_q), unsigned(a.Hq), unsigned(a.B));
  k_attention<<<grid, unsigned(kAttnWarps * warp_size_), 0, stream_>>>(p);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
