// The internal GEMM entry point: a BLASLt call (cuBLASLt / hipBLASLt) mapping our row-major
// problem onto the column-major library (C^T = op(B)^T op(A)^T), or the tiled fallback.
// Descriptors, layouts and the heuristic's algorithm are built once per problem shape (with
// operand alignments and batch) and cached. Strided batches run as one BLASLt call.
#include "backend/cuda/gpu_gemm.h"

#include <chrono>
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

#if defined(ZAYA_GPU_BLASLT)
struct GpuGemm::Plan {
  gpuBlasLtMatmulDesc_t desc = nullptr;
  gpuBlasLtMatrixLayout_t lay_l = nullptr, lay_r = nullptr, lay_c = nullptr;
  gpuBlasLtHeuristic_t result{};
  bool found = false;
  ~Plan() {
    if (lay_c) gpuBlasLtMatrixLayoutDestroy(lay_c);
    if (lay_r) gpuBlasLtMatrixLayoutDestroy(lay_r);
    if (lay_l) gpuBlasLtMatrixLayoutDestroy(lay_l);
    if (desc) gpuBlasLtMatmulDescDestroy(desc);
  }
};
#else
struct GpuGemm::Plan {};
#endif

GpuGemm::~GpuGemm() {
  for (auto& kv : plans_) delete kv.second;
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
                  float beta, float* C, int64_t ldc, const GemmBatch& batch, GemmCompute compute) {
  ZAYA_CHECK(A.type == B.type, "gemm: operand types differ");
  ZAYA_CHECK(batch.count >= 1, "gemm: batch count must be >= 1");
  if (M <= 0 || N <= 0) return;
  if (handle_ && K > 0 && run_blaslt(M, N, K, alpha, A, B, beta, C, ldc, batch, compute)) return;
  const int64_t elem = A.type == GemmType::BF16 ? 2 : 4;
  for (int64_t i = 0; i < batch.count; ++i) {
    GemmOperand a = A, b = B;
    a.ptr = static_cast<const char*>(A.ptr) + i * batch.stride_a * elem;
    b.ptr = static_cast<const char*>(B.ptr) + i * batch.stride_b * elem;
    gemm_tiled(stream_, M, N, K, alpha, a, b, beta, C + i * batch.stride_c, ldc);
  }
}

GpuGemm::Plan* GpuGemm::plan_for(int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B,
                                 const float* C, int64_t ldc, const GemmBatch& batch, GemmCompute compute) {
#if defined(ZAYA_GPU_BLASLT)
  const uint32_t al_l = alignment_of(B.ptr), al_r = alignment_of(A.ptr), al_c = alignment_of(C);
  std::vector<int64_t> key = {M, N, K, int64_t(A.type), A.ld, A.trans, B.ld, B.trans, ldc, al_l, al_r, al_c,
                              batch.count, batch.stride_a, batch.stride_b, batch.stride_c, int64_t(compute)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  // The MoE's per-expert GEMMs have a row count that changes with the routing, so the cache
  // would grow with training; past kMaxPlans it starts over (a plan only matters while its
  // cublasLtMatmul call is being issued, so dropping them all is safe).
  constexpr size_t kMaxPlans = 4096;
  if (plans_.size() >= kMaxPlans) {
    for (auto& kv : plans_) delete kv.second;
    plans_.clear();
  }
  const auto t_start = std::chrono::steady_clock::now();
  auto handle = static_cast<gpuBlasLtHandle_t>(handle_);
  auto* plan = new Plan;
  plans_[key] = plan;
  const auto dtype = A.type == GemmType::BF16 ? GPU_R_16BF : GPU_R_32F;
  // Column-major view: D (N x M, ld ldc) = opL(B) (N x K) * opR(A) (K x M).
  // Our B stored [N,K] (trans) is column-major K x N: transposed. Stored [K,N]: N x K as is.
  const gpuBlasOp_t op_l = B.trans ? GPU_BLAS_OP_T : GPU_BLAS_OP_N;
  const uint64_t l_rows = uint64_t(B.trans ? K : N), l_cols = uint64_t(B.trans ? N : K);
  // Our A stored [M,K] is column-major K x M as is; stored [K,M] (trans): M x K, transposed.
  const gpuBlasOp_t op_r = A.trans ? GPU_BLAS_OP_T : GPU_BLAS_OP_N;
  const uint64_t r_rows = uint64_t(A.trans ? M : K), r_cols = uint64_t(A.trans ? K : M);
  const auto compute_type = compute == GemmCompute::Tf32 && A.type == GemmType::F32 ? GPU_BLAS_COMPUTE_32F_FAST_TF32
                                                                                    : GPU_BLAS_COMPUTE_32F;
  blas_check(gpuBlasLtMatmulDescCreate(&plan->desc, compute_type, GPU_R_32F), "matmul desc");
  blas_check(gpuBlasLtMatmulDescSetAttribute(plan->desc, GPU_BLASLT_DESC_TRANSA, &op_l, sizeof(op_l)), "transa");
  blas_check(gpuBlasLtMatmulDescSetAttribute(plan->desc, GPU_BLASLT_DESC_TRANSB, &op_r, sizeof(op_r)), "transb");
  blas_check(gpuBlasLtMatrixLayoutCreate(&plan->lay_l, dtype, l_rows, l_cols, B.ld), "layout B");
  blas_check(gpuBlasLtMatrixLayoutCreate(&plan->lay_r, dtype, r_rows, r_cols, A.ld), "layout A");
  blas_check(gpuBlasLtMatrixLayoutCreate(&plan->lay_c, GPU_R_32F, uint64_t(N), uint64_t(M), ldc), "layout C");
  if (batch.count > 1) {
    const int32_t count = int32_t(batch.count);
    auto set_batch = [&](gpuBlasLtMatrixLayout_t lay, int64_t stride, const char* what) {
      blas_check(gpuBlasLtMatrixLayoutSetAttribute(lay, GPU_BLASLT_LAYOUT_BATCH_COUNT, &count, sizeof(count)), what);
      blas_check(gpuBlasLtMatrixLayoutSetAttribute(lay, GPU_BLASLT_LAYOUT_BATCH_STRIDE, &stride, sizeof(stride)), what);
    };
    set_batch(plan->lay_l, batch.stride_b, "batch B");
    set_batch(plan->lay_r, batch.stride_a, "batch A");
    set_batch(plan->lay_c, batch.stride_c, "batch C");
  }
  gpuBlasLtPreference_t pref = nullptr;
  blas_check(gpuBlasLtPreferenceCreate(&pref), "preference");
  uint64_t ws = uint64_t(workspace_bytes_);
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, GPU_BLASLT_PREF_MAX_WORKSPACE, &ws, sizeof(ws)), "workspace");
#if defined(GPU_BLASLT_HAS_ALIGNMENT_PREFS)
  // The heuristic assumes 256-byte aligned pointers unless told otherwise; sub-views (a.u + Dq,
  // expert slices) are less aligned. The alignments are part of the plan's key.
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_l, sizeof(al_l)), "align A");
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_r, sizeof(al_r)), "align B");
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)), "align C");
  blas_check(gpuBlasLtPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)), "align D");
#endif
  int found = 0;
  gpuBlasStatus_t hs = gpuBlasLtAlgoGetHeuristic(handle, plan->desc, plan->lay_l, plan->lay_r, plan->lay_c,
                                                 plan->lay_c, pref, 1, &plan->result, &found);
  plan->found = hs == GPU_BLAS_SUCCESS && found > 0;
  gpuBlasLtPreferenceDestroy(pref);
  ++plans_built_;
  plan_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return plan;
#else
  (void)M, (void)N, (void)K, (void)A, (void)B, (void)C, (void)ldc, (void)batch, (void)compute;
  return nullptr;
#endif
}

bool GpuGemm::run_blaslt(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                         float beta, float* C, int64_t ldc, const GemmBatch& batch, GemmCompute compute) {
#if defined(ZAYA_GPU_BLASLT)
  Plan* plan = plan_for(M, N, K, A, B, C, ldc, batch, compute);
  if (!plan->found) return false;  // no algorithm for this shape/alignment: the caller uses the tiled kernel
  blas_check(gpuBlasLtMatmul(static_cast<gpuBlasLtHandle_t>(handle_), plan->desc, &alpha, B.ptr, plan->lay_l, A.ptr,
                             plan->lay_r, &beta, C, plan->lay_c, C, plan->lay_c, &plan->result.algo, workspace_,
                             size_t(workspace_bytes_), stream_),
             "BLASLt matmul");
  return true;
#else
  (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)B, (void)beta, (void)C, (void)ldc, (void)batch, (void)compute;
  return false;
#endif
}

}  // namespace zaya
