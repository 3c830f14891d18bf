// CPU optimizer ops: Newton-Schulz orthogonalisation (CBLAS GEMMs), the Muon momentum and
// update kernels, AdamW, and the reductions used by gradient clipping (OpenMP).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace zaya {

void backend_op_missing(const std::string& backend, const char* op) {
  fail("backend", "the '" + backend + "' backend does not implement the optimizer op '" + op + "'",
       "run training on a backend that provides it (the cpu backend implements every op)");
}

namespace {

constexpr double kNsA = 3.4445, kNsB = -4.7750, kNsC = 2.0315;
constexpr double kNsNormEps = 1e-7;
constexpr int64_t kParallelMin = 1 << 15;

// Sum of squares in fixed-size blocks added in block order: bitwise reproducible whatever the
// thread count or timing (an OpenMP reduction is not), which exact resume relies on.
double sum_sq(const float* x, int64_t n) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    double s = 0;
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) s += double(x[i]) * double(x[i]);
    part[size_t(b)] = s;
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

}  // namespace

void CpuBackend::newton_schulz(float* x, int64_t rows, int64_t cols, int steps) {
  ZAYA_CHECK(rows >= 0 && cols >= 0 && steps >= 0, "newton_schulz: bad shape or step count");
  if (rows == 0 || cols == 0) return;
  const bool transposed = rows > cols;
  const int64_t r = transposed ? cols : rows;  // X is [r, c] with r <= c
  const int64_t c = transposed ? rows : cols;
  const int64_t n = r * c;
  const float inv = float(1.0 / (std::sqrt(sum_sq(x, n)) + kNsNormEps));

  // Uninitialised workspace: every element is written before it is read.
  std::unique_ptr<float[]> xb(new float[size_t(n)]), yb(new float[size_t(n)]);
  std::unique_ptr<float[]> A(new float[size_t(r * r)]), B(new float[size_t(r * r)]);
  float* X = xb.get();
  float* Y = yb.get();
  if (transposed) {
    // x is [rows = c, cols = r]; X[i, j] = x[j, i]
#pragma omp parallel for if (n > kParallelMin)
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) X[i * c + j] = x[j * r + i] * inv;
  } else {
#pragma omp parallel for if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) X[i] = x[i] * inv;
  }
  // A and B are symmetric: SYRK computes half of each product and SYMM reads only the upper
  // triangle, 4 r^2 c + ... instead of 6 r^3 FLOPs per iteration for a square matrix.
  auto mirror_upper = [r](float* M) {
    for (int64_t i = 1; i < r; ++i)
      for (int64_t j = 0; j < i; ++j) M[i * r + j] = M[j * r + i];
  };
  for (int s = 0; s < steps; ++s) {
    // A = X X^T (upper triangle, then mirrored: A is the full input of the next product)
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, int(r), int(c), 1.0f, X, int(c), 0.0f, A.get(), int(r));
    mirror_upper(A.get());
    // B = b A + c A A^T (upper triangle only; SYMM below reads just that)
    std::memcpy(B.get(), A.get(), size_t(r * r) * sizeof(float));
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, int(r), int(r), float(kNsC), A.get(), int(r), float(kNsB),
                B.get(), int(r));
    // Y = a X + B X
    std::memcpy(Y, X, size_t(n) * sizeof(float));
    cblas_ssymm(CblasRowMajor, CblasLeft, CblasUpper, int(r), int(c), 1.0f, B.get(), int(r), X, int(c), float(kNsA), Y,
                int(c));
    std::swap(X, Y);
  }
  if (transposed) {
#pragma omp parallel for if (n > kParallelMin)
    for (int64_t j = 0; j < c; ++j)
      for (int64_t i = 0; i < r; ++i) x[j * r + i] = X[i * c + j];
  } else {
    std::memcpy(x, X, size_t(n) * sizeof(float));
  }
}

namespace {
// Whether a GEMM called inside an OpenMP parallel region runs on the calling thread alone: true
// of OpenBLAS's OpenMP build and of a sequential one; its pthreads build would start threads of
// its own in every call. Other CBLAS libraries are taken to behave like the OpenMP build.
bool blas_serial_in_parallel_regions() {
#if defined(OPENBLAS_THREAD)
  return openblas_get_parallel() != OPENBLAS_THREAD;
#else
  return true;
#endif
}
}  // namespace

// When a tensor has at least as many experts as there are threads, they run one matrix per
// thread, each with serial GEMMs: GEMMs of a few hundred rows split over the threads spend much
// of their time waiting at barriers. Each matrix is computed exactly as newton_schulz computes it
// on one thread. Fewer experts than threads (a many-core machine) keep every thread on each GEMM.
void CpuBackend::newton_schulz_batched(float* x, int64_t batch, int64_t rows, int64_t cols, int steps) {
  ZAYA_CHECK(batch >= 0, "newton_schulz_batched: negative batch");
  const int threads = omp_get_max_threads();
  if (threads < 2 || batch < threads || !blas_serial_in_parallel_regions()) {
    for (int64_t i = 0; i < batch; ++i) newton_schulz(x + i * rows * cols, rows, cols, steps);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(batch));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < batch; ++i) {
    try {
      newton_schulz(x + i * rows * cols, rows, cols, steps);
    } catch (...) {  // an exception must not leave the parallel region
      errors[size_t(i)] = std::current_exception();
    }
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void CpuBackend::muon_momentum(float* m, const float* g, float* u, int64_t n, float mu, bool nesterov) {
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float mi = mu * m[i] + g[i];
    m[i] = mi;
    u[i] = nesterov ? g[i] + mu * mi : mi;
  }
}

void CpuBackend::muon_update(float* w, const float* x, int64_t n, float lr, float scale, float wd) {
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) w[i] -= lr * (scale * x[i] + wd * w[i]);
}

void CpuBackend::adamw_update(float* w, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                              float beta2, float eps, float wd, int64_t t) {
  ZAYA_CHECK(t >= 1, "adamw_update: step count must be >= 1");
  const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(beta1), double(t))));
  const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(beta2), double(t))));
  const float c1 = float(1.0 - double(beta1)), c2 = float(1.0 - double(beta2));
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + c1 * gi;
    const float vi = beta2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float step = (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps);
    w[i] -= lr * (step + wd * w[i]);
  }
}

double CpuBackend::sum_squares(const float* x, int64_t n) { return sum_sq(x, n); }

void CpuBackend::scale_inplace(float* x, float s, int64_t n) {
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace zaya
