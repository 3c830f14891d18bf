// The kernels of the tensor-core flash attention forward (ops_attention_flash_tc.cu launches
// them): the packing of fp32 rows into the per-head bf16 layout, and the forward itself (and its
// lse_only form for the backward). See that file for the algorithm. A header so that the host
// emulation of the GPU (tests/simt, ZAYA_SIMT) compiles the very same kernels and checks them
// against the CPU without a GPU. CUDA sm_80+ (or the emulation) only.
#pragma once

#include <cstdint>

#include "backend/cuda/ops_attention_flash_tc_common.h"

#if (defined(ZAYA_GPU_CUDA) && defined(__CUDACC__)) || defined(ZAYA_SIMT)

namespace zaya::flash_tc {

// The lse_only form stages no V, so its blocks leave that space to more blocks per SM.
template <int DH, bool kLseOnly = false>
struct ForwardLayout {
  static constexpr int kLd = DH + 8;  // bf16 row stride of every tile: conflict-free fragment loads
  static constexpr int kTile = kFlashKeys * kLd;
  static constexpr size_t q = 0;                                 // Q [64][kLd]
  static constexpr size_t k = q + size_t(kFlashRows) * kLd * 2;  // K [2][64][kLd]
  static constexpr size_t v = k + size_t(2) * kTile * 2;         // V [2][64][kLd] (none when lse_only)
  static constexpr size_t bytes = v + (kLseOnly ? 0 : size_t(2) * kTile * 2);
};

// Four elements a thread: dh is a multiple of 4, so a float4 never crosses a row.
__global__ void k_pack_rows(const float* src, bf16_t* dst, int64_t B, int64_t rows, int64_t rows_pad, int64_t H,
                            int64_t dh, const int64_t* pos0, int64_t chunk) {
  const int64_t n = B * H * rows_pad * dh / 4;
  for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = x * 4, d = e % dh, r = (e / dh) % rows_pad, bh = e / (dh * rows_pad);
    const int64_t h = bh % H, b = bh / H;
    int64_t valid = rows;
    if (pos0 && pos0[b] + chunk < valid) valid = pos0[b] + chunk;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < valid) v = *reinterpret_cast<const float4*>(src + ((b * rows + r) * H + h) * dh + d);
    uint32_t* out = reinterpret_cast<uint32_t*>(dst + e);
    out[0] = mma::pack_bf16x2(v.x, v.y);
    out[1] = mma::pack_bf16x2(v.z, v.w);
  }
}

template <int DH, bool kLseOnly>
__global__ void __launch_bounds__(kFlashThreads) k_flash_forward(FlashParams fp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // mma.sync bf16 needs sm_80; the backend takes this path only where the device has it
#else
  using L = ForwardLayout<DH, kLseOnly>;
  constexpr int kLd = L::kLd;
  ZAYA_DYNAMIC_SHARED(smem);
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem + L::q);
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
  auto stage = [&](int buf, int64_t s0) {
    flash_stage_rows<DH>(Ks + buf * L::kTile, kg + s0 * DH, kFlashKeys);
    if constexpr (!kLseOnly) flash_stage_rows<DH>(Vs + buf * L::kTile, vg + s0 * DH, kFlashKeys);
  };
  if (n_tiles > 0) stage(0, tile0);
  mma::cp_async_commit();

  // Q: the block's 64 rows of head h rounded to bf16 (rows past the chunk are zero), then each
  // warp's 16 rows as A fragments for the whole loop.
  for (int i = int(threadIdx.x); i < kFlashRows * DH / 4; i += kFlashThreads) {
    const int r = i / (DH / 4), d = (i % (DH / 4)) * 4;
    const int64_t t = t_begin + r;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < p.T) x = *reinterpret_cast<const float4*>(p.q + ((b * p.T + t) * p.Hq + h) * DH + d);
    uint32_t* dst = reinterpret_cast<uint32_t*>(Qs + r * kLd + d);
    dst[0] = mma::pack_bf16x2(x.x, x.y);
    dst[1] = mma::pack_bf16x2(x.z, x.w);
  }
  __syncthreads();
  uint32_t qf[DH / 16][4];
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) mma::load_a(qf[kk], Qs, kLd, 16 * warp, 16 * kk, lane);

  // This lane's two rows: lo = 16 warp + group, hi = lo + 8.
  const int64_t t_lo = t_begin + 16 * warp + gq, t_hi = t_lo + 8;
  const FlashRow row_lo = flash_row(p, b, t_lo), row_hi = flash_row(p, b, t_hi);
  const int window = int(p.window);
  float o[DH / 8][4];
#pragma unroll
  for (int nd = 0; nd < DH / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // l: this lane's share of the row sum

  for (int it = 0; it < n_tiles; ++it) {
    const int64_t s0 = tile0 + int64_t(it) * kFlashKeys;
    if (it + 1 < n_tiles) stage((it + 1) & 1, s0 + kFlashKeys);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();  // this tile's copies have landed (the next tile's may be in flight)
    __syncthreads();
    const bf16_t* Kt = Ks + (it & 1) * L::kTile;
    const bf16_t* Vt = Vs + (it & 1) * L::kTile;
    float sc[kFlashKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kFlashKeys / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk)
#pragma unroll
      for (int n = 0; n < kFlashKeys / 8; ++n) {
        uint32_t bk[2];
        mma::load_b(bk, Kt, kLd, 8 * n, 16 * kk, lane);
        mma::mma_16816(sc[n], qf[kk], bk);
      }
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < kFlashKeys / 8; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int s = int(s0) + 8 * n + 2 * qd + j;
        sc[n][j] = flash_visible(row_lo, s, window) ? sc[n][j] * fp.scale_log2 : -INFINITY;
        sc[n][2 + j] = flash_visible(row_hi, s, window) ? sc[n][2 + j] * fp.scale_log2 : -INFINITY;
        mx_lo = fmaxf(mx_lo, sc[n][j]);
        mx_hi = fmaxf(mx_hi, sc[n][2 + j]);
      }
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
    const float new_lo = fmaxf(m_lo, mx_lo), new_hi = fmaxf(m_hi, mx_hi);
    // A row with nothing visible yet keeps base 0: its terms 2^-inf are 0 and alpha is 0, never NaN.
    const float base_lo = new_lo == -INFINITY ? 0.0f : new_lo, base_hi = new_hi == -INFINITY ? 0.0f : new_hi;
    const float alpha_lo = exp2f(m_lo - base_lo), alpha_hi = exp2f(m_hi - base_hi);
    m_lo = new_lo;
    m_hi = new_hi;
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int n = 0; n < kFlashKeys / 8; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sc[n][j] = exp2f(sc[n][j] - base_lo);
        sc[n][2 + j] = exp2f(sc[n][2 + j] - base_hi);
        sum_lo += sc[n][j];
        sum_hi += sc[n][2 + j];
      }
    l_lo = l_lo * alpha_lo + sum_lo;
    l_hi = l_hi * alpha_hi + sum_hi;
    if constexpr (!kLseOnly) {
#pragma unroll
      for (int nd = 0; nd < DH / 8; ++nd) {
        o[nd][0] *= alpha_lo;
        o[nd][1] *= alpha_lo;
        o[nd][2] *= alpha_hi;
        o[nd][3] *= alpha_hi;
      }
      // P's C fragments of key columns 16 kk .. 16 kk + 15 are exactly the A fragment of that k-step.
#pragma unroll
      for (int kk = 0; kk < kFlashKeys / 16; ++kk) {
        uint32_t pa[4];
        mma::c_to_a(pa, sc, kk);
        mma::mma_rows(o, pa, Vt, kLd, 16 * kk, lane);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
  }
  mma::cp_async_wait<0>();
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
  if constexpr (!kLseOnly) {
    const float inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f, inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
    float* out_lo = p.out + ((b * p.T + t_lo) * p.Hq + h) * DH + 2 * qd;
    float* out_hi = p.out + ((b * p.T + t_hi) * p.Hq + h) * DH + 2 * qd;
#pragma unroll
    for (int nd = 0; nd < DH / 8; ++nd) {
      if (t_lo < p.T) *reinterpret_cast<float2*>(out_lo + 8 * nd) = make_float2(o[nd][0] * inv_lo, o[nd][1] * inv_lo);
      if (t_hi < p.T) *reinterpret_cast<float2*>(out_hi + 8 * nd) = make_float2(o[nd][2] * inv_hi, o[nd][3] * inv_hi);
    }
  }
  if (fp.lse2 && qd == 0) {
    float* lse = fp.lse2 + (b * p.Hq + h) * fp.T_pad;
    if (t_lo < p.T) lse[t_lo] = m_lo + log2f(l_lo);
    if (t_hi < p.T) lse[t_hi] = m_hi + log2f(l_hi);
  }
#endif
}

}  // namespace zaya::flash_tc

#endif
