// The internal GEMM entry point: a BLASLt call (cuBLASLt / hipBLASLt) mapping our row-major
// problem onto the column-major library (C^T = op(B)^T op(A)^T), or the tiled fallback; a row
// bias through the BLASLt bias epilogue (16-byte aligned vectors) or a kernel after the GEMM.
// Descriptors, layouts and the heuristic's algorithm are built once per problem shape (with
// operand alignments and batch) and cached; ragged shapes (MoE rows) share one plan per
// power-of-two bound and get layouts of their actual shape per call. Strided batches run as one
// BLASLt call.
#include "backend/cuda/gpu_gemm.h"

#include "backend/cuda/gpu_device.h"

#include <algorithm>
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

// The BLASLt bias epilogue is given 16-byte aligned vectors only (less aligned ones have been
// seen to fail); others are added by k_add_row_bias.
constexpr uint32_t kEpilogueBiasAlignment = 16;

// The three matrix layouts of one problem in the library's column-major view:
// D (N x M, ld ldc) = opL(B) (N x K) * opR(A) (K x M).
struct Layouts {
  gpuBlasLtMatrixLayout_t l = nullptr, r = nullptr, c = nullptr;
  Layouts() = default;
  Layouts(const Layouts&) = delete;
  Layouts& operator=(const Layouts&) = delete;
  ~Layouts() {
    if (c) gpuBlasLtMatrixLayoutDestroy(c);
    if (r) gpuBlasLtMatrixLayoutDestroy(r);
    if (l) gpuBlasLtMatrixLayoutDestroy(l);
  }
};

// A column-major rows x cols layout with leading dimension ld (at least rows: a plan built
// for a ragged bound may describe more rows than the stored matrix has).
gpuBlasLtMatrixLayout_t make_layout(GemmType type, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch_count,
                                    int64_t batch_stride, const char* what) {
  gpuBlasLtMatrixLayout_t lay = nullptr;
  const auto dtype = type == GemmType::BF16 ? GPU_R_16BF : GPU_R_32F;
  const int64_t lead = std::max<int64_t>(ld, int64_t(rows));
  blas_check(gpuBlasLtMatrixLayoutCreate(&lay, dtype, rows, cols, lead), what);
  if (batch_count > 1) {
    const int32_t count = int32_t(batch_count);
    blas_check(gpuBlasLtMatrixLayoutSetAttribute(lay, GPU_BLASLT_LAYOUT_BATCH_COUNT, &count, sizeof(count)), what);
    blas_check(gpuBlasLtMatrixLayoutSetAttribute(lay, GPU_BLASLT_LAYOUT_BATCH_STRIDE, &batch_stride,
                                                 sizeof(batch_stride)),
               what);
  }
  return lay;
}

void make_layouts(Layouts& out, int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B,
                  int64_t ldc, const GemmBatch& batch, GemmType c_type) {
  // Our B stored [N,K] (trans) is column-major K x N: transposed. Stored [K,N]: N x K as is.
  const uint64_t l_rows = uint64_t(B.trans ? K : N), l_cols = uint64_t(B.trans ? N : K);
  // Our A stored [M,K] is column-major K x M as is; stored [K,M] (trans): M x K, transposed.
  const uint64_t r_rows = uint64_t(A.trans ? M : K), r_cols = uint64_t(A.trans ? K : M);
  out.l = make_layout(B.type, l_rows, l_cols, B.ld, batch.count, batch.stride_b, "layout B");
  out.r = make_layout(A.type, r_rows, r_cols, A.ld, batch.count, batch.stride_a, "layout A");
  out.c = make_layout(c_type, uint64_t(N), uint64_t(M), ldc, batch.count, batch.stride_c, "layout C");
}
#endif

// D[m * ldc + n] = C[m * ldc + n] for the [M, N] block of each batch item (stride elements apart).
__global__ void k_copy_block(const float* C, float* D, int64_t M, int64_t N, int64_t ldc, int64_t count,
                             int64_t stride) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count * M * N;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / (M * N), r = i % (M * N) / N, c = i % N;
    D[b * stride + r * ldc + c] = C[b * stride + r * ldc + c];
  }
}

__global__ void k_add_row_bias(float* C, const float* bias, int64_t M, int64_t N, int64_t ldc) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N; i += int64_t(gridDim.x) * blockDim.x)
    C[(i / N) * ldc + i % N] += bias[i % N];
}

}  // namespace

int64_t ragged_bound(int64_t x) {
  int64_t bound = 16;
  while (bound < x) bound *= 2;
  return bound;
}

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
  Layouts lay;  // of the shape the plan was built for
  gpuBlasLtHeuristic_t result{};
  bool found = false;
  ~Plan() {
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
                  float beta, float* C, int64_t ldc, const GemmBatch& batch, GemmCompute compute, GemmShape shape) {
  ZAYA_CHECK(A.type == B.type, "gemm: operand types differ");
  ZAYA_CHECK(batch.count >= 1, "gemm: batch count must be >= 1");
  if (M <= 0 || N <= 0) return;
  if (handle_ && K > 0 && run_blaslt(M, N, K, alpha, A, B, beta, C, ldc, batch, compute, shape)) return;
  const int64_t elem = A.type == GemmType::BF16 ? 2 : 4;
  for (int64_t i = 0; i < batch.count; ++i) {
    GemmOperand a = A, b = B;
    a.ptr = static_cast<const char*>(A.ptr) + i * batch.stride_a * elem;
    b.ptr = static_cast<const char*>(B.ptr) + i * batch.stride_b * elem;
    gemm_tiled(stream_, M, N, K, alpha, a, b, beta, C + i * batch.stride_c, ldc);
  }
}

void GpuGemm::run_into(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                       float beta, const float* C_in, float* D, int64_t ldc, const GemmBatch& batch,
                       GemmCompute compute) {
  ZAYA_CHECK(A.type == B.type, "gemm: operand types differ");
  ZAYA_CHECK(batch.count >= 1, "gemm: batch count must be >= 1");
  if (M <= 0 || N <= 0) return;
  if (beta == 0.0f || C_in == D) return run(M, N, K, alpha, A, B, beta, D, ldc, batch, compute);
  if (handle_ && K > 0 &&
      run_blaslt(M, N, K, alpha, A, B, beta, D, ldc, batch, compute, GemmShape::Fixed, nullptr, C_in))
    return;
  gpu_launch(k_copy_block, gpu_blocks(batch.count * M * N), kGpuThreads, 0, stream_, C_in, D, M, N, ldc,
             batch.count, batch.stride_c);
  GPU_LAUNCH_CHECK();
  run(M, N, K, alpha, A, B, beta, D, ldc, batch, compute);
}

bool GpuGemm::run_bf16_out(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                           float beta, const uint16_t* C_in, uint16_t* D, int64_t ldc, const GemmBatch& batch) {
  ZAYA_CHECK(A.type == B.type, "gemm: operand types differ");
  ZAYA_CHECK(batch.count >= 1, "gemm: batch count must be >= 1");
  if (M <= 0 || N <= 0) return true;
  if (!handle_ || K <= 0) return false;
  const void* c_in = beta == 0.0f || C_in == D ? nullptr : C_in;  // nullptr: C is D itself
  return run_blaslt(M, N, K, alpha, A, B, beta, D, ldc, batch, GemmCompute::Exact, GemmShape::Fixed, nullptr, c_in,
                    GemmType::BF16);
}

void GpuGemm::run_bias(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                       float beta, float* C, int64_t ldc, const float* bias, GemmCompute compute) {
  if (!bias) return run(M, N, K, alpha, A, B, beta, C, ldc, {}, compute);
  ZAYA_CHECK(A.type == B.type, "gemm: operand types differ");
  if (M <= 0 || N <= 0) return;
#if defined(ZAYA_GPU_BLASLT)
  if (handle_ && K > 0 && alignment_of(bias) >= kEpilogueBiasAlignment) {
    if (run_blaslt(M, N, K, alpha, A, B, beta, C, ldc, {}, compute, GemmShape::Fixed, bias)) return;
    ++epilogue_fallbacks_;  // no algorithm with the epilogue, or the call refused it
  }
#endif
  run(M, N, K, alpha, A, B, beta, C, ldc, {}, compute);
  gpu_launch(k_add_row_bias, gpu_blocks(M * N), kGpuThreads, 0, stream_, C, bias, M, N, ldc);
  GPU_LAUNCH_CHECK();
}

GpuGemm::Plan* GpuGemm::plan_for(int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B,
                                 const void* C, int64_t ldc, const GemmBatch& batch, GemmCompute compute,
                                 GemmShape shape, const float* bias, GemmType c_type) {
#if defined(ZAYA_GPU_BLASLT)
  const int64_t pm = shape == GemmShape::RaggedM ? ragged_bound(M) : M;
  const int64_t pk = shape == GemmShape::RaggedK ? ragged_bound(K) : K;
  const uint32_t al_l = alignment_of(B.ptr), al_r = alignment_of(A.ptr), al_c = alignment_of(C);
  std::vector<int64_t> key = {pm, N, pk, int64_t(A.type), A.ld, A.trans, B.ld, B.trans, ldc, al_l, al_r, al_c,
                              batch.count, batch.stride_a, batch.stride_b, batch.stride_c, int64_t(compute),
                              int64_t(shape), bias ? int64_t(alignment_of(bias)) : 0, int64_t(c_type)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  // Shapes outside the few dozen a step repeats (ragged ones included) could still grow the
  // cache without end; past kMaxPlans it starts over (a plan only matters while its
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
  // Column-major view (see Layouts): opL = op of our B, opR = op of our A.
  const gpuBlasOp_t op_l = B.trans ? GPU_BLAS_OP_T : GPU_BLAS_OP_N;
  const gpuBlasOp_t op_r = A.trans ? GPU_BLAS_OP_T : GPU_BLAS_OP_N;
  const auto compute_type = compute == GemmCompute::Tf32 && A.type == GemmType::F32 ? GPU_BLAS_COMPUTE_32F_FAST_TF32
                                                                                    : GPU_BLAS_COMPUTE_32F;
  blas_check(gpuBlasLtMatmulDescCreate(&plan->desc, compute_type, GPU_R_32F), "matmul desc");
  blas_check(gpuBlasLtMatmulDescSetAttribute(plan->desc, GPU_BLASLT_DESC_TRANSA, &op_l, sizeof(op_l)), "transa");
  blas_check(gpuBlasLtMatmulDescSetAttribute(plan->desc, GPU_BLASLT_DESC_TRANSB, &op_r, sizeof(op_r)), "transb");
  if (bias) {  // the bias vector runs along D's column-major rows: our N columns, as wanted
    const gpuBlasLtEpilogue_t epilogue = GPU_BLASLT_EPILOGUE_BIAS;
    blas_check(gpuBlasLtMatmulDescSetAttribute(plan->desc, GPU_BLASLT_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
               "epilogue");
    const gpuDataType_t bias_type = GPU_R_32F;  // fp32 like C (not the operands' bf16)
    blas_check(gpuBlasLtMatmulDescSetAttribute(plan->desc, GPU_BLASLT_DESC_BIAS_DATA_TYPE, &bias_type,
                                               sizeof(bias_type)),
               "bias type");
    blas_check(gpuBlasLtMatmulDescSetAttribute(plan->desc, GPU_BLASLT_DESC_BIAS_POINTER, &bias, sizeof(bias)),
               "bias pointer");
  }
  make_layouts(plan->lay, pm, N, pk, A, B, ldc, batch, c_type);
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
  gpuBlasStatus_t hs = gpuBlasLtAlgoGetHeuristic(handle, plan->desc, plan->lay.l, plan->lay.r, plan->lay.c,
                                                 plan->lay.c, pref, 1, &plan->result, &found);
  plan->found = hs == GPU_BLAS_SUCCESS && found > 0;
  gpuBlasLtPreferenceDestroy(pref);
  ++plans_built_;
  plan_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return plan;
#else
  (void)M, (void)N, (void)K, (void)A, (void)B, (void)C, (void)ldc, (void)batch, (void)compute, (void)shape;
  (void)bias, (void)c_type;
  return nullptr;
#endif
}

bool GpuGemm::run_blaslt(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                         float beta, void* C, int64_t ldc, const GemmBatch& batch, GemmCompute compute,
                         GemmShape shape, const float* bias, const void* c_in, GemmType c_type) {
#if defined(ZAYA_GPU_BLASLT)
  // The plan promises the heuristic the alignment of C and D: the less aligned of the two.
  const void* c_read = c_in ? c_in : C;
  const void* c_align = alignment_of(c_read) < alignment_of(C) ? c_read : C;
  Plan* plan = plan_for(M, N, K, A, B, c_align, ldc, batch, compute, shape, bias, c_type);
  if (!plan->found) return false;  // no algorithm for this shape/alignment: the caller uses the tiled kernel
  auto handle = static_cast<gpuBlasLtHandle_t>(handle_);
  if (bias)  // this call's vector (the plan is shared by every bias of its key)
    blas_check(gpuBlasLtMatmulDescSetAttribute(plan->desc, GPU_BLASLT_DESC_BIAS_POINTER, &bias, sizeof(bias)),
               "bias pointer");
  if (shape == GemmShape::Fixed) {
    const gpuBlasStatus_t st = gpuBlasLtMatmul(handle, plan->desc, &alpha, B.ptr, plan->lay.l, A.ptr, plan->lay.r,
                                               &beta, c_read, plan->lay.c, C, plan->lay.c, &plan->result.algo,
                                               workspace_, size_t(workspace_bytes_), stream_);
    if (st != GPU_BLAS_SUCCESS && bias) return false;  // refused with the epilogue: run_bias adds the bias
    blas_check(st, "BLASLt matmul");
    return true;
  }
  // Ragged: the bound's algorithm on layouts of the actual shape. Should the library refuse it
  // for this shape, an exact plan serves (and the refusal is counted).
  Layouts lay;
  make_layouts(lay, M, N, K, A, B, ldc, batch, c_type);
  const gpuBlasStatus_t st = gpuBlasLtMatmul(handle, plan->desc, &alpha, B.ptr, lay.l, A.ptr, lay.r, &beta, c_read,
                                             lay.c, C, lay.c, &plan->result.algo, workspace_,
                                             size_t(workspace_bytes_), stream_);
  if (st == GPU_BLAS_SUCCESS) return true;
  ++ragged_fallbacks_;
  return run_blaslt(M, N, K, alpha, A, B, beta, C, ldc, batch, compute, GemmShape::Fixed, bias, c_in, c_type);
#else
  (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)B, (void)beta, (void)C, (void)ldc, (void)batch, (void)compute;
  (void)shape, (void)bias, (void)c_in, (void)c_type;
  return false;
#endif
}

}  // namespace zaya
