// The grouped GEMM kernels (gpu_grouped_gemm.h): 128 x 128 output tiles, K in steps of 32
// staged through shared memory as bf16, then either 8 warps each owning a 64 x 32 part as 4 x 2
// WMMA 16x16x16 fragments with fp32 accumulators and an epilogue through a per-warp scratch tile
// (CUDA, sm_80 and newer), or 256 threads each owning an 8 x 8 strided micro-tile with fp32 FMAs
// (the portable path: HIP, and CUDA with portable_gemm). Which expert a block serves is read
// from the device offsets: the rows kind walks the experts' row-tile counts, the weights kind
// takes the expert from blockIdx.z. Plain loads (no cp.async pipeline). Passed against the
// CPU backend on an H100, where it is 2.2x slower than per-expert cuBLASLt GEMMs; for
// GroupedCores::mma_sync the launchers first try the pipelined kernels of gpu_grouped_gemm_mma.cu
// and keep these for the shapes those leave.
#include "backend/cuda/gpu_grouped_gemm.h"

#include <string>

namespace zaya {

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kThreads = 256;  // WMMA: 8 warps of 32, 2 along M x 4 along N; FMA: a 16 x 16 grid
constexpr int kLdA = kBK + 8, kLdB = kBN + 8;  // shared row strides: multiples of 8 bf16 (WMMA)

// tile[r * ld_tile + c] = view(r0 + r, c0 + c) for r < R, c < Cc; 0 outside [0, rows) x [0, cols).
// Consecutive threads walk the view's contiguous dimension.
__device__ inline void load_tile(bf16_t* tile, int ld_tile, int R, int Cc, const Bf16View& v, int64_t r0, int64_t c0,
                                 int64_t rows, int64_t cols) {
  for (int i = int(threadIdx.x); i < R * Cc; i += kThreads) {
    const int r = v.trans ? i % R : i / Cc;
    const int c = v.trans ? i / R : i % Cc;
    const int64_t gr = r0 + r, gc = c0 + c;
    bf16_t x = 0;
    if (gr < rows && gc < cols) x = v.trans ? v.p[gc * v.ld + gr] : v.p[gr * v.ld + gc];
    tile[r * ld_tile + c] = x;
  }
}

// out = alpha * acc + beta * out (beta == 0 never reads out).
__device__ inline void store_scaled(float* out, float acc, float alpha, float beta) {
  *out = beta == 0.0f ? alpha * acc : alpha * acc + beta * *out;
}

// The portable block tile: as block_tile_wmma, with each thread's 8 x 8 outputs at rows
// ty + 16 i and columns tx + 16 j of the tile (tx, ty: the thread's place in a 16 x 16 grid).
// As [kBM][kLdA] and Bs [kBK][kLdB]: the block's shared staging tiles.
__device__ void block_tile_fma(bf16_t* As, bf16_t* Bs, const Bf16View& a, const Bf16View& b, int64_t M, int64_t N,
                               int64_t K, int64_t m0, int64_t n0, float alpha, float beta, float* C, int64_t ldc) {
  const int tx = int(threadIdx.x) % 16, ty = int(threadIdx.x) / 16;
  float acc[8][8];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    load_tile(As, kLdA, kBM, kBK, a, m0, k0, M, K);
    load_tile(Bs, kLdB, kBK, kBN, b, k0, n0, K, N);
    __syncthreads();
    for (int kk = 0; kk < kBK; ++kk) {
      float av[8], bv[8];
      for (int i = 0; i < 8; ++i) av[i] = bf16_to_f32(As[(ty + 16 * i) * kLdA + kk]);
      for (int j = 0; j < 8; ++j) bv[j] = bf16_to_f32(Bs[kk * kLdB + tx + 16 * j]);
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
  for (int i = 0; i < 8; ++i) {
    const int64_t m = m0 + ty + 16 * i;
    if (m >= M) continue;
    for (int j = 0; j < 8; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < N) store_scaled(C + m * ldc + n, acc[i][j], alpha, beta);
    }
  }
}

#if defined(ZAYA_GPU_CUDA)
constexpr int kWarpM = 64, kWarpN = 32;  // each warp's part of the block tile
constexpr int kFragM = kWarpM / 16, kFragN = kWarpN / 16;

// The block's kBM x kBN tile at (m0, n0) of C = alpha * opA opB + beta * C, with opA the
// [M, K] view a and opB the [K, N] view b, on the tensor cores. Every thread of the block must
// call it.
__device__ void block_tile_wmma(bf16_t* As, bf16_t* Bs, const Bf16View& a, const Bf16View& b, int64_t M, int64_t N,
                                int64_t K, int64_t m0, int64_t n0, float alpha, float beta, float* C, int64_t ldc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 WMMA needs sm_80; the launchers ask for it only where the device has it
#else
  using namespace nvcuda;
  __shared__ __align__(32) float scratch[kThreads / 32][16 * 16];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int wm = warp / 4, wn = warp % 4;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFragM][kFragN];
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    load_tile(As, kLdA, kBM, kBK, a, m0, k0, M, K);  // As[m][k] = opA(m0 + m, k0 + k)
    load_tile(Bs, kLdB, kBK, kBN, b, k0, n0, K, N);  // Bs[k][n] = opB(k0 + k, n0 + n)
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[kFragM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb[kFragN];
#pragma unroll
      for (int i = 0; i < kFragM; ++i)
        wmma::load_matrix_sync(fa[i], reinterpret_cast<const __nv_bfloat16*>(As + (wm * kWarpM + i * 16) * kLdA + kk),
                               kLdA);
#pragma unroll
      for (int j = 0; j < kFragN; ++j)
        wmma::load_matrix_sync(fb[j], reinterpret_cast<const __nv_bfloat16*>(Bs + kk * kLdB + wn * kWarpN + j * 16),
                               kLdB);
#pragma unroll
      for (int i = 0; i < kFragM; ++i)
#pragma unroll
        for (int j = 0; j < kFragN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
  float* sc = scratch[warp];
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j) {
      wmma::store_matrix_sync(sc, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 16 * 16; e += 32) {
        const int64_t m = m0 + wm * kWarpM + i * 16 + e / 16, n = n0 + wn * kWarpN + j * 16 + e % 16;
        if (m < M && n < N) store_scaled(C + m * ldc + n, sc[e], alpha, beta);
      }
      __syncwarp();
    }
#endif
}
#endif

// One block tile on the tensor cores (CUDA, when asked) or with FMAs, through one pair of
// shared staging tiles (32-byte aligned, as WMMA loads need).
__device__ inline void block_tile(bool tensor_cores, const Bf16View& a, const Bf16View& b, int64_t M, int64_t N,
                                  int64_t K, int64_t m0, int64_t n0, float alpha, float beta, float* C, int64_t ldc) {
  __shared__ __align__(32) bf16_t As[kBM * kLdA];
  __shared__ __align__(32) bf16_t Bs[kBK * kLdB];
#if defined(ZAYA_GPU_CUDA)
  if (tensor_cores) return block_tile_wmma(As, Bs, a, b, M, N, K, m0, n0, alpha, beta, C, ldc);
#endif
  (void)tensor_cores;
  block_tile_fma(As, Bs, a, b, M, N, K, m0, n0, alpha, beta, C, ldc);
}

// blockIdx.x: a row tile counted over the experts in order (blocks past the last one exit);
// blockIdx.y: a column tile.
__global__ void __launch_bounds__(kThreads)
    k_grouped_rows(int tensor_cores, const int32_t* offsets, int64_t E, int64_t N, int64_t K, float alpha,
                   const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, int b_trans, int64_t stride_b,
                   float beta, float* C, int64_t ldc) {
  int64_t t = blockIdx.x;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    const int64_t tiles = (rows + kBM - 1) / kBM;
    if (t < tiles) {
      const Bf16View a{A + r0 * lda, lda, false};
      const Bf16View b{B + e * stride_b, ldb, b_trans != 0};  // opB(k, n): stored [N, K] when b_trans
      block_tile(tensor_cores != 0, a, b, rows, N, K, t * kBM, int64_t(blockIdx.y) * kBN, alpha, beta, C + r0 * ldc,
                 ldc);
      return;
    }
    t -= tiles;
  }
}

// blockIdx.z: the expert; blockIdx.x: an (M, N) tile.
__global__ void __launch_bounds__(kThreads)
    k_grouped_weights(int tensor_cores, const int32_t* offsets, int64_t M, int64_t N, float alpha, const bf16_t* A,
                      int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C, int64_t ldc,
                      int64_t stride_c) {
  const int64_t e = blockIdx.z;
  const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
  const int64_t tiles_n = (N + kBN - 1) / kBN;
  const int64_t m0 = int64_t(blockIdx.x) / tiles_n * kBM, n0 = int64_t(blockIdx.x) % tiles_n * kBN;
  const Bf16View a{A + r0 * lda, lda, true};   // opA(m, k) = A[r0 + k, m]
  const Bf16View b{B + r0 * ldb, ldb, false};  // opB(k, n) = B[r0 + k, n]
  block_tile(tensor_cores != 0, a, b, M, N, rows, m0, n0, alpha, beta, C + e * stride_c, ldc);
}

int64_t tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

}  // namespace

int grouped_gemm_compiled_arch() {
#if defined(ZAYA_GPU_CUDA)
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, k_grouped_rows) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return attributes.ptxVersion;
#elif defined(ZAYA_GPU_MMA_SYNC)
  return 80;  // the host emulation (tests/simt): mma.sync emulated, WMMA left to the FMA path
#else
  return 0;
#endif
}

void grouped_gemm_rows(gpuStream_t s, GroupedCores cores, const int32_t* offsets, int64_t E, int64_t max_rows,
                       int64_t N, int64_t K, float alpha, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb,
                       bool b_trans, int64_t stride_b, float beta, float* C, int64_t ldc) {
  if (E <= 0 || max_rows <= 0 || N <= 0) return;
  if (cores == GroupedCores::mma_sync && grouped_gemm_rows_mma(s, offsets, E, max_rows, N, K, alpha, A, lda, B, ldb, b_trans, stride_b,
                                            beta, C, ldc))
    return;
  if (tiles(N, kBN) > 65535) fail("cuda", "grouped_gemm_rows: N = " + std::to_string(N) + " is too large");
  // Each expert's last tile may be partial: at most one extra tile per expert.
  const dim3 grid(unsigned(tiles(max_rows, kBM) + E), unsigned(tiles(N, kBN)));
  gpu_launch(k_grouped_rows, grid, kThreads, 0, s, cores == GroupedCores::fma ? 0 : 1, offsets, E, N, K, alpha, A, lda, B,
             ldb, b_trans ? 1 : 0, stride_b, beta, C, ldc);
  GPU_LAUNCH_CHECK();
}

void grouped_gemm_weights(gpuStream_t s, GroupedCores cores, const int32_t* offsets, int64_t E, int64_t M, int64_t N,
                          float alpha, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, float beta,
                          float* C, int64_t ldc, int64_t stride_c) {
  if (E <= 0 || M <= 0 || N <= 0) return;
  if (cores == GroupedCores::mma_sync &&
      grouped_gemm_weights_mma(s, offsets, E, M, N, alpha, A, lda, B, ldb, beta, C, ldc, stride_c))
    return;
  if (E > 65535) fail("cuda", "grouped_gemm_weights: " + std::to_string(E) + " experts is too many");
  const dim3 grid(unsigned(tiles(M, kBM) * tiles(N, kBN)), 1, unsigned(E));
  gpu_launch(k_grouped_weights, grid, kThreads, 0, s, cores == GroupedCores::fma ? 0 : 1, offsets, M, N, alpha, A, lda, B,
             ldb, beta, C, ldc, stride_c);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
