// The kernels of the pipelined tensor-core grouped GEMMs (gpu_grouped_gemm_mma.cu launches them
// and describes them): the 128 x 128 block tile with its 3-stage cp.async pipeline, and the rows
// and weights kinds over the routing plan's offsets. A header so that the host emulation of the
// GPU (tests/simt, ZAYA_SIMT) compiles the very same kernels and checks them without a GPU.
// CUDA sm_80+ (or the emulation) only.
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_device.h"
#include "backend/cuda/gpu_mma.h"

#if (defined(ZAYA_GPU_CUDA) && defined(__CUDACC__)) || defined(ZAYA_SIMT)

namespace zaya::grouped_mma {

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 3, kThreads = 256;
constexpr int kWarpM = 64, kWarpN = 32;  // 8 warps: 2 along M x 4 along N
constexpr int kFragM = kWarpM / 16, kFragN = kWarpN / 8;

// A shared tile of a row-major stored operand: `Rows` storage rows of `Cols` elements, padded by
// 8 elements a row (rows stay 16-byte aligned; fragment loads hit distinct banks).
template <int Rows, int Cols>
struct SharedTile {
  static constexpr int kLd = Cols + 8;
  static constexpr int kElems = Rows * kLd;
};

// A operand: K-major ([m][k], the rows kind) or M-major ([k][m], the weights kind's A^T).
template <bool KMajor>
using ATile = SharedTile<KMajor ? kBM : kBK, KMajor ? kBK : kBM>;
// B operand: K-major ([n][k], weights as stored) or N-major ([k][n]).
template <bool KMajor>
using BTile = SharedTile<KMajor ? kBN : kBK, KMajor ? kBK : kBN>;

template <bool AK, bool BK>
constexpr size_t smem_bytes() {
  return size_t(kStages) * (ATile<AK>::kElems + BTile<BK>::kElems) * 2;
}

// Copies storage rows [row0, row0 + Rows) x columns [col0, col0 + Cols) of a row-major bf16
// matrix (stride ld) into a shared tile, 8 columns a copy; pieces at or past (rows, cols) are
// zero (cols a multiple of 8).
template <int Rows, int Cols>
__device__ inline void stage_tile(bf16_t* tile, const bf16_t* src, int64_t ld, int64_t row0, int64_t col0,
                                  int64_t rows, int64_t cols) {
  constexpr int kPieces = Cols / 8;
  for (int i = int(threadIdx.x); i < Rows * kPieces; i += kThreads) {
    const int r = i / kPieces, c = (i % kPieces) * 8;
    const int64_t gr = row0 + r, gc = col0 + c;
    const bool valid = gr < rows && gc < cols;
    mma::cp_async16_or_zero(tile + r * SharedTile<Rows, Cols>::kLd + c, valid ? src + gr * ld + gc : src, valid);
  }
}

// out = alpha * acc + beta * out (beta == 0 never reads out).
__device__ inline void store_scaled(float* out, float acc, float alpha, float beta) {
  *out = beta == 0.0f ? alpha * acc : alpha * acc + beta * *out;
}

// C[m0.., n0..] (the block's 128 x 128 tile) = alpha * opA opB + beta * C, opA [M, K], opB [K, N].
// A: K-major rows m (stride lda) or M-major rows k; B: K-major rows n (stride ldb) or N-major
// rows k. Every thread of the block calls it.
template <bool AK, bool BK>
__device__ void block_tile(unsigned char* smem, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, int64_t M,
                           int64_t N, int64_t K, int64_t m0, int64_t n0, float alpha, float beta, float* C,
                           int64_t ldc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using TA = ATile<AK>;
  using TB = BTile<BK>;
  bf16_t* As = reinterpret_cast<bf16_t*>(smem);
  bf16_t* Bs = As + kStages * TA::kElems;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int wm = warp / 4, wn = warp % 4;
  const int gq = mma::group_of(lane), qd = mma::quad_of(lane);
  const int k_tiles = int((K + kBK - 1) / kBK);
  auto stage = [&](int buf, int kt) {
    const int64_t k0 = int64_t(kt) * kBK;
    if constexpr (AK) stage_tile<kBM, kBK>(As + buf * TA::kElems, A, lda, m0, k0, M, K);
    else stage_tile<kBK, kBM>(As + buf * TA::kElems, A, lda, k0, m0, K, M);
    if constexpr (BK) stage_tile<kBN, kBK>(Bs + buf * TB::kElems, B, ldb, n0, k0, N, K);
    else stage_tile<kBK, kBN>(Bs + buf * TB::kElems, B, ldb, k0, n0, K, N);
  };
  float acc[kFragM][kFragN][4];
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) stage(s, s);
    mma::cp_async_commit();  // one group per stage, empty or not: the wait counts stay uniform
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    mma::cp_async_wait<kStages - 2>();  // tile kt has landed
    __syncthreads();                    // ... for every thread, and tile kt - 1's buffer is free
    if (kt + kStages - 1 < k_tiles) stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    mma::cp_async_commit();
    const bf16_t* at = As + (kt % kStages) * TA::kElems;
    const bf16_t* bt = Bs + (kt % kStages) * TB::kElems;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[kFragM][4], bf[kFragN][2];
#pragma unroll
      for (int i = 0; i < kFragM; ++i) {
        if constexpr (AK) mma::load_a(af[i], at, TA::kLd, wm * kWarpM + 16 * i, kk, lane);
        else mma::load_a_trans(af[i], at, TA::kLd, wm * kWarpM + 16 * i, kk, lane);
      }
#pragma unroll
      for (int j = 0; j < kFragN; ++j) {
        if constexpr (BK) mma::load_b(bf[j], bt, TB::kLd, wn * kWarpN + 8 * j, kk, lane);
        else mma::load_b_trans(bf[j], bt, TB::kLd, kk, wn * kWarpN + 8 * j, lane);
      }
#pragma unroll
      for (int i = 0; i < kFragM; ++i)
#pragma unroll
        for (int j = 0; j < kFragN; ++j) mma::mma_16816(acc[i][j], af[i], bf[j]);
    }
  }
  mma::cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // h = 0: row group, h = 1: row group + 8
        const int64_t m = m0 + wm * kWarpM + 16 * i + gq + 8 * h;
        const int64_t n = n0 + wn * kWarpN + 8 * j + 2 * qd;
        if (m >= M) continue;
        if (n < N) store_scaled(C + m * ldc + n, acc[i][j][2 * h], alpha, beta);
        if (n + 1 < N) store_scaled(C + m * ldc + n + 1, acc[i][j][2 * h + 1], alpha, beta);
      }
#endif
}

// blockIdx.x: a row tile counted over the experts in order (blocks past the last one exit);
// blockIdx.y: a column tile. A K-major [rows, K]; B_e K-major [N, K] (b_k) or N-major [K, N].
template <bool BK>
__global__ void __launch_bounds__(kThreads)
    k_grouped_rows_mma(const int32_t* offsets, int64_t E, int64_t N, int64_t K, float alpha, const bf16_t* A,
                       int64_t lda, const bf16_t* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                       int64_t ldc) {
  ZAYA_DYNAMIC_SHARED(smem);
  int64_t t = blockIdx.x;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    const int64_t tiles = (rows + kBM - 1) / kBM;
    if (t < tiles) {
      block_tile<true, BK>(smem, A + r0 * lda, lda, B + e * stride_b, ldb, rows, N, K, t * kBM,
                           int64_t(blockIdx.y) * kBN, alpha, beta, C + r0 * ldc, ldc);
      return;
    }
    t -= tiles;
  }
}

// blockIdx.z: the expert; blockIdx.x: an (M, N) tile. C_e = alpha A_e^T B_e + beta C_e with A_e
// [rows_e, M] and B_e [rows_e, N] stored by rows: the expert's rows are the K dimension.
__global__ void __launch_bounds__(kThreads)
    k_grouped_weights_mma(const int32_t* offsets, int64_t M, int64_t N, float alpha, const bf16_t* A, int64_t lda,
                          const bf16_t* B, int64_t ldb, float beta, float* C, int64_t ldc, int64_t stride_c) {
  ZAYA_DYNAMIC_SHARED(smem);
  const int64_t e = blockIdx.z;
  const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
  const int64_t tiles_n = (N + kBN - 1) / kBN;
  const int64_t m0 = int64_t(blockIdx.x) / tiles_n * kBM, n0 = int64_t(blockIdx.x) % tiles_n * kBN;
  block_tile<false, false>(smem, A + r0 * lda, lda, B + r0 * ldb, ldb, M, N, rows, m0, n0, alpha, beta,
                           C + e * stride_c, ldc);
}

}  // namespace zaya::grouped_mma

#endif
