// Portable tiled GEMM (no vendor BLAS): 64x64 output tiles, K in steps of 16 through shared
// memory, 256 threads each owning a 4x4 strided micro-tile, fp32 accumulation. Used on HIP
// builds without hipBLASLt and as the fallback when BLASLt finds no algorithm. Correctness over
// speed; passed against the CPU backend on an H100 (the tests' tiled_fp32 mode).
#include "backend/cuda/gpu_device.h"
#include "backend/cuda/gpu_gemm.h"

#include <string>

namespace zaya {

namespace {

constexpr int kTile = 64, kStep = 16, kThreadsGemm = 256;

__device__ inline float load_elem(const void* p, int bf16, int64_t idx) {
  return bf16 ? bf16_to_f32(static_cast<const bf16_t*>(p)[idx]) : static_cast<const float*>(p)[idx];
}

__global__ void k_gemm_tiled(int64_t M, int64_t N, int64_t K, float alpha, const void* A, int a_bf16, int64_t lda,
                             int a_trans, const void* B, int b_bf16, int64_t ldb, int b_trans, float beta, float* C,
                             int64_t ldc) {
  __shared__ float As[kStep][kTile + 1];
  __shared__ float Bs[kStep][kTile + 1];
  const int tx = int(threadIdx.x) % 16, ty = int(threadIdx.x) / 16;
  // Rows (often many tokens) on grid x (2^31 - 1 blocks), columns on grid y (65535).
  const int64_t m0 = int64_t(blockIdx.x) * kTile, n0 = int64_t(blockIdx.y) * kTile;
  float acc[4][4];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;

  for (int64_t k0 = 0; k0 < K; k0 += kStep) {
    for (int i = int(threadIdx.x); i < kStep * kTile; i += kThreadsGemm) {
      // Consecutive threads walk the contiguous dimension of the stored matrix.
      int kk, mm;
      if (a_trans) { kk = i / kTile; mm = i % kTile; } else { kk = i % kStep; mm = i / kStep; }
      const int64_t m = m0 + mm, k = k0 + kk;
      As[kk][mm] = (m < M && k < K) ? load_elem(A, a_bf16, a_trans ? k * lda + m : m * lda + k) : 0.0f;
      int nn;
      if (b_trans) { kk = i % kStep; nn = i / kStep; } else { kk = i / kTile; nn = i % kTile; }
      const int64_t n = n0 + nn, k2 = k0 + kk;
      Bs[kk][nn] = (n < N && k2 < K) ? load_elem(B, b_bf16, b_trans ? n * ldb + k2 : k2 * ldb + n) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < kStep; ++kk) {
      float a[4], b[4];
      for (int r = 0; r < 4; ++r) a[r] = As[kk][ty + 16 * r];
      for (int c = 0; c < 4; ++c) b[c] = Bs[kk][tx + 16 * c];
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 4; ++c) acc[r][c] += a[r] * b[c];
    }
    __syncthreads();
  }
  for (int r = 0; r < 4; ++r) {
    const int64_t m = m0 + ty + 16 * r;
    if (m >= M) continue;
    for (int c = 0; c < 4; ++c) {
      const int64_t n = n0 + tx + 16 * c;
      if (n >= N) continue;
      float* out = C + m * ldc + n;
      *out = beta == 0.0f ? alpha * acc[r][c] : alpha * acc[r][c] + beta * *out;
    }
  }
}

}  // namespace

void gemm_tiled(gpuStream_t stream, int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A,
                const GemmOperand& B, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if ((N + kTile - 1) / kTile > 65535) fail("cuda", "gemm_tiled: N = " + std::to_string(N) + " is too large");
  dim3 grid(unsigned((M + kTile - 1) / kTile), unsigned((N + kTile - 1) / kTile));
  gpu_launch(k_gemm_tiled, grid, kThreadsGemm, 0, stream, M, N, K, alpha, A.ptr, A.type == GemmType::BF16,
             A.ld, A.trans, B.ptr, B.type == GemmType::BF16, B.ld, B.trans, beta, C, ldc);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
