// The kernels of the tensor-core flash attention backward (ops_attention_flash_tc_backward.cu
// launches them, and has the algorithm): D = rowsum(dO * O), dQ, and dK/dV. A header so that the
// host emulation of the GPU (tests/simt, ZAYA_SIMT) compiles the very same kernels and checks
// them against the CPU without a GPU. CUDA sm_80+ (or the emulation) only.
#pragma once

#include <cstdint>

#include "backend/cuda/ops_attention_flash_tc_common.h"

#if (defined(ZAYA_GPU_CUDA) && defined(__CUDACC__)) || defined(ZAYA_SIMT)

namespace zaya::flash_tc {

// drow[(b * Hq + h) * T_pad + t] = sum_d bf16(dout[r, d]) * o[r, d] for r = (b * T + t) * Hq + h:
// one warp per row. dout rounded as the dP = dO V^T products see it, so that D = sum_j P dP there.
__global__ void k_flash_drow(const float* dout, const float* o, float* drow, int64_t B, int64_t T, int64_t Hq,
                             int64_t dh, int64_t T_pad) {
  const int64_t rows = B * T * Hq, warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int lane = int(threadIdx.x) % 32;
  for (int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    float s = 0.0f;
    for (int64_t d = lane; d < dh; d += 32) s += bf16_to_f32(f32_to_bf16(dout[r * dh + d])) * o[r * dh + d];
    s = warp_sum(s);
    if (lane == 0) {
      const int64_t h = r % Hq, t = (r / Hq) % T, b = r / (Hq * T);
      drow[(b * Hq + h) * T_pad + t] = s;
    }
  }
}

template <int DH>
struct DqLayout {
  static constexpr int kLd = DH + 8;
  static constexpr int kTile = kFlashKeys * kLd;
  static constexpr size_t q = 0;                                  // Q  [64][kLd]
  static constexpr size_t dout = q + size_t(kFlashRows) * kLd * 2;  // dO [64][kLd]
  static constexpr size_t k = dout + size_t(kFlashRows) * kLd * 2;  // K  [2][64][kLd]
  static constexpr size_t v = k + size_t(2) * kTile * 2;          // V  [2][64][kLd]
  static constexpr size_t bytes = v + size_t(2) * kTile * 2;
};

template <int DH>
struct DkvLayout {
  static constexpr int kLd = DH + 8;
  static constexpr int kQTile = kFlashDkvQueries * kLd;
  static constexpr size_t k = 0;                                    // K  [64][kLd], the block's keys
  static constexpr size_t v = k + size_t(kFlashKeys) * kLd * 2;     // V  [64][kLd]
  static constexpr size_t q = v + size_t(kFlashKeys) * kLd * 2;     // Q  [2][32][kLd]
  static constexpr size_t dout = q + size_t(2) * kQTile * 2;        // dO [2][32][kLd]
  // Per query of the tile: lse2, D, position (-1 past the chunk) and document start [2][4][32].
  static constexpr size_t stats = dout + size_t(2) * kQTile * 2;
  static constexpr size_t bytes = stats + size_t(2) * 4 * kFlashDkvQueries * 4;
};

template <int DH>
__global__ void __launch_bounds__(kFlashThreads) k_flash_dq(FlashParams fp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = DqLayout<DH>;
  constexpr int kLd = L::kLd;
  ZAYA_DYNAMIC_SHARED(smem);
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem + L::q);
  bf16_t* dOs = reinterpret_cast<bf16_t*>(smem + L::dout);
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem + L::k);
  bf16_t* Vs = reinterpret_cast<bf16_t*>(smem + L::v);
  const AttnParams& p = fp.a;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int gq = mma::group_of(lane), qd = mma::quad_of(lane);
  const FlashQueryBlock blk = flash_query_block(p);
  const int64_t b = blk.b, h = blk.h, g = blk.g, t_begin = blk.t_begin, tile0 = blk.tile0;
  const int n_tiles = blk.n_tiles;
  const bf16_t* kg = fp.k + (b * p.Hkv + g) * fp.S_pad * DH;
  const bf16_t* vg = fp.v + (b * p.Hkv + g) * fp.S_pad * DH;
  const int64_t row0 = (b * p.Hq + h) * fp.T_pad;  // this head's rows in the packed and statistics layouts
  auto stage = [&](int buf, int64_t s0) {
    flash_stage_rows<DH>(Ks + buf * L::kTile, kg + s0 * DH, kFlashKeys);
    flash_stage_rows<DH>(Vs + buf * L::kTile, vg + s0 * DH, kFlashKeys);
  };
  flash_stage_rows<DH>(Qs, fp.q + (row0 + t_begin) * DH, kFlashRows);
  flash_stage_rows<DH>(dOs, fp.dout + (row0 + t_begin) * DH, kFlashRows);
  stage(0, tile0);
  mma::cp_async_commit();

  const int64_t t_lo = t_begin + 16 * warp + gq, t_hi = t_lo + 8;
  const FlashRow row_lo = flash_row(p, b, t_lo), row_hi = flash_row(p, b, t_hi);
  const float lse_lo = t_lo < p.T ? fp.lse2[row0 + t_lo] : 0.0f, lse_hi = t_hi < p.T ? fp.lse2[row0 + t_hi] : 0.0f;
  const float d_lo = t_lo < p.T ? fp.drow[row0 + t_lo] : 0.0f, d_hi = t_hi < p.T ? fp.drow[row0 + t_hi] : 0.0f;
  const int window = int(p.window);
  float dq[DH / 8][4];
#pragma unroll
  for (int nd = 0; nd < DH / 8; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;

  for (int it = 0; it < n_tiles; ++it) {
    const int64_t s0 = tile0 + int64_t(it) * kFlashKeys;
    if (it + 1 < n_tiles) stage((it + 1) & 1, s0 + kFlashKeys);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
    __syncthreads();
    const bf16_t* Kt = Ks + (it & 1) * L::kTile;
    const bf16_t* Vt = Vs + (it & 1) * L::kTile;
    float sc[kFlashKeys / 8][4], dp[kFlashKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kFlashKeys / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) sc[n][c] = dp[n][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk) {
      uint32_t qa[4], da[4];
      mma::load_a(qa, Qs, kLd, 16 * warp, 16 * kk, lane);
      mma::load_a(da, dOs, kLd, 16 * warp, 16 * kk, lane);
#pragma unroll
      for (int n = 0; n < kFlashKeys / 8; ++n) {
        uint32_t bk[2], bv[2];
        mma::load_b(bk, Kt, kLd, 8 * n, 16 * kk, lane);
        mma::mma_16816(sc[n], qa, bk);  // S = Q K^T
        mma::load_b(bv, Vt, kLd, 8 * n, 16 * kk, lane);
        mma::mma_16816(dp[n], da, bv);  // dP = dO V^T
      }
    }
    // dS = scale P (dP - D) in place of S; P = 0 off the visible keys.
#pragma unroll
    for (int n = 0; n < kFlashKeys / 8; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int s = int(s0) + 8 * n + 2 * qd + j;
        const float p_lo = flash_visible(row_lo, s, window) ? exp2f(sc[n][j] * fp.scale_log2 - lse_lo) : 0.0f;
        const float p_hi = flash_visible(row_hi, s, window) ? exp2f(sc[n][2 + j] * fp.scale_log2 - lse_hi) : 0.0f;
        sc[n][j] = p.scale * p_lo * (dp[n][j] - d_lo);
        sc[n][2 + j] = p.scale * p_hi * (dp[n][2 + j] - d_hi);
      }
    // dQ += dS K: K's rows are B's rows here (k = the key), read through the transposing load.
#pragma unroll
    for (int kk = 0; kk < kFlashKeys / 16; ++kk) {
      uint32_t dsa[4];
      mma::c_to_a(dsa, sc, kk);
      mma::mma_rows(dq, dsa, Kt, kLd, 16 * kk, lane);
    }
    __syncthreads();
  }
  mma::cp_async_wait<0>();
  float* dq_lo = p.dq + ((b * p.T + t_lo) * p.Hq + h) * DH + 2 * qd;
  float* dq_hi = p.dq + ((b * p.T + t_hi) * p.Hq + h) * DH + 2 * qd;
#pragma unroll
  for (int nd = 0; nd < DH / 8; ++nd) {
    if (t_lo < p.T) *reinterpret_cast<float2*>(dq_lo + 8 * nd) = make_float2(dq[nd][0], dq[nd][1]);
    if (t_hi < p.T) *reinterpret_cast<float2*>(dq_hi + 8 * nd) = make_float2(dq[nd][2], dq[nd][3]);
  }
#endif
}

template <int DH>
__global__ void __launch_bounds__(kFlashThreads) k_flash_dkdv(FlashParams fp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = DkvLayout<DH>;
  constexpr int kLd = L::kLd;
  constexpr int kQ = kFlashDkvQueries;
  ZAYA_DYNAMIC_SHARED(smem);
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem + L::k);
  bf16_t* Vs = reinterpret_cast<bf16_t*>(smem + L::v);
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem + L::q);
  bf16_t* dOs = reinterpret_cast<bf16_t*>(smem + L::dout);
  float* stats = reinterpret_cast<float*>(smem + L::stats);
  const AttnParams& p = fp.a;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int gq = mma::group_of(lane), qd = mma::quad_of(lane);
  const int64_t b = blockIdx.z, g = blockIdx.y, rep = p.Hq / p.Hkv;
  const int64_t s_lo = int64_t(blockIdx.x) * kFlashKeys;
  const int64_t s_hi = s_lo + kFlashKeys < p.S ? s_lo + kFlashKeys : p.S;  // exclusive
  // The query tiles holding every query that may see a key of the tile.
  const FlashQueryTiles queries = flash_query_tiles(p.pos0[b], p.T, p.window, s_lo, s_hi, kQ);
  const int64_t qt0 = queries.t0, n_qt = queries.n_tiles;
  const int n_iter = int(rep * n_qt);
  // Query tile i: head hh, queries t0..t0+31, and its first row in the packed layouts.
  auto tile_row = [&](int i) { return (b * p.Hq + g * rep + i / n_qt) * fp.T_pad + qt0 + (i % n_qt) * kQ; };
  // Q and dO of tile i, asynchronously.
  auto stage = [&](int buf, int i) {
    const int64_t row = tile_row(i);
    flash_stage_rows<DH>(Qs + buf * L::kQTile, fp.q + row * DH, kQ);
    flash_stage_rows<DH>(dOs + buf * L::kQTile, fp.dout + row * DH, kQ);
  };
  // Each query's lse2, D, position and document start (threads 0..31, one query each): loaded
  // into registers a tile ahead, stored to shared memory after this tile's products, read after
  // the next barrier (so the loads' latency hides behind the products).
  struct QueryStats {
    float lse = 0.0f, drow = 0.0f;
    FlashRow row;
  };
  auto load_stats = [&](int i) {
    QueryStats q;
    const int64_t row = tile_row(i), t = row % fp.T_pad + threadIdx.x;
    if (threadIdx.x < kQ && t < p.T) {
      q.lse = fp.lse2[row + threadIdx.x];
      q.drow = fp.drow[row + threadIdx.x];
      q.row = flash_row(p, b, t);
    }
    return q;
  };
  auto store_stats = [&](int buf, const QueryStats& q) {
    if (threadIdx.x >= kQ) return;
    float* q_stats = stats + buf * 4 * kQ;
    q_stats[threadIdx.x] = q.lse;
    q_stats[kQ + threadIdx.x] = q.drow;
    reinterpret_cast<int*>(q_stats)[2 * kQ + threadIdx.x] = q.row.pos;
    reinterpret_cast<int*>(q_stats)[3 * kQ + threadIdx.x] = q.row.seg;
  };
  const bf16_t* kg = fp.k + ((b * p.Hkv + g) * fp.S_pad + s_lo) * DH;
  const bf16_t* vg = fp.v + ((b * p.Hkv + g) * fp.S_pad + s_lo) * DH;
  if (n_iter > 0) {  // a tile no query sees only writes zeros
    flash_stage_rows<DH>(Ks, kg, kFlashKeys);
    flash_stage_rows<DH>(Vs, vg, kFlashKeys);
    stage(0, 0);
    store_stats(0, load_stats(0));
  }
  mma::cp_async_commit();

  // This lane's two keys (rows of S^T): a = 16 warp + group, b = a + 8.
  const int s_a = int(s_lo) + 16 * warp + gq, s_b = s_a + 8;
  const int window = int(p.window);
  float dk[DH / 8][4], dv[DH / 8][4];
#pragma unroll
  for (int nd = 0; nd < DH / 8; ++nd)
#pragma unroll
    for (int c = 0; c < 4; ++c) dk[nd][c] = dv[nd][c] = 0.0f;

  for (int it = 0; it < n_iter; ++it) {
    QueryStats next;
    if (it + 1 < n_iter) {
      stage((it + 1) & 1, it + 1);
      next = load_stats(it + 1);
    }
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
    __syncthreads();
    const float* st_lse = stats + (it & 1) * 4 * kQ;
    const float* st_drow = st_lse + kQ;
    const int* st_pos = reinterpret_cast<const int*>(st_lse) + 2 * kQ;
    const int* st_seg = st_pos + kQ;
    const bf16_t* Qt = Qs + (it & 1) * L::kQTile;
    const bf16_t* dOt = dOs + (it & 1) * L::kQTile;
    float st[kQ / 8][4], dpt[kQ / 8][4];
#pragma unroll
    for (int n = 0; n < kQ / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) st[n][c] = dpt[n][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk) {
      uint32_t ka[4], va[4];
      mma::load_a(ka, Ks, kLd, 16 * warp, 16 * kk, lane);
      mma::load_a(va, Vs, kLd, 16 * warp, 16 * kk, lane);
#pragma unroll
      for (int n = 0; n < kQ / 8; ++n) {
        uint32_t bq[2], bo[2];
        mma::load_b(bq, Qt, kLd, 8 * n, 16 * kk, lane);
        mma::mma_16816(st[n], ka, bq);  // S^T = K Q^T
        mma::load_b(bo, dOt, kLd, 8 * n, 16 * kk, lane);
        mma::mma_16816(dpt[n], va, bo);  // dP^T = V dO^T
      }
    }
    // Column t of S^T is query t: P^T = 2^(x - lse2[t]) where visible, dS^T = scale P^T (dP^T - D[t]).
#pragma unroll
    for (int n = 0; n < kQ / 8; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tl = 8 * n + 2 * qd + j;  // the query's place in the tile
        FlashRow r;
        r.pos = st_pos[tl];
        r.seg = st_seg[tl];
        const float lse = st_lse[tl], dr = st_drow[tl];
        const float pa = flash_visible(r, s_a, window) ? exp2f(st[n][j] * fp.scale_log2 - lse) : 0.0f;
        const float pb = flash_visible(r, s_b, window) ? exp2f(st[n][2 + j] * fp.scale_log2 - lse) : 0.0f;
        st[n][j] = pa;
        st[n][2 + j] = pb;
        dpt[n][j] = p.scale * pa * (dpt[n][j] - dr);
        dpt[n][2 + j] = p.scale * pb * (dpt[n][2 + j] - dr);
      }
    // dV += P^T dO and dK += dS^T Q: the queries are the k dimension; dO and Q rows are B's rows.
#pragma unroll
    for (int kk = 0; kk < kQ / 16; ++kk) {
      uint32_t pa[4], dsa[4];
      mma::c_to_a(pa, st, kk);
      mma::c_to_a(dsa, dpt, kk);
      mma::mma_rows(dv, pa, dOt, kLd, 16 * kk, lane);
      mma::mma_rows(dk, dsa, Qt, kLd, 16 * kk, lane);
    }
    if (it + 1 < n_iter) store_stats((it + 1) & 1, next);  // that buffer was last read at it - 1
    __syncthreads();
  }
  mma::cp_async_wait<0>();  // no copy outstanding at exit (the last group is empty)
  const int64_t ld = p.Hkv * DH;
  float* dk_a = p.dk + (b * p.S + s_a) * ld + g * DH + 2 * qd;
  float* dv_a = p.dv + (b * p.S + s_a) * ld + g * DH + 2 * qd;
#pragma unroll
  for (int nd = 0; nd < DH / 8; ++nd) {
    if (s_a < s_hi) {
      *reinterpret_cast<float2*>(dk_a + 8 * nd) = make_float2(dk[nd][0], dk[nd][1]);
      *reinterpret_cast<float2*>(dv_a + 8 * nd) = make_float2(dv[nd][0], dv[nd][1]);
    }
    if (s_b < s_hi) {
      *reinterpret_cast<float2*>(dk_a + 8 * ld + 8 * nd) = make_float2(dk[nd][2], dk[nd][3]);
      *reinterpret_cast<float2*>(dv_a + 8 * ld + 8 * nd) = make_float2(dv[nd][2], dv[nd][3]);
    }
  }
#endif
}

}  // namespace zaya::flash_tc

#endif
