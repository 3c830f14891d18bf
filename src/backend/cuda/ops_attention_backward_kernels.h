// The kernels of the CUDA-core causal GQA attention backward for short chunks
// (ops_attention_backward.cu launches them and describes them): dQ per query tile (with each
// row's log-sum-exp and D), dK/dV per key tile, head vectors spread over the lanes of any warp
// size. A header so that the host emulation of the GPU (tests/simt, ZAYA_SIMT) compiles the very
// same kernels, with 32- and 64-lane warps, and checks them without a GPU.
#pragma once

#include <cstdint>

#include "backend/cuda/ops_attention_common.h"

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(ZAYA_SIMT)

namespace zaya::attention_bwd {

constexpr int kQueriesPerWarp = 4;
constexpr int kKeysPerWarp = 4;

__global__ void k_attention_dq(AttnParams p) {
  __shared__ float sk[kAttnKeyTile * kAttnMaxDh];
  __shared__ float sv[kAttnKeyTile * kAttnMaxDh];
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE, warp = int(threadIdx.x) / GPU_WARP_SIZE;
  const AttnQueryTile tile = attn_query_tile(p, kQueriesPerWarp);
  const int64_t b = tile.b, h = tile.h, g = tile.g, dh = p.dh;

  float qr[kQueriesPerWarp][kAttnMaxPerLane], dor[kQueriesPerWarp][kAttnMaxPerLane];
  float dq[kQueriesPerWarp][kAttnMaxPerLane];
  float m[kQueriesPerWarp], l[kQueriesPerWarp], drow[kQueriesPerWarp];
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = tile.t_begin + warp * kQueriesPerWarp + i;
    for (int e = 0; e < kAttnMaxPerLane; ++e) dq[i][e] = 0.0f;
    m[i] = -INFINITY;
    l[i] = 0.0f;
    drow[i] = 0.0f;
    if (t >= p.T) continue;
    const int64_t row = ((b * p.T + t) * p.Hq + h) * dh;
    lane_load(qr[i], p.q + row, lane, dh);
    lane_load(dor[i], p.dout + row, lane, dh);
    float o[kAttnMaxPerLane];
    lane_load(o, p.o + row, lane, dh);
    float part = 0.0f;
    for (int e = 0; e < kAttnMaxPerLane; ++e) part += dor[i][e] * o[e];
    drow[i] = warp_sum(part);
  }
  // Pass 1: row log-sum-exp.
  for (int64_t s0 = tile.s_begin; s0 < tile.s_end; s0 += kAttnKeyTile) {
    const int64_t nk = tile.s_end - s0 < kAttnKeyTile ? tile.s_end - s0 : kAttnKeyTile;
    stage_rows(sk, p.k, b, p.S, p.Hkv, g, dh, s0, nk);
    __syncthreads();
    for (int64_t j = 0; j < nk; ++j)
      for (int i = 0; i < kQueriesPerWarp; ++i) {
        const int64_t t = tile.t_begin + warp * kQueriesPerWarp + i;
        if (t >= p.T || !attn_visible(p, b, t, s0 + j)) continue;
        const float sc = lane_dot(qr[i], sk + j * dh, lane, dh) * p.scale;
        if (sc > m[i]) {
          l[i] = l[i] * expf(m[i] - sc) + 1.0f;
          m[i] = sc;
        } else {
          l[i] += expf(sc - m[i]);
        }
      }
    __syncthreads();
  }
  float lse[kQueriesPerWarp];
  for (int i = 0; i < kQueriesPerWarp; ++i) lse[i] = m[i] + logf(l[i]);
  // Pass 2: dQ.
  for (int64_t s0 = tile.s_begin; s0 < tile.s_end; s0 += kAttnKeyTile) {
    const int64_t nk = tile.s_end - s0 < kAttnKeyTile ? tile.s_end - s0 : kAttnKeyTile;
    stage_rows(sk, p.k, b, p.S, p.Hkv, g, dh, s0, nk);
    stage_rows(sv, p.v, b, p.S, p.Hkv, g, dh, s0, nk);
    __syncthreads();
    for (int64_t j = 0; j < nk; ++j)
      for (int i = 0; i < kQueriesPerWarp; ++i) {
        const int64_t t = tile.t_begin + warp * kQueriesPerWarp + i;
        if (t >= p.T || !attn_visible(p, b, t, s0 + j)) continue;
        const float pr = expf(lane_dot(qr[i], sk + j * dh, lane, dh) * p.scale - lse[i]);
        const float dp = lane_dot(dor[i], sv + j * dh, lane, dh);
        const float ds = pr * (dp - drow[i]) * p.scale;
        lane_axpy(dq[i], ds, sk + j * dh, lane, dh);
      }
    __syncthreads();
  }
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = tile.t_begin + warp * kQueriesPerWarp + i;
    if (t >= p.T) continue;
    const int64_t r = (b * p.T + t) * p.Hq + h;
    lane_store(dq[i], p.dq + r * dh, lane, dh);
    if (lane == 0) {
      p.lse[r] = lse[i];
      p.drow[r] = drow[i];
    }
  }
}

__global__ void k_attention_dkdv(AttnParams p) {
  __shared__ float sq[kAttnQueryTile * kAttnMaxDh];
  __shared__ float sdo[kAttnQueryTile * kAttnMaxDh];
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE, warp = int(threadIdx.x) / GPU_WARP_SIZE;
  const int64_t b = blockIdx.z, g = blockIdx.y, rep = p.Hq / p.Hkv, dh = p.dh;
  const int64_t tile_k = int64_t(kAttnWarps) * kKeysPerWarp;
  const int64_t s_lo = int64_t(blockIdx.x) * tile_k;
  const int64_t s_hi = s_lo + tile_k < p.S ? s_lo + tile_k : p.S;  // exclusive
  // Queries (at positions pos0 + t) that can see any key of the tile: pos0 = 0 in training, the
  // chunk's start for a context-parallel chunk over its whole gathered sequence.
  const int64_t pos0 = p.pos0[b];
  const int64_t t_lo = s_lo - pos0 > 0 ? s_lo - pos0 : 0;
  int64_t t_hi = p.T;
  if (p.window > 0 && s_hi - 1 + p.window - pos0 < t_hi) t_hi = s_hi - 1 + p.window - pos0;

  float kr[kKeysPerWarp][kAttnMaxPerLane], vr[kKeysPerWarp][kAttnMaxPerLane];
  float dk[kKeysPerWarp][kAttnMaxPerLane], dv[kKeysPerWarp][kAttnMaxPerLane];
  for (int i = 0; i < kKeysPerWarp; ++i) {
    const int64_t s = s_lo + warp * kKeysPerWarp + i;
    for (int e = 0; e < kAttnMaxPerLane; ++e) {
      dk[i][e] = 0.0f;
      dv[i][e] = 0.0f;
      kr[i][e] = 0.0f;
      vr[i][e] = 0.0f;
    }
    if (s >= p.S) continue;
    lane_load(kr[i], p.k + ((b * p.S + s) * p.Hkv + g) * dh, lane, dh);
    lane_load(vr[i], p.v + ((b * p.S + s) * p.Hkv + g) * dh, lane, dh);
  }
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h)
    for (int64_t t0 = t_lo; t0 < t_hi; t0 += kAttnQueryTile) {
      const int64_t nq = t_hi - t0 < kAttnQueryTile ? t_hi - t0 : kAttnQueryTile;
      stage_rows(sq, p.q, b, p.T, p.Hq, h, dh, t0, nq);
      stage_rows(sdo, p.dout, b, p.T, p.Hq, h, dh, t0, nq);
      __syncthreads();
      for (int64_t j = 0; j < nq; ++j) {
        const int64_t t = t0 + j, r = (b * p.T + t) * p.Hq + h;
        for (int i = 0; i < kKeysPerWarp; ++i) {
          const int64_t s = s_lo + warp * kKeysPerWarp + i;
          if (s >= p.S || !attn_visible(p, b, t, s)) continue;  // uniform across the warp
          const float pr = expf(lane_dot(kr[i], sq + j * dh, lane, dh) * p.scale - p.lse[r]);
          const float dp = lane_dot(vr[i], sdo + j * dh, lane, dh);
          const float ds = pr * (dp - p.drow[r]) * p.scale;
          lane_axpy(dv[i], pr, sdo + j * dh, lane, dh);
          lane_axpy(dk[i], ds, sq + j * dh, lane, dh);
        }
      }
      __syncthreads();
    }
  for (int i = 0; i < kKeysPerWarp; ++i) {
    const int64_t s = s_lo + warp * kKeysPerWarp + i;
    if (s >= p.S) continue;
    lane_store(dk[i], p.dk + ((b * p.S + s) * p.Hkv + g) * dh, lane, dh);
    lane_store(dv[i], p.dv + ((b * p.S + s) * p.Hkv + g) * dh, lane, dh);
  }
}

}  // namespace zaya::attention_bwd

#endif
