// GPU backward of the dense ops: linear (two GEMMs + a column sum), embedding (tokens grouped
// by id on the host, each id's rows added in token order: no atomics), RMSNorm, affine, the
// residual merge fused with the RMSNorm that reads the merged stream, EDA scaled-add, GELU,
// softmax and routing (the LM head fused with the loss: ops_lm_head.cu). Parameter gradients
// use the deterministic column sums of gpu_common.cu. Passed against the CPU backend on an H100.
#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace zaya {

namespace {

constexpr float kGeluGradSqrtHalf = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// One block per distinct token id (blockIdx.x strides over them), threads over the columns:
// the id's rows are added in token order, the CPU backend's summation order.
__global__ void k_embedding_backward(const int32_t* unique_ids, const int32_t* starts, const int32_t* order,
                                     int64_t unique, const float* dout, float* dtable, int64_t D) {
  for (int64_t u = blockIdx.x; u < unique; u += gridDim.x) {
    float* row = dtable + int64_t(unique_ids[u]) * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      float s = row[j];
      for (int32_t k = starts[u]; k < starts[u + 1]; ++k) s += dout[int64_t(order[k]) * D + j];
      row[j] = s;
    }
  }
}

// A row's RMSNorm backward statistics over one block: iv = 1/rms(x) and c = (w . dy . x) iv^3 /
// dim, the coefficient of x in dx = iv w dy - c x (block sums in double), in every thread.
struct RmsRowStats {
  double iv, c;
};
__device__ RmsRowStats rmsnorm_row_stats(const float* xr, const float* w, const float* dyr, float eps, int64_t dim,
                                         double* sh) {
  double ss = 0, dot = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    ss += double(xr[i]) * xr[i];
    dot += double(w[i]) * dyr[i] * xr[i];
  }
  ss = block_sum(ss, sh);
  dot = block_sum(dot, sh);
  const double iv = 1.0 / sqrt(ss / double(dim) + double(eps));
  return {iv, dot * iv * iv * iv / double(dim)};
}

__global__ void k_rmsnorm_backward(const float* x, const float* w, const float* dy, float eps, float* dx, float* inv,
                                   int64_t dim, int accumulate_dx) {
  __shared__ double sh[kGpuThreads];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  const float* dyr = dy + r * dim;
  float* dxr = dx + r * dim;
  const RmsRowStats st = rmsnorm_row_stats(xr, w, dyr, eps, dim, sh);
  const double iv = st.iv, c = st.c;
  if (threadIdx.x == 0) inv[r] = float(iv);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = float(iv * w[i] * dyr[i] - c * xr[i]);
    dxr[i] = accumulate_dx ? dxr[i] + g : g;
  }
}

// residual_scale_rmsnorm's backward, first half: each row's 1/rms and the norm's projection
// coefficient c = (w . dy . x) / (dim rms^3), as k_rmsnorm_backward computes them.
__global__ void k_residual_norm_row_stats(const float* x, const float* w, const float* dy, float eps, double* stats,
                                          int64_t dim) {
  __shared__ double sh[kGpuThreads];
  const int64_t r = blockIdx.x;
  const RmsRowStats st = rmsnorm_row_stats(x + r * dim, w, dy + r * dim, eps, dim, sh);
  if (threadIdx.x == 0) {
    stats[2 * r] = st.iv;
    stats[2 * r + 1] = st.c;
  }
}

// Second half, a thread per column over a chunk of rows (gpu_column_chunks): the gradient of the
// merged stream g = dr + the norm's, its five parameter gradients' partial sums (the products
// gpu_column_sums would form, in the same order), dh = g hs and dr = g rs. part holds five
// [chunks, dim] blocks: norm weight, hidden scale, hidden bias, residual scale, residual bias.
__global__ void k_residual_norm_backward_columns(const float* r, const float* h, const float* hs, const float* hb,
                                                 const float* rs, const float* rb, const float* w, const float* x,
                                                 const float* dy, const double* stats, float* dr, float* dh,
                                                 int64_t rows, int64_t dim, int64_t rows_per_chunk, double* part) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  const float wj = w[j], hsj = hs[j], rsj = rs[j];
  const double hbj = hb[j], rbj = rb[j];
  double sw = 0, shs = 0, shb = 0, srs = 0, srb = 0;
  for (int64_t n = r0; n < r1; ++n) {
    const int64_t i = n * dim + j;
    const double iv = stats[2 * n], c = stats[2 * n + 1];
    const float xi = x[i], dyi = dy[i];
    sw += double(dyi) * double(xi) * double(float(iv));
    const float g = dr[i] + float(iv * wj * dyi - c * xi);
    shs += double(g) * (double(h[i]) + hbj);
    shb += double(g) * hsj;
    srs += double(g) * (double(r[i]) + rbj);
    srb += double(g) * rsj;
    dh[i] = g * hsj;
    dr[i] = g * rsj;
  }
  const int64_t block = int64_t(gridDim.y) * dim, at = int64_t(blockIdx.y) * dim + j;
  part[at] = sw;
  part[block + at] = shs;
  part[2 * block + at] = shb;
  part[3 * block + at] = srs;
  part[4 * block + at] = srb;
}

__global__ void k_scale_columns(float* d, const float* scale, int64_t rows, int64_t dim) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * dim;
       i += int64_t(gridDim.x) * blockDim.x)
    d[i] *= scale[i % dim];
}

__global__ void k_scaled_add_dx(const float* dy, const float* scale, float* dx, int64_t rows, int64_t dim) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * dim;
       i += int64_t(gridDim.x) * blockDim.x)
    dx[i] += dy[i] * scale[i % dim];
}

__global__ void k_gelu_backward(const float* x, float* d, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + erff(v * kGeluGradSqrtHalf));
    d[i] *= cdf + v * kInvSqrt2Pi * expf(-0.5f * v * v);
  }
}

__global__ void k_softmax_backward(const float* p, float* d, int64_t cols) {
  __shared__ double sh[kGpuThreads];
  const float* pr = p + int64_t(blockIdx.x) * cols;
  float* dr = d + int64_t(blockIdx.x) * cols;
  double dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dot += double(pr[c]) * dr[c];
  dot = block_sum(dot, sh);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dr[c] = float(pr[c] * (dr[c] - dot));
}

__global__ void k_route_backward(const int32_t* expert, const float* dweight, float* dprobs, int64_t N,
                                 int64_t classes) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n < N) dprobs[n * classes + expert[n]] = dweight[n];
}

}  // namespace

void CudaBackend::linear_backward_impl(const float* x, const float* w, const float* dy, float* dx, float* dw,
                                       float* db, int64_t M, int64_t K, int64_t N, bool accumulate_dx, int64_t lddy,
                                       bool bf16) {
  if (M == 0) return;
  if (lddy == 0) lddy = N;
  DeviceBuffer hdy, hw, hx;
  GemmOperand dyo = operand(dy, M, N, lddy, false, bf16, hdy);
  if (dx) {
    const GemmOperand wo = operand(w, N, K, K, false, bf16, hw);  // op(B) = W [N, K]
    gemm(M, K, N, 1.0f, dyo, wo, accumulate_dx ? 1.0f : 0.0f, dx, K);
  }
  if (dw) {
    GemmOperand dyt = dyo;
    dyt.trans = true;  // op(A) = dy^T [N, M]
    const GemmOperand xo = operand(x, M, K, K, false, bf16, hx);
    gemm(N, K, M, 1.0f, dyt, xo, 1.0f, dw, K);
  }
  if (db) gpu_column_sums(*this, M, N, db, dy, lddy, nullptr, nullptr, nullptr, nullptr);
}

void CudaBackend::linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                                  int64_t M, int64_t K, int64_t N, bool accumulate_dx, int64_t lddy) {
  linear_backward_impl(x, w, dy, dx, dw, db, M, K, N, accumulate_dx, lddy, options_.bf16_matmul);
}

void CudaBackend::embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t D) {
  if (N * D == 0) return;
  // The tokens grouped by id on the host (a stable sort keeps each id's rows in token order).
  std::vector<int32_t> host_ids(static_cast<size_t>(N)), order(static_cast<size_t>(N));
  to_host(host_ids.data(), ids, N * 4);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return host_ids[size_t(a)] < host_ids[size_t(b)]; });
  std::vector<int32_t> unique_ids, starts;
  for (int64_t k = 0; k < N; ++k) {
    const int32_t id = host_ids[size_t(order[size_t(k)])];
    if (k == 0 || id != unique_ids.back()) {
      unique_ids.push_back(id);
      starts.push_back(int32_t(k));
    }
  }
  starts.push_back(int32_t(N));
  const int64_t U = int64_t(unique_ids.size());
  DeviceBuffer uid = upload(unique_ids.data(), U * 4), st = upload(starts.data(), (U + 1) * 4),
               ord = upload(order.data(), N * 4);
  const unsigned threads = D >= kGpuThreads ? kGpuThreads : 64;
  gpu_launch(k_embedding_backward, unsigned(std::min<int64_t>(U, 65535)), threads, 0, stream_, uid.i(),
             st.i(), ord.i(), U, dout, dtable, D);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::rmsnorm_backward(const float* x, const float* w, const float* dy, float eps, float* dx, float* dw,
                                   int64_t rows, int64_t dim, bool accumulate_dx) {
  if (rows == 0) return;
  DeviceBuffer inv(this, rows * 4);
  gpu_launch(k_rmsnorm_backward, unsigned(rows), kGpuThreads, 0, stream_, x, w, dy, eps, dx, inv.f(), dim,
             accumulate_dx);
  GPU_LAUNCH_CHECK();
  gpu_column_sums(*this, rows, dim, dw, dy, dim, x, nullptr, nullptr, inv.f());
}

void CudaBackend::affine_backward(const float* x, const float* scale, const float* bias, float* d, float* dscale,
                                  float* dbias, int64_t rows, int64_t dim) {
  if (rows * dim == 0) return;
  gpu_column_sums(*this, rows, dim, dscale, d, dim, x, bias, nullptr, nullptr);
  gpu_column_sums(*this, rows, dim, dbias, d, dim, nullptr, nullptr, scale, nullptr);
  gpu_launch(k_scale_columns, gpu_blocks(rows * dim), kGpuThreads, 0, stream_, d, scale, rows, dim);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::residual_scale_rmsnorm_backward(const ResidualNormArgs& a, const float* r_out, const float* dy,
                                                  float* dr, float* dh, const ResidualNormGrads& g) {
  if (a.rows * a.dim == 0) return;
  DeviceBuffer stats(this, a.rows * 2 * 8);
  gpu_launch(k_residual_norm_row_stats, unsigned(a.rows), kGpuThreads, 0, stream_, r_out, a.norm_weight, dy, a.eps,
             stats.d(), a.dim);
  GPU_LAUNCH_CHECK();
  const GpuColumnChunks plan = gpu_column_chunks(a.rows);
  constexpr int kSums = 5;
  DeviceBuffer part(this, kSums * plan.chunks * a.dim * 8);
  const dim3 grid(unsigned((a.dim + kGpuThreads - 1) / kGpuThreads), unsigned(plan.chunks));
  gpu_launch(k_residual_norm_backward_columns, grid, kGpuThreads, 0, stream_, a.r, a.h, a.hidden_scale,
             a.hidden_bias, a.residual_scale, a.residual_bias, a.norm_weight, r_out, dy, stats.d(), dr, dh, a.rows,
             a.dim, plan.rows_per_chunk, part.d());
  GPU_LAUNCH_CHECK();
  float* outs[kSums] = {g.norm_weight, g.hidden_scale, g.hidden_bias, g.residual_scale, g.residual_bias};
  for (int k = 0; k < kSums; ++k)
    gpu_column_finish(*this, a.dim, plan.chunks, part.d() + int64_t(k) * plan.chunks * a.dim, outs[k]);
}

void CudaBackend::scaled_add_backward(const float* x, const float* scale, const float* dy, float* dx, float* dscale,
                                      int64_t rows, int64_t dim) {
  if (rows * dim == 0) return;
  gpu_column_sums(*this, rows, dim, dscale, dy, dim, x, nullptr, nullptr, nullptr);
  gpu_launch(k_scaled_add_dx, gpu_blocks(rows * dim), kGpuThreads, 0, stream_, dy, scale, dx, rows, dim);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::gelu_backward(const float* x, float* d, int64_t n) {
  if (n == 0) return;
  gpu_launch(k_gelu_backward, gpu_blocks(n), kGpuThreads, 0, stream_, x, d, n);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::softmax_backward(const float* p, float* d, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  gpu_launch(k_softmax_backward, unsigned(rows), kGpuThreads, 0, stream_, p, d, cols);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::route_backward(const int32_t* expert, const float* dweight, float* dprobs, int64_t N,
                                 int64_t classes) {
  if (N == 0) return;
  fill(dprobs, 0.0f, N * classes);
  gpu_launch(k_route_backward, gpu_blocks(N), kGpuThreads, 0, stream_, expert, dweight, dprobs, N, classes);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
