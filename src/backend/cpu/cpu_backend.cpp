// CPU backend: memory, copies, the GEMM wrapper and the backend factory.
#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>

#include "backend/cpu/host_allocator.h"
#include "backend/cuda/cuda_factory.h"  // plain C++: the GPU backend's options and entry points
#include "core/error.h"

namespace zaya {

CpuBackend::CpuBackend() { keep_large_blocks_in_heap(); }

float* CpuBackend::alloc(int64_t n) {
  size_t bytes = (size_t(n < 1 ? 1 : n) * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) fail("cpu", "out of memory allocating " + std::to_string(bytes) + " bytes");
  return static_cast<float*>(p);
}

void CpuBackend::free(void* p) { std::free(p); }

void CpuBackend::copy(float* dst, const float* src, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }

void CpuBackend::fill(float* dst, float value, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = value;
}

void CpuBackend::to_host(void* host, const void* src, int64_t bytes) { std::memcpy(host, src, size_t(bytes)); }
void CpuBackend::from_host(void* dst, const void* host, int64_t bytes) { std::memcpy(dst, host, size_t(bytes)); }

namespace {

// C[M, N] = alpha * A[M, K] . B[N, K]^T + beta * C for a handful of rows (a batch of decoding
// sequences, a lightly loaded expert): each row of B (a weight row) is read once, from memory,
// for every row of A, four rows at a time. A general sgemm would repack all of B first, which
// for so few rows costs more than the product itself.
constexpr int64_t kFewRows = 16;

void few_rows_gemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  auto store = [&](int64_t m, int64_t n, float dot) {
    float& c = C[m * ldc + n];
    c = alpha * dot + (beta == 0.0f ? 0.0f : beta * c);
  };
#pragma omp parallel for schedule(static) if (N * K >= (int64_t(1) << 16) && !omp_in_parallel())
  for (int64_t n = 0; n < N; ++n) {
    const float* b = B + n * ldb;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) {
      const float *a0 = A + m * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t k = 0; k < K; ++k) {
        s0 += a0[k] * b[k];
        s1 += a1[k] * b[k];
        s2 += a2[k] * b[k];
        s3 += a3[k] * b[k];
      }
      store(m, n, s0);
      store(m + 1, n, s1);
      store(m + 2, n, s2);
      store(m + 3, n, s3);
    }
    for (; m < M; ++m) {
      const float* a = A + m * lda;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
      store(m, n, s);
    }
  }
}

}  // namespace

void cpu_gemm(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (M == 1) {  // one row (decode): a matrix-vector product streams B without repacking it
    cblas_sgemv(CblasRowMajor, trans_b ? CblasNoTrans : CblasTrans, int(trans_b ? N : K), int(trans_b ? K : N), alpha,
                B, int(ldb), A, 1, beta, C, 1);
    return;
  }
  if (trans_b && M <= kFewRows) {
    few_rows_gemm_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha, A,
              int(lda), B, int(ldb), beta, C, int(ldc));
}

void cpu_gemm_tn(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta,
              C, int(ldc));
}

void run_team(bool parallel, const std::function<void()>& body) {
  if (!parallel) {
    body();
    return;
  }
#pragma omp parallel
  body();
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

namespace {
GpuBackendMaker& registered_gpu_backend() {
  static GpuBackendMaker maker;
  return maker;
}
}  // namespace

void register_gpu_backend(GpuBackendMaker maker) { registered_gpu_backend() = std::move(maker); }

void check_attention_rows(const AttentionArgs& a, const std::string& backend, const char* op) {
  for (int64_t b = 0; b < a.B; ++b) {
    if (a.pos0[b] >= 0 && a.pos0[b] + a.T <= a.S) continue;
    fail(backend, std::string(op) + ": sequence " + std::to_string(b) + " has its " + std::to_string(a.T) +
                      " queries at positions " + std::to_string(a.pos0[b]) + ".." + std::to_string(a.pos0[b] + a.T - 1) +
                      " but the key/value cache holds " + std::to_string(a.S) + " rows",
         "pos0[b] + T must be at most S (a caller bug: the cache must cover every query's position)");
  }
}

std::unique_ptr<Backend> make_backend(const std::string& name, int device) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda" || name == "cuda-fp32") {
#ifdef ZAYA_CUDA
    return make_cuda_backend(cuda_backend_options_for(name, device, cuda_device_count()));
#else
    if (registered_gpu_backend()) return registered_gpu_backend()(name, device);
    fail("backend", "zaya was built without CUDA; configure with -DZAYA_CUDA=ON");
#endif
  }
#ifdef ZAYA_CUDA
  fail("backend", "unknown backend '" + name + "'", "this build has: cpu, cuda, cuda-fp32");
#else
  fail("backend", "unknown backend '" + name + "'", "this build has: cpu");
#endif
}

}  // namespace zaya
