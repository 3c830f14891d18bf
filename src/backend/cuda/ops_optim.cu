// GPU optimizer ops: Newton-Schulz orthogonalisation (fp32 GEMMs through the internal GEMM;
// the optimizer state stays fp32 by project decision 6), Muon momentum and update, AdamW,
// the deterministic sum of squares used by gradient clipping, and in-place scaling.
// newton_schulz handles one matrix per call as the Backend interface defines it (batching
// across a tensor's experts would need an interface change). Not yet run on a GPU.
#include <cmath>

#include "backend/cuda/cuda_backend.h"

namespace zaya {

namespace {

constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;
constexpr double kNsNormEps = 1e-7;

// X = x / (||x||_F + eps), transposed to [r, c] (r <= c) when the matrix is tall.
__global__ void k_ns_init(const float* x, const double* ssq, float* X, int64_t r, int64_t c, int transposed) {
  const float inv = float(1.0 / (sqrt(*ssq) + kNsNormEps));
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < r * c; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = i / c, b = i % c;
    X[i] = (transposed ? x[b * r + a] : x[i]) * inv;
  }
}

__global__ void k_ns_store(const float* X, float* x, int64_t r, int64_t c, int transposed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < r * c; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = i / c, b = i % c;
    if (transposed) x[b * r + a] = X[i];
    else x[i] = X[i];
  }
}

__global__ void k_muon_momentum(float* m, const float* g, float* u, int64_t n, float mu, int nesterov) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float mi = mu * m[i] + g[i];
    m[i] = mi;
    u[i] = nesterov ? g[i] + mu * mi : mi;
  }
}

__global__ void k_muon_update(float* w, const float* x, int64_t n, float lr, float scale, float wd) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    w[i] -= lr * (scale * x[i] + wd * w[i]);
}

__global__ void k_adamw(float* w, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                        float c1, float c2, float inv_bc1, float inv_bc2, float eps, float wd) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + c1 * gi;
    const float vi = beta2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float step = (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
    w[i] -= lr * (step + wd * w[i]);
  }
}

__global__ void k_scale(float* x, float s, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

}  // namespace

void CudaBackend::newton_schulz(float* x, int64_t rows, int64_t cols, int steps) {
  ZAYA_CHECK(rows >= 0 && cols >= 0 && steps >= 0, "newton_schulz: bad shape or step count");
  if (rows == 0 || cols == 0) return;
  const bool transposed = rows > cols;
  const int64_t r = transposed ? cols : rows, c = transposed ? rows : cols, n = r * c;
  DeviceBuffer ssq(this, 8), xb(this, n * 4), yb(this, n * 4), A(this, r * r * 4), Bm(this, r * r * 4);
  gpu_sum_squares(*this, x, n, ssq.d());
  k_ns_init<<<gpu_blocks(n), kGpuThreads, 0, stream_>>>(x, ssq.d(), xb.f(), r, c, transposed);
  GPU_LAUNCH_CHECK();
  float* X = xb.f();
  float* Y = yb.f();
  auto f32 = [](const float* p, int64_t ld, bool trans) {
    GemmOperand o;
    o.ptr = p;
    o.type = GemmType::F32;
    o.ld = ld;
    o.trans = trans;
    return o;
  };
  for (int s = 0; s < steps; ++s) {
    gemm(r, r, c, 1.0f, f32(X, c, false), f32(X, c, true), 0.0f, A.f(), r);           // A = X X^T
    copy(Bm.f(), A.f(), r * r);
    gemm(r, r, r, kNsC, f32(A.f(), r, false), f32(A.f(), r, false), kNsB, Bm.f(), r);  // B = b A + c A A
    copy(Y, X, n);
    gemm(r, c, r, 1.0f, f32(Bm.f(), r, false), f32(X, c, false), kNsA, Y, c);         // Y = a X + B X
    float* t = X;
    X = Y;
    Y = t;
  }
  k_ns_store<<<gpu_blocks(n), kGpuThreads, 0, stream_>>>(X, x, r, c, transposed);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::muon_momentum(float* m, const float* g, float* u, int64_t n, float mu, bool nesterov) {
  if (n == 0) return;
  k_muon_momentum<<<gpu_blocks(n), kGpuThreads, 0, stream_>>>(m, g, u, n, mu, nesterov);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::muon_update(float* w, const float* x, int64_t n, float lr, float scale, float wd) {
  if (n == 0) return;
  k_muon_update<<<gpu_blocks(n), kGpuThreads, 0, stream_>>>(w, x, n, lr, scale, wd);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::adamw_update(float* w, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                               float beta2, float eps, float wd, int64_t t) {
  ZAYA_CHECK(t >= 1, "adamw_update: step count must be >= 1");
  if (n == 0) return;
  const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(beta1), double(t))));
  const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(beta2), double(t))));
  const float c1 = float(1.0 - double(beta1)), c2 = float(1.0 - double(beta2));
  k_adamw<<<gpu_blocks(n), kGpuThreads, 0, stream_>>>(w, g, m, v, n, lr, beta1, beta2, c1, c2, inv_bc1, inv_bc2, eps,
                                                      wd);
  GPU_LAUNCH_CHECK();
}

double CudaBackend::sum_squares(const float* x, int64_t n) {
  DeviceBuffer out(this, 8);
  gpu_sum_squares(*this, x, n, out.d());
  double host = 0;
  to_host(&host, out.d(), 8);
  return host;
}

void CudaBackend::scale_inplace(float* x, float s, int64_t n) {
  if (n == 0) return;
  k_scale<<<gpu_blocks(n), kGpuThreads, 0, stream_>>>(x, s, n);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
