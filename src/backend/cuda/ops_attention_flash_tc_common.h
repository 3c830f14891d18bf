// Shared by the tensor-core flash attention kernels (ops_attention_flash_tc.cu, forward and
// row statistics; ops_attention_flash_tc_backward.cu, dQ and dK/dV): the packed bf16 operands
// they read, their tile sizes, the per-row visibility rule in registers, and the asynchronous
// staging of packed rows into shared memory. CUDA sm_80+ (or the host emulation, tests/simt) only.
//
// Packed operands: Q, K, V and dO are converted to bf16 once per call into a per-head layout
// [B, H, rows_pad, dh] (rows_pad a multiple of 64, zero past the real rows), so every tile is
// one contiguous block the kernels copy with cp.async, 16 bytes a thread.
// Softmax statistics are kept in base 2: with x = scale * log2(e) * (q . k), a row's
// lse2 = log2 sum_visible 2^x, and P = 2^(x - lse2) equals softmax(scale * q . k).
#pragma once

#include <cstdint>

#include "backend/cuda/flash_ranges.h"
#include "backend/cuda/gpu_device.h"
#include "backend/cuda/gpu_mma.h"
#include "backend/cuda/ops_attention_common.h"

namespace zaya {

constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = kFlashWarps * 32;
constexpr int kFlashRows = 64;      // query rows per block (16 per warp) in the forward and dQ kernels
constexpr int kFlashKeys = 64;      // key rows per block tile (16 per warp in the dK/dV kernel)
constexpr int kFlashDkvQueries = 32;  // query rows per step of the dK/dV kernel (registers bound it)
constexpr int64_t kFlashPad = 64;   // packed row counts are rounded up to this

inline int64_t flash_padded(int64_t rows) { return (rows + kFlashPad - 1) / kFlashPad * kFlashPad; }

struct FlashParams {
  AttnParams a;  // fp32 q (the forward stages it itself), out, dq/dk/dv, pos0, seg, shapes, scale
  const bf16_t* q = nullptr;     // [B, Hq, T_pad, dh] packed (backward)
  const bf16_t* k = nullptr;     // [B, Hkv, S_pad, dh] packed
  const bf16_t* v = nullptr;     // [B, Hkv, S_pad, dh] packed
  const bf16_t* dout = nullptr;  // [B, Hq, T_pad, dh] packed (backward)
  float* lse2 = nullptr;         // [B, Hq, T_pad] base-2 row log-sum-exp (written by the forward when set)
  float* drow = nullptr;         // [B, Hq, T_pad] rowsum(dO * O) (backward)
  int64_t T_pad = 0, S_pad = 0;
  float scale_log2 = 0.0f;       // scale * log2(e)
};

// dst[((b * H + h) * rows_pad + r) * dh + d] = bf16(src[((b * rows + r) * H + h) * dh + d]) for
// the rows r < valid(b), zero for the others: valid(b) = rows, or min(rows, pos0[b] + chunk) when
// pos0 (device) is given, which keeps a KV cache's unwritten rows (any bit pattern, NaN
// included) out of the products. dh a multiple of 4.
void flash_pack_rows(gpuStream_t s, const float* src, bf16_t* dst, int64_t B, int64_t rows, int64_t rows_pad,
                     int64_t H, int64_t dh, const int64_t* pos0 = nullptr, int64_t chunk = 0);

// What the forward and the backward both set up for one call: the kernel parameters of `a`
// (pos0 and seg uploaded), the scale in base 2, and K and V packed to bf16 (each sequence's
// cache rows past its chunk zeroed). The buffers live as long as the object. CUDA only.
struct FlashCall {
  DeviceBuffer pos0, seg, k, v;
  FlashParams fp;
  FlashCall(CudaBackend& be, const AttentionArgs& a, const char* op);
};

// Dynamic shared memory per block of the forward kernel and of the larger backward kernel for
// head_dim dh (64 or 128).
size_t flash_forward_smem_bytes(int64_t dh);
size_t flash_backward_smem_bytes(int64_t dh);

// The forward over the packed K and V of `p`: writes p.a.out (unless lse_only) and p.lse2 (when
// set). head_dim 64 or 128.
void flash_forward(gpuStream_t s, const FlashParams& p, bool lse_only);

#if (defined(ZAYA_GPU_CUDA) && defined(__CUDACC__)) || defined(ZAYA_SIMT)

// What one query row may see, held in registers: key s is visible iff seg <= s <= pos and,
// with a window, pos - s < window. Rows past the chunk (t >= T) get pos = -1 and see nothing.
struct FlashRow {
  int pos = -1, seg = 0;  // positions fit 32 bits (the registers are the kernels' scarce resource)
};

__device__ inline FlashRow flash_row(const AttnParams& p, int64_t b, int64_t t) {
  FlashRow r;
  if (t >= p.T) return r;
  r.pos = int(p.pos0[b] + t);
  r.seg = p.seg ? int(p.seg[b * p.T + t]) : 0;
  return r;
}

__device__ inline bool flash_visible(const FlashRow& r, int s, int window) {
  return s <= r.pos && s >= r.seg && (window <= 0 || r.pos - s < window);
}

// The block of the forward and dQ kernels (grid: query blocks, heads, sequences): queries
// [t_begin, t_begin + kFlashRows) of head h (KV group g) of sequence b, and the key tiles
// [tile0, tile0 + n_tiles * kFlashKeys) holding every key any of them may see
// (flash_key_tiles).
struct FlashQueryBlock {
  int64_t b, h, g, t_begin, tile0;
  int n_tiles;
};

__device__ inline FlashQueryBlock flash_query_block(const AttnParams& p) {
  FlashQueryBlock q;
  q.b = blockIdx.z;
  q.h = blockIdx.y;
  q.g = q.h / (p.Hq / p.Hkv);
  q.t_begin = int64_t(blockIdx.x) * kFlashRows;
  const int64_t t_end = q.t_begin + kFlashRows < p.T ? q.t_begin + kFlashRows : p.T;
  const int64_t seg_first = p.seg ? int64_t(p.seg[q.b * p.T + q.t_begin]) : 0;
  const FlashKeyTiles keys = flash_key_tiles(p.pos0[q.b], q.t_begin, t_end, p.window, seg_first, kFlashKeys);
  q.tile0 = keys.tile0;
  q.n_tiles = int(keys.n_tiles);
  return q;
}

// Copies `rows` packed rows of DH bf16 (contiguous in global memory) into a shared tile with
// row stride DH + 8, asynchronously (the caller commits and waits). Every thread must call it.
template <int DH>
__device__ inline void flash_stage_rows(bf16_t* tile, const bf16_t* src, int rows) {
  constexpr int kChunks = DH / 8;  // 16-byte pieces per row
  for (int i = int(threadIdx.x); i < rows * kChunks; i += kFlashThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    mma::cp_async16(tile + r * (DH + 8) + c, src + int64_t(r) * DH + c);
  }
}

#endif

}  // namespace zaya
