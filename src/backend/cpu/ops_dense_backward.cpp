// CPU backward of the dense ops: linear, embedding, RMSNorm, affine and residual scaling,
// EDA scaled-add, GELU, softmax, routing, and the LM head fused with cross-entropy in chunks.
// Parameter gradients are reduced over rows with per-thread partial sums (no races).
#include <omp.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vector_math.h"

namespace zaya {

namespace {

// out[j] += sum_r term(r, j). Rows are split statically across threads, each with its own
// partial row, and the partials are added in thread order, so results are bitwise
// reproducible for a given thread count (exact resume depends on it).
template <class Term>
void reduce_columns(int64_t rows, int64_t dim, float* out, Term term) {
  if (!out) return;
  const bool threaded = rows * dim > 65536;
  const int max_threads = threaded ? omp_get_max_threads() : 1;
  std::vector<double> parts(static_cast<size_t>(max_threads * dim), 0.0);
#pragma omp parallel if (threaded)
  {
    double* part = parts.data() + size_t(omp_get_thread_num()) * size_t(dim);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < dim; ++j) part[j] += term(r, j);
  }
  for (int t = 0; t < max_threads; ++t)
    for (int64_t j = 0; j < dim; ++j) out[j] += float(parts[size_t(t) * size_t(dim) + size_t(j)]);
}

// A row's RMSNorm backward statistics: iv = 1/rms(x) and c = (w . dy . x) iv^3 / dim, the
// coefficient of x in dx = iv w dy - c x (sums in double, in element order).
struct RmsRowStats {
  double iv, c;
};
RmsRowStats rmsnorm_row_stats(const float* x, const float* w, const float* dy, float eps, int64_t dim) {
  double ss = 0, dot = 0;
  for (int64_t i = 0; i < dim; ++i) {
    ss += double(x[i]) * x[i];
    dot += double(w[i]) * dy[i] * x[i];
  }
  const double iv = 1.0 / std::sqrt(ss / double(dim) + double(eps));
  return {iv, dot * iv * iv * iv / double(dim)};
}

}  // namespace

void cpu_column_sums(int64_t rows, int64_t dim, float* out, const float* a, const float* b) {
  if (b) reduce_columns(rows, dim, out, [&](int64_t r, int64_t j) { return double(a[r * dim + j]) * b[r * dim + j]; });
  else reduce_columns(rows, dim, out, [&](int64_t r, int64_t j) { return double(a[r * dim + j]); });
}

void CpuBackend::linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                                 int64_t M, int64_t K, int64_t N, bool accumulate_dx, int64_t lddy) {
  if (M == 0) return;
  if (lddy == 0) lddy = N;
  if (dx) cpu_gemm(false, M, K, N, 1.0f, dy, lddy, w, K, accumulate_dx ? 1.0f : 0.0f, dx, K);
  if (dw) cpu_gemm_tn(N, K, M, 1.0f, dy, lddy, x, K, 1.0f, dw, K);
  if (db) reduce_columns(M, N, db, [&](int64_t r, int64_t j) { return double(dy[r * lddy + j]); });
}

void CpuBackend::embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; ++n) {
    float* row = dtable + int64_t(ids[n]) * D;
    const float* d = dout + n * D;
    for (int64_t i = 0; i < D; ++i) row[i] += d[i];
  }
}

void CpuBackend::rmsnorm_backward(const float* x, const float* w, const float* dy, float eps, float* dx, float* dw,
                                  int64_t rows, int64_t dim, bool accumulate_dx) {
  std::vector<float> inv(static_cast<size_t>(rows));
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* dyr = dy + r * dim;
    const auto [iv, c] = rmsnorm_row_stats(xr, w, dyr, eps, dim);
    inv[size_t(r)] = float(iv);
    float* dxr = dx + r * dim;
    for (int64_t i = 0; i < dim; ++i) {
      float g = float(iv * w[i] * dyr[i] - c * xr[i]);
      dxr[i] = accumulate_dx ? dxr[i] + g : g;
    }
  }
  reduce_columns(rows, dim, dw, [&](int64_t r, int64_t j) { return double(dy[r * dim + j]) * x[r * dim + j] * inv[size_t(r)]; });
}

void CpuBackend::affine_backward(const float* x, const float* scale, const float* bias, float* d, float* dscale,
                                 float* dbias, int64_t rows, int64_t dim) {
  reduce_columns(rows, dim, dscale, [&](int64_t r, int64_t j) { return double(d[r * dim + j]) * (x[r * dim + j] + bias[j]); });
  reduce_columns(rows, dim, dbias, [&](int64_t r, int64_t j) { return double(d[r * dim + j]) * scale[j]; });
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < dim; ++j) d[r * dim + j] *= scale[j];
}

void CpuBackend::residual_scale_backward(const float* r, const float* h, const float* hs, const float* hb,
                                         const float* rs, const float* rb, float* dr, float* dh, float* dhs,
                                         float* dhb, float* drs, float* drb, int64_t rows, int64_t dim) {
  reduce_columns(rows, dim, dhs, [&](int64_t n, int64_t j) { return double(dr[n * dim + j]) * (h[n * dim + j] + hb[j]); });
  reduce_columns(rows, dim, dhb, [&](int64_t n, int64_t j) { return double(dr[n * dim + j]) * hs[j]; });
  reduce_columns(rows, dim, drs, [&](int64_t n, int64_t j) { return double(dr[n * dim + j]) * (r[n * dim + j] + rb[j]); });
  reduce_columns(rows, dim, drb, [&](int64_t n, int64_t j) { return double(dr[n * dim + j]) * rs[j]; });
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t j = 0; j < dim; ++j) {
      const float g = dr[n * dim + j];
      dh[n * dim + j] = g * hs[j];
      dr[n * dim + j] = g * rs[j];
    }
}

namespace {

// One row of residual_scale_rmsnorm_backward after its statistics (iv = 1/rms, c = the norm's
// projection coefficient): the stream's gradient, the five parameter gradients' partial sums,
// dh and dr. No two pointers alias (restrict), so GCC vectorises the float-to-double products.
void residual_norm_backward_row(int64_t dim, double iv, double c, const float* __restrict x,
                                const float* __restrict dy, const float* __restrict r, const float* __restrict h,
                                const float* __restrict w, const float* __restrict hs, const float* __restrict hb,
                                const float* __restrict rs, const float* __restrict rb, float* __restrict dr,
                                float* __restrict dh, double* __restrict pw, double* __restrict phs,
                                double* __restrict phb, double* __restrict prs, double* __restrict prb) {
  const float inv = float(iv);
  for (int64_t i = 0; i < dim; ++i) {
    pw[i] += double(dy[i]) * x[i] * inv;
    const float grad = dr[i] + float(iv * w[i] * dy[i] - c * x[i]);  // d(r_out)
    phs[i] += double(grad) * (h[i] + hb[i]);
    phb[i] += double(grad) * hs[i];
    prs[i] += double(grad) * (r[i] + rb[i]);
    prb[i] += double(grad) * rs[i];
    dh[i] = grad * hs[i];
    dr[i] = grad * rs[i];
  }
}

}  // namespace

// rmsnorm_backward (accumulating into dr) then residual_scale_backward, one row at a time: the
// row's statistics, its gradient, the five parameter gradients' partial sums (per thread, rows
// split statically as reduce_columns splits them) and dh, dr, in one pass over the row. The same
// arithmetic in the same order as the two ops, so the results are bitwise theirs.
void CpuBackend::residual_scale_rmsnorm_backward(const ResidualNormArgs& a, const float* r_out, const float* dy,
                                                 float* dr, float* dh, const ResidualNormGrads& g) {
  const int64_t rows = a.rows, dim = a.dim;
  const float* w = a.norm_weight;
  const bool threaded = rows * dim > 65536;
  const int max_threads = threaded ? omp_get_max_threads() : 1;
  constexpr int kSums = 5;  // norm weight, hidden scale, hidden bias, residual scale, residual bias
  std::vector<double> parts(static_cast<size_t>(max_threads) * kSums * size_t(dim), 0.0);
#pragma omp parallel if (threaded)
  {
    double* pw = parts.data() + size_t(omp_get_thread_num()) * kSums * size_t(dim);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      const float* x = r_out + n * dim;
      const float* dyr = dy + n * dim;
      const auto [iv, c] = rmsnorm_row_stats(x, w, dyr, a.eps, dim);
      residual_norm_backward_row(dim, iv, c, x, dyr, a.r + n * dim, a.h + n * dim, w, a.hidden_scale, a.hidden_bias,
                                 a.residual_scale, a.residual_bias, dr + n * dim, dh + n * dim, pw, pw + dim,
                                 pw + 2 * dim, pw + 3 * dim, pw + 4 * dim);
    }
  }
  float* outs[kSums] = {g.norm_weight, g.hidden_scale, g.hidden_bias, g.residual_scale, g.residual_bias};
  for (int k = 0; k < kSums; ++k) {
    if (!outs[k]) continue;
    for (int t = 0; t < max_threads; ++t) {
      const double* part = parts.data() + (size_t(t) * kSums + size_t(k)) * size_t(dim);
      for (int64_t j = 0; j < dim; ++j) outs[k][j] += float(part[j]);
    }
  }
}

void CpuBackend::scaled_add_backward(const float* x, const float* scale, const float* dy, float* dx, float* dscale,
                                     int64_t rows, int64_t dim) {
  reduce_columns(rows, dim, dscale, [&](int64_t n, int64_t j) { return double(dy[n * dim + j]) * x[n * dim + j]; });
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t j = 0; j < dim; ++j) dx[n * dim + j] += dy[n * dim + j] * scale[j];
}

void CpuBackend::gelu_backward(const float* x, float* d, int64_t n) {
  const float inv_sqrt_2pi = 0.3989422804014327f;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + std::erf(v * float(M_SQRT1_2)));
    d[i] *= cdf + v * inv_sqrt_2pi * std::exp(-0.5f * v * v);
  }
}

void CpuBackend::softmax_backward(const float* p, float* d, int64_t rows, int64_t cols) {
#pragma omp parallel for if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) dot += double(p[r * cols + c]) * d[r * cols + c];
    for (int64_t c = 0; c < cols; ++c) d[r * cols + c] = float(p[r * cols + c] * (d[r * cols + c] - dot));
  }
}

void CpuBackend::route_backward(const int32_t* expert, const float* dweight, float* dprobs, int64_t N,
                                int64_t classes) {
  std::memset(dprobs, 0, size_t(N * classes) * 4);
  for (int64_t n = 0; n < N; ++n) dprobs[n * classes + expert[n]] = dweight[n];
}

double CpuBackend::lm_head_loss(const float* y, const float* w, const float* bias, const int32_t* target, int64_t N,
                                int64_t D, int64_t V, float scale, float* dy, float* dw, float* dbias) {
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(N, (int64_t(1) << 22) / V));  // ~16 MiB of logits
  // Uninitialised: each chunk's GEMM writes all of its rows before they are read.
  const std::unique_ptr<float[]> logits(new float[size_t(chunk * V)]);
  double total = 0;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    linear(y + r0 * D, w, bias, logits.get(), rows, D, V, false, 0);
    std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for if (rows * V > 65536)
    for (int64_t r = 0; r < rows; ++r) {
      float* l = logits.get() + r * V;
      const int32_t t = target[r0 + r];
      if (t < 0) {
        std::memset(l, 0, size_t(V) * 4);
        continue;
      }
      const float mx = max_of(l, V, -INFINITY);
      const float target_logit = l[t];
      // One exponential per logit, kept in place: the softmax is exp(l - max) / sum (the sum
      // accumulated in double).
      exp_shifted_inplace(l, V, mx);
      const double sum = sum_of(l, V);
      row_loss[size_t(r)] = std::log(sum) + double(mx) - double(target_logit);
      if (!dy) continue;
      const float p_scale = float(double(scale) / sum);
      for (int64_t v = 0; v < V; ++v) l[v] *= p_scale;
      l[t] -= scale;
    }
    for (double x : row_loss) total += x;  // fixed order: reproducible
    if (dy) linear_backward(y + r0 * D, w, logits.get(), dy + r0 * D, dw, dbias, rows, D, V, false, 0);
  }
  return total;
}

}  // namespace zaya
