// GPU dense ops: linear (internal GEMM, bf16 operands by policy; a few rows as GEMVs, also for
// several matrices of one input and with the GELU in the store), embedding, RMSNorm, affine,
// the residual merge fused with the RMSNorm that reads the merged stream, EDA scaled-add, GELU,
// softmax, router selection. Everything except the GEMM operands is fp32 (spec A.11). Passed
// against the CPU backend on an H100.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_gemv.h"

namespace zaya {

namespace {

__global__ void k_embedding(const float* table, const int32_t* ids, float* out, int64_t N, int64_t D) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * D; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = table[int64_t(ids[i / D]) * D + i % D];
}

// One row (a block) of the RMSNorm, given the sum of squares of this thread's elements of xr.
__device__ inline void rmsnorm_row(const float* xr, const float* w, float eps, float* yr, int64_t dim, double ss) {
  __shared__ double sh[kGpuThreads];
  ss = block_sum(ss, sh);
  const float inv = float(1.0 / sqrt(ss / double(dim) + double(eps)));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

__global__ void k_rmsnorm(const float* x, const float* w, float eps, float* y, int64_t dim) {
  const float* xr = x + int64_t(blockIdx.x) * dim;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += double(xr[i]) * xr[i];
  rmsnorm_row(xr, w, eps, y + int64_t(blockIdx.x) * dim, dim, ss);
}

// x += scale * add, then the RMSNorm of x into y: each thread reads back only the elements it
// wrote, so the one barrier of the sum orders nothing more.
__global__ void k_scaled_add_rmsnorm(float* x, const float* add, const float* scale, const float* w, float eps,
                                     float* y, int64_t dim) {
  float* xr = x + int64_t(blockIdx.x) * dim;
  const float* ar = add + int64_t(blockIdx.x) * dim;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    xr[i] += scale[i] * ar[i];
    ss += double(xr[i]) * xr[i];
  }
  rmsnorm_row(xr, w, eps, y + int64_t(blockIdx.x) * dim, dim, ss);
}

__global__ void k_affine(float* x, const float* scale, const float* bias, int64_t rows, int64_t dim) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * dim;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % dim;
    x[i] = (x[i] + bias[j]) * scale[j];
  }
}

// The residual merge then its RMSNorm, one row per block: each thread merges its elements, writes them
// and reads them back for the norm (no other thread touches them), with the row's sum of squares
// reduced over the block between the two loops. r_out may be r.
__global__ void k_residual_scale_rmsnorm(const float* r, const float* h, const float* hs, const float* hb,
                                         const float* rs, const float* rb, const float* w, float eps, float* r_out,
                                         float* y, int64_t dim) {
  __shared__ double sh[kGpuThreads];
  const int64_t off = int64_t(blockIdx.x) * dim;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = (h[off + i] + hb[i]) * hs[i] + (r[off + i] + rb[i]) * rs[i];
    r_out[off + i] = v;
    ss += double(v) * v;
  }
  ss = block_sum(ss, sh);
  const float inv = float(1.0 / sqrt(ss / double(dim) + double(eps)));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) y[off + i] = w[i] * (r_out[off + i] * inv);
}

__global__ void k_scaled_add(float* y, const float* x, const float* scale, int64_t rows, int64_t dim) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * dim;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += scale[i % dim] * x[i];
}

__global__ void k_gelu(float* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = gelu_erf(x[i]);
}

__global__ void k_softmax(float* x, int64_t cols) {
  __shared__ float shf[kGpuThreads];
  __shared__ double shd[kGpuThreads];
  float* xr = x + int64_t(blockIdx.x) * cols;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) mx = fmaxf(mx, xr[i]);
  mx = block_max(mx, shf);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    xr[i] = expf(xr[i] - mx);
    sum += xr[i];
  }
  sum = block_sum(sum, shd);
  const float inv = float(1.0 / sum);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xr[i] *= inv;
}

__global__ void k_route_select(const float* probs, const float* bias, int32_t* expert, float* weight, int64_t N,
                               int64_t classes) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* p = probs + n * classes;
  int64_t best = 0;
  float best_v = p[0] + bias[0];
  for (int64_t e = 1; e < classes; ++e) {
    const float v = p[e] + bias[e];
    if (v > best_v) {
      best_v = v;
      best = e;
    }
  }
  expert[n] = int32_t(best);
  weight[n] = p[best];
}

// softmax then route_select (Backend::route) in one pass, a warp per row: the row's classes (the
// experts and the skip class) are read once, normalised in place, and the warp finds the largest
// p + bias, the lowest class among equals as the CPU's first maximum does. The sum in double, as
// k_softmax's.
__global__ void k_route(float* logits, const float* bias, int32_t* expert, float* weight, int64_t N,
                        int64_t classes) {
  const int lane = int(threadIdx.x) % GPU_WARP_SIZE;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / GPU_WARP_SIZE;
  for (int64_t n = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / GPU_WARP_SIZE; n < N; n += warps) {
    float* p = logits + n * classes;
    float mx = -INFINITY;
    for (int64_t i = lane; i < classes; i += GPU_WARP_SIZE) mx = fmaxf(mx, p[i]);
    for (int m = GPU_WARP_SIZE / 2; m > 0; m /= 2) mx = fmaxf(mx, gpu_shfl_xor(mx, m));
    double sum = 0;
    for (int64_t i = lane; i < classes; i += GPU_WARP_SIZE) {
      const float e = expf(p[i] - mx);
      p[i] = e;
      sum += e;
    }
    const float inv = float(1.0 / warp_sum(sum));
    int best = -1;  // this lane's first maximum of its classes, then the warp's
    float best_score = 0.0f, best_p = 0.0f;
    for (int64_t i = lane; i < classes; i += GPU_WARP_SIZE) {
      const float v = p[i] * inv;
      p[i] = v;
      const float score = v + bias[i];
      if (best < 0 || score > best_score) best = int(i), best_score = score, best_p = v;
    }
    for (int m = GPU_WARP_SIZE / 2; m > 0; m /= 2) {
      const int other = gpu_shfl_xor(best, m);
      const float other_score = gpu_shfl_xor(best_score, m), other_p = gpu_shfl_xor(best_p, m);
      const bool take =
          other >= 0 && (best < 0 || other_score > best_score || (other_score == best_score && other < best));
      if (take) best = other, best_score = other_score, best_p = other_p;
    }
    if (lane == 0) {
      expert[n] = int32_t(best);
      weight[n] = best_p;
    }
  }
}

}  // namespace

bool CudaBackend::linear_as_gemv(int64_t M) const { return options_.linear_few_rows_gemv && M <= kLinearGemvMaxRows; }

void CudaBackend::linear_impl(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K,
                              int64_t N, bool accumulate, int64_t ldy, bool bf16) {
  if (M == 0 || N == 0) return;
  if (ldy == 0) ldy = N;
  DeviceBuffer hx, hw;
  if (linear_as_gemv(M)) {  // decode: gpu_gemv.h
    GemvOutput o;
    o.bias = bias, o.y = y, o.ldy = ldy, o.N = N;
    gemv_weights(w, N, K, bf16, hw, o);
    linear_gemv(stream_, warp_size_, M, K, x, bf16, &o, 1, accumulate, /*gelu=*/false);
    return;
  }
  const GemmOperand A = operand(x, M, K, K, false, bf16, hx);
  const GemmOperand B = weight_operand(w, N, K, true, bf16, hw);
  gemm_bias(M, N, K, 1.0f, A, B, accumulate ? 1.0f : 0.0f, y, ldy, bias);  // bias: the GEMM's epilogue
}

void CudaBackend::linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K,
                         int64_t N, bool accumulate, int64_t ldy) {
  linear_impl(x, w, bias, y, M, K, N, accumulate, ldy, options_.bf16_matmul);
}

void CudaBackend::gemv_weights(const float* w, int64_t N, int64_t K, bool bf16, DeviceBuffer& holder, GemvOutput& o) {
  if (bf16) {
    const GemmOperand W = weight_operand(w, N, K, true, true, holder);
    o.w = W.ptr, o.ldw = W.ld;
  } else {
    o.w = w, o.ldw = K;
  }
}

// A few rows: one GEMV launch for every kLinearGemvMaxOutputs weight matrices. More: a GEMM
// each, all reading one bf16 copy of x (Backend's default, a linear each, would convert x for each).
void CudaBackend::linear_many(const float* x, int64_t M, int64_t K, const LinearOutput* outs, int count) {
  if (M == 0) return;
  const bool bf16 = options_.bf16_matmul;
  if (!linear_as_gemv(M)) {
    DeviceBuffer hx;
    const GemmOperand A = operand(x, M, K, K, false, bf16, hx);
    for (int i = 0; i < count; ++i) {
      if (outs[i].N == 0) continue;
      DeviceBuffer hw;
      const GemmOperand B = weight_operand(outs[i].w, outs[i].N, K, true, bf16, hw);
      gemm_bias(M, outs[i].N, K, 1.0f, A, B, 0.0f, outs[i].y, outs[i].ldy != 0 ? outs[i].ldy : outs[i].N, nullptr);
    }
    return;
  }
  for (int first = 0; first < count; first += kLinearGemvMaxOutputs) {
    const int n = std::min(count - first, kLinearGemvMaxOutputs);
    DeviceBuffer holders[kLinearGemvMaxOutputs];
    GemvOutput g[kLinearGemvMaxOutputs];
    for (int i = 0; i < n; ++i) {
      const LinearOutput& o = outs[first + i];
      g[i].y = o.y, g[i].ldy = o.ldy != 0 ? o.ldy : o.N, g[i].N = o.N;
      gemv_weights(o.w, o.N, K, bf16, holders[i], g[i]);
    }
    linear_gemv(stream_, warp_size_, M, K, x, bf16, g, n, /*accumulate=*/false, /*gelu=*/false);
  }
}

// A few rows: the GELU in the GEMV's store (the default: the linear, a copy and the GELU).
void CudaBackend::linear_fp32_gelu(const float* x, const float* w, const float* bias, float* pre, float* y,
                                   int64_t M, int64_t K, int64_t N) {
  if (M == 0 || N == 0) return;
  if (!linear_as_gemv(M)) {
    Backend::linear_fp32_gelu(x, w, bias, pre, y, M, K, N);
    return;
  }
  GemvOutput o;
  o.w = w, o.ldw = K, o.bias = bias, o.y = y, o.ldy = N, o.N = N, o.pre = pre != y ? pre : nullptr;
  linear_gemv(stream_, warp_size_, M, K, x, /*bf16_weights=*/false, &o, 1, /*accumulate=*/false, /*gelu=*/true);
}

void CudaBackend::embedding(const float* table, const int32_t* ids, float* out, int64_t N, int64_t D) {
  if (N * D == 0) return;
  gpu_launch(k_embedding, gpu_blocks(N * D), kGpuThreads, 0, stream_, table, ids, out, N, D);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::rmsnorm(const float* x, const float* w, float eps, float* y, int64_t rows, int64_t dim) {
  if (rows == 0) return;
  gpu_launch(k_rmsnorm, unsigned(rows), kGpuThreads, 0, stream_, x, w, eps, y, dim);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::scaled_add_rmsnorm(float* y, const float* x, const float* scale, const float* w, float eps,
                                     float* out, int64_t rows, int64_t dim) {
  if (rows == 0) return;
  gpu_launch(k_scaled_add_rmsnorm, unsigned(rows), kGpuThreads, 0, stream_, y, x, scale, w, eps, out, dim);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::affine(float* x, const float* scale, const float* bias, int64_t rows, int64_t dim) {
  if (rows * dim == 0) return;
  gpu_launch(k_affine, gpu_blocks(rows * dim), kGpuThreads, 0, stream_, x, scale, bias, rows, dim);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::residual_scale_rmsnorm(const ResidualNormArgs& a, float* r_out, float* y) {
  if (a.rows * a.dim == 0) return;
  gpu_launch(k_residual_scale_rmsnorm, unsigned(a.rows), kGpuThreads, 0, stream_, a.r, a.h, a.hidden_scale,
             a.hidden_bias, a.residual_scale, a.residual_bias, a.norm_weight, a.eps, r_out, y, a.dim);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::scaled_add(float* y, const float* x, const float* scale, int64_t rows, int64_t dim) {
  if (rows * dim == 0) return;
  gpu_launch(k_scaled_add, gpu_blocks(rows * dim), kGpuThreads, 0, stream_, y, x, scale, rows, dim);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::gelu(float* x, int64_t n) {
  if (n == 0) return;
  gpu_launch(k_gelu, gpu_blocks(n), kGpuThreads, 0, stream_, x, n);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::softmax(float* x, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  gpu_launch(k_softmax, unsigned(rows), kGpuThreads, 0, stream_, x, cols);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::route(float* logits, const float* bias, int32_t* expert, float* weight, int64_t N,
                        int64_t classes) {
  if (N == 0) return;
  gpu_launch(k_route, gpu_warp_blocks(N, warp_size_), kGpuThreads, 0, stream_, logits, bias, expert, weight, N,
             classes);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::route_select(const float* probs, const float* bias, int32_t* expert, float* weight, int64_t N,
                               int64_t classes) {
  if (N == 0) return;
  gpu_launch(k_route_select, gpu_blocks(N), kGpuThreads, 0, stream_, probs, bias, expert, weight, N, classes);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
