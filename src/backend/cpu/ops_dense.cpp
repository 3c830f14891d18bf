// CPU dense ops: linear (CBLAS), embedding, RMSNorm, affine/residual scaling, GELU, softmax,
// router selection and cross-entropy. Row loops are OpenMP-parallel and vectorise under -O3.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace zaya {

void CpuBackend::linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K,
                        int64_t N, bool accumulate, int64_t ldy) {
  if (M == 0) return;
  if (ldy == 0) ldy = N;
  if (bias && !accumulate) {
#pragma omp parallel for if (M * N > 65536)
    for (int64_t m = 0; m < M; ++m) std::memcpy(y + m * ldy, bias, size_t(N) * 4);
    cpu_gemm(true, M, N, K, 1.0f, x, K, w, K, 1.0f, y, ldy);
    return;
  }
  cpu_gemm(true, M, N, K, 1.0f, x, K, w, K, accumulate ? 1.0f : 0.0f, y, ldy);
  if (bias) {
#pragma omp parallel for if (M * N > 65536)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * ldy + n] += bias[n];
  }
}

void CpuBackend::embedding(const float* table, const int32_t* ids, float* out, int64_t N, int64_t D) {
#pragma omp parallel for if (N * D > 65536)
  for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * D, table + int64_t(ids[n]) * D, size_t(D) * 4);
}

void CpuBackend::rmsnorm(const float* x, const float* w, float eps, float* y, int64_t rows, int64_t dim) {
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    float inv = float(1.0 / std::sqrt(ss / double(dim) + double(eps)));
    for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

void CpuBackend::affine(float* x, const float* scale, const float* bias, int64_t rows, int64_t dim) {
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * dim;
    for (int64_t i = 0; i < dim; ++i) xr[i] = (xr[i] + bias[i]) * scale[i];
  }
}

void CpuBackend::residual_scale(float* r, const float* h, const float* hs, const float* hb, const float* rs,
                                const float* rb, int64_t rows, int64_t dim) {
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t n = 0; n < rows; ++n) {
    float* rr = r + n * dim;
    const float* hr = h + n * dim;
    for (int64_t i = 0; i < dim; ++i) rr[i] = (hr[i] + hb[i]) * hs[i] + (rr[i] + rb[i]) * rs[i];
  }
}

// residual_scale then rmsnorm, one row at a time while it is in cache: the same arithmetic in
// the same order as the two ops, so the results are bitwise theirs.
void CpuBackend::residual_scale_rmsnorm(const ResidualNormArgs& a, float* r_out, float* y) {
  const int64_t dim = a.dim;
  const float *hs = a.hidden_scale, *hb = a.hidden_bias, *rs = a.residual_scale, *rb = a.residual_bias,
              *w = a.norm_weight;
#pragma omp parallel for if (a.rows * dim > 65536)
  for (int64_t n = 0; n < a.rows; ++n) {
    const float* rr = a.r + n * dim;
    const float* hr = a.h + n * dim;
    float* ro = r_out + n * dim;
    float* yr = y + n * dim;
    for (int64_t i = 0; i < dim; ++i) ro[i] = (hr[i] + hb[i]) * hs[i] + (rr[i] + rb[i]) * rs[i];  // vectorised
    double ss = 0;  // a sequential double sum, as rmsnorm's
    for (int64_t i = 0; i < dim; ++i) ss += double(ro[i]) * ro[i];
    const float inv = float(1.0 / std::sqrt(ss / double(dim) + double(a.eps)));
    for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (ro[i] * inv);
  }
}

void CpuBackend::scaled_add(float* y, const float* x, const float* scale, int64_t rows, int64_t dim) {
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t i = 0; i < dim; ++i) y[n * dim + i] += scale[i] * x[n * dim + i];
}

void CpuBackend::gelu(float* x, int64_t n) {
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * float(M_SQRT1_2)));
}

void CpuBackend::softmax(float* x, int64_t rows, int64_t cols) {
#pragma omp parallel for if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * cols;
    float mx = xr[0];
    for (int64_t i = 1; i < cols; ++i) mx = std::max(mx, xr[i]);
    double sum = 0;
    for (int64_t i = 0; i < cols; ++i) {
      xr[i] = std::exp(xr[i] - mx);
      sum += xr[i];
    }
    float inv = float(1.0 / sum);
    for (int64_t i = 0; i < cols; ++i) xr[i] *= inv;
  }
}

void CpuBackend::route_select(const float* probs, const float* bias, int32_t* expert, float* weight, int64_t N,
                              int64_t classes) {
#pragma omp parallel for if (N > 4096)
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * classes;
    int64_t best = 0;
    float best_v = p[0] + bias[0];
    for (int64_t e = 1; e < classes; ++e) {
      float v = p[e] + bias[e];
      if (v > best_v) { best_v = v; best = e; }
    }
    expert[n] = int32_t(best);
    weight[n] = p[best];
  }
}

}  // namespace zaya
