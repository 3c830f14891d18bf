// The internal GEMM entry point: a BLASLt call (cuBLASLt / hipBLASLt) mapping our row-major
// problem onto the column-major library (C^T = op(B)^T op(A)^T), or the tiled fallback.
// Descriptors are built per call and the heuristic is queried per call (simple; a cache keyed
// by shape is the obvious next step). Not yet run on a GPU.
#include "backend/cuda/gpu_gemm.h"

#include <string>

namespace zaya {

namespace {

#if defined(ZAYA_GPU_BLASLT)
void blas_check(gpuBlasStatus_t s, const char* call) {
  if (s != GPU_BLAS_SUCCESS) fail("cuda", std::string(call) + " failed with BLASLt status " + std::to_string(int(s)));
}

// Largest power of two (<= 256) dividing the address: the alignment we promise the heuristic.
uint32_t alignment_of(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}
#endif

}  // namespace

GpuGemm::GpuGemm(gpuStream_t stream, bool portable) : stream_(stream), portable_(portable) {
#if defined(ZAYA_GPU_BLASLT)
  if (!portable_) {
    gpuBlasLtHandle_t h = nullptr;
    blas_check(gpuBlasLtCreate(&h), "BLASLt create");
    handle_ = h;
    workspace_bytes_ = int64_t(32) << 20;
    GPU_CHECK(gpuMalloc(&workspace_, size_t(workspace_bytes_)));
  }
#endif
}

GpuGemm::~GpuGemm() {
#if defined(ZAYA_GPU_BLASLT)
  if (workspace_) (void)gpuFree(workspace_);
  if (handle_) (void)gpuBlasLtDestroy(static_cast<gpuBlasLtHandle_t>(handle_));
#endif
}

const char* GpuGemm::engine() const {
#if defined(ZAYA_GPU_BLASLT) && defined(ZAYA_GPU_CUDA)
  if (handle_) return "cublaslt";
#elif defined(ZAYA_GPU_BLASLT)
  if (handle_) return "hipblaslt";
#endif
  return "tiled";
}

void GpuGemm::run(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                  float beta, float* C, int64_t ldc) {
  ZAYA_CHECK(A.type == B.type, "gemm: operand types differ");
  if (M <= 0 || N <= 0) return;
  if (handle_ && K > 0 && run_blaslt(M, N, K, alpha, A, B, beta, C, ldc)) return;
  gemm_tiled(stream_, M, N, K, alpha, A, B, beta, C, ldc);
}

bool GpuGemm::run_blaslt(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                         float beta, float* C, int64_t ldc) {
#if defined(ZAYA_GPU_BLASLT)
  auto handle = static_cast<gpuBlasLtHandle_t>(handle_);
  const auto dtype = A.type == GemmType::BF16 ? GPU_R_16BF : GPU_R_32F;
  // Column-major view: D (N x M, ld ldc) = opL(B) (N x K) * opR(A) (K x M).
  // Our B stored [N,K] (trans) is column-major K x N: transposed. Stored [K,N]: N x K as is.
  const gpuBlasOp_t op_l = B.trans ? GPU_BLAS_OP_T : GPU_BLAS_OP_N;
  const uint64_t l_rows = uint64_t(B.trans ? K : N), l_cols = uint64_t(B.trans ? N : K);
  // Our A stored [M,K] is column-major K x M as is; stored [K,M] (trans): M x K, transposed.
  const gpuBlasOp_t op_r = A.trans ? GPU_BLAS_OP_T : GPU_BLAS_OP_N;
  const uint64_t r_rows = uint64_t(A.trans ? M : K), r_cols = uint64_t(A.trans ? K : M);

  gpuBlasLtMatmulDesc_t desc = nullptr;
  gpuBlasLtMatrixLayout_t lay_l = nullptr, lay_r = nullptr, lay_c = nullptr;
  gpuBlasLtPreference_t pref = nullptr;
  blas_check(gpuBlasLtMatmulDescCreate(&desc, GPU_BLAS_COMPUTE_32F, GPU_R_32F), "matmul desc");
  blas_check(gpuBlasLtMatmulDescSetAttribute(desc, GPU_BLASLT_DESC_TRANSA, &op_l, sizeof(op_l)), "transa");
  blas_check(gpuBlasLtMatmulDescSetAttribute(desc, GPU_BLASLT_DESC_TRANSB, &op_r, sizeof(op_r)), "transb");
  blas_check(gpuBlasLtMatrixLayoutCreate(&lay_l, dtype, l_rows, l_cols, B.ld), "layout B");
  blas_check(gpuBlasLtMatrixLayoutCreate(&lay_r, dtype, r_rows, r_cols, A.ld), "layout A");
  blas_check(gpuBlasLtMatrixLayoutCreate(&lay_c, GPU_R_32F, uint64_t(N), uint64_t(M), ldc), "layout C");
  blas_check(gpuBlasLtPreferenceCreate(&pref), "preference");
  uint64_t ws = uint64_t(workspace_bytes_);
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, GPU_BLASLT_PREF_MAX_WORKSPACE, &ws, sizeof(ws)), "workspace");
#if defined(GPU_BLASLT_HAS_ALIGNMENT_PREFS)
  // The heuristic assumes 256-byte aligned pointers unless told otherwise; sub-views (a.u + Dq,
  // expert slices) are less aligned.
  const uint32_t al_l = alignment_of(B.ptr), al_r = alignment_of(A.ptr), al_c = alignment_of(C);
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_l, sizeof(al_l)), "align A");
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_r, sizeof(al_r)), "align B");
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)), "align C");
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)), "align D");
#endif
  gpuBlasLtHeuristic_t result{};
  int found = 0;
  gpuBlasStatus_t hs =
      gpuBlasLtAlgoGetHeuristic(handle, desc, lay_l, lay_r, lay_c, lay_c, pref, 1, &result, &found);
  bool ok = false;
  if (hs == GPU_BLAS_SUCCESS && found > 0) {
    blas_check(gpuBlasLtMatmul(handle, desc, &alpha, B.ptr, lay_l, A.ptr, lay_r, &beta, C, lay_c, C, lay_c,
                               &result.algo, workspace_, size_t(workspace_bytes_), stream_),
               "BLASLt matmul");
    ok = true;
  }
  gpuBlasLtPreferenceDestroy(pref);
  gpuBlasLtMatrixLayoutDestroy(lay_c);
  gpuBlasLtMatrixLayoutDestroy(lay_r);
  gpuBlasLtMatrixLayoutDestroy(lay_l);
  gpuBlasLtMatmulDescDestroy(desc);
  return ok;  // false: no algorithm for this shape/alignment, the caller uses the tiled kernel
#else
  return false;
#endif
}

}  // namespace zaya
