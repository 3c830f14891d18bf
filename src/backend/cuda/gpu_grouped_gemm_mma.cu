// The pipelined tensor-core path of the grouped GEMMs (gpu_grouped_gemm.h), CUDA sm_80+: 128 x
// 128 output tiles, K in steps of 32 through a 3-stage cp.async pipeline (tiles past a matrix's
// edge are zero-filled by the copies themselves), 8 warps each owning 64 x 32 of the tile as
// 4 x 4 mma.sync m16n8k16 bf16 products with fp32 accumulators in registers, fragments read
// from shared memory with conflict-free 32-bit loads or ldmatrix (its transposing form for
// operands stored the other way round), and an epilogue straight from the accumulators. The
// routing plan's offsets stay on the device, as in the plain kernels. Shapes whose contiguous
// extents or strides are not multiples of 8 elements, or operands not 16-byte aligned, are left
// to the plain kernels (the callers try this path first). Written without a GPU; the GpuMoe tests
// in grouped mode cover it.
#include "backend/cuda/gpu_grouped_gemm.h"

#include <cstdint>

#include "backend/cuda/gpu_grouped_gemm_mma_kernels.h"

namespace zaya {

#if defined(ZAYA_GPU_MMA_SYNC)
namespace {

using namespace grouped_mma;

int64_t tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  GPU_CHECK(gpuFuncSetAttribute(reinterpret_cast<const void*>(kernel), gpuFuncAttributeMaxDynamicSharedMemorySize,
                                int(bytes)));
}

}  // namespace

bool grouped_gemm_rows_mma(gpuStream_t s, const int32_t* offsets, int64_t E, int64_t max_rows, int64_t N, int64_t K,
                           float alpha, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, bool b_trans,
                           int64_t stride_b, float beta, float* C, int64_t ldc) {
  // Every 8-element piece a copy moves must be whole and 16-byte aligned: A's rows run along K;
  // B's along K (stored [N, K]) or along N.
  const int64_t b_contiguous = b_trans ? K : N;
  if (K % 8 || b_contiguous % 8 || lda % 8 || ldb % 8 || stride_b % 8 || !gpu_aligned(A) || !gpu_aligned(B)) return false;
  if (tiles(N, kBN) > 65535) return false;
  const dim3 grid(unsigned(tiles(max_rows, kBM) + E), unsigned(tiles(N, kBN)));
  if (b_trans) {
    const size_t bytes = smem_bytes<true, true>();
    allow_smem(k_grouped_rows_mma<true>, bytes);
    gpu_launch(k_grouped_rows_mma<true>, grid, kThreads, bytes, s, offsets, E, N, K, alpha, A, lda, B, ldb,
               stride_b, beta, C, ldc);
  } else {
    const size_t bytes = smem_bytes<true, false>();
    allow_smem(k_grouped_rows_mma<false>, bytes);
    gpu_launch(k_grouped_rows_mma<false>, grid, kThreads, bytes, s, offsets, E, N, K, alpha, A, lda, B, ldb,
               stride_b, beta, C, ldc);
  }
  GPU_LAUNCH_CHECK();
  return true;
}

bool grouped_gemm_weights_mma(gpuStream_t s, const int32_t* offsets, int64_t E, int64_t M, int64_t N, float alpha,
                              const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C,
                              int64_t ldc, int64_t stride_c) {
  if (M % 8 || N % 8 || lda % 8 || ldb % 8 || !gpu_aligned(A) || !gpu_aligned(B)) return false;
  if (E > 65535 || tiles(M, kBM) * tiles(N, kBN) > 2147483647LL) return false;
  const size_t bytes = smem_bytes<false, false>();
  allow_smem(k_grouped_weights_mma, bytes);
  const dim3 grid(unsigned(tiles(M, kBM) * tiles(N, kBN)), 1, unsigned(E));
  gpu_launch(k_grouped_weights_mma, grid, kThreads, bytes, s, offsets, M, N, alpha, A, lda, B, ldb, beta, C,
             ldc, stride_c);
  GPU_LAUNCH_CHECK();
  return true;
}
#else
bool grouped_gemm_rows_mma(gpuStream_t, const int32_t*, int64_t, int64_t, int64_t, int64_t, float, const bf16_t*,
                           int64_t, const bf16_t*, int64_t, bool, int64_t, float, float*, int64_t) {
  return false;  // HIP: the plain kernels
}

bool grouped_gemm_weights_mma(gpuStream_t, const int32_t*, int64_t, int64_t, int64_t, float, const bf16_t*, int64_t,
                              const bf16_t*, int64_t, float, float*, int64_t, int64_t) {
  return false;
}
#endif

}  // namespace zaya
