// GPU optimizer ops: Newton-Schulz orthogonalisation (fp32 operands through the internal GEMM,
// in TF32 under the bf16 policy; the optimizer state stays fp32 by project decision 6), Muon momentum and update, AdamW,
// the deterministic sum of squares used by gradient clipping, and in-place scaling.
// newton_schulz_batched orthogonalises a tensor's experts together: strided-batched GEMMs,
// one call per iteration product for the whole [E, rows, cols] tensor, reading the b A and a X
// terms as C inputs (GpuGemm::run_into) rather than copying them; its operands are TF32 under
// the bf16 policy, or bf16 when CudaBackendOptions::newton_schulz_bf16 asks (fp32 iterates).
#include <cmath>

#include "backend/cuda/cuda_backend.h"

namespace zaya {

namespace {

constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;
constexpr double kNsNormEps = 1e-7;

// Per matrix m of the batch: X_m = x_m / (||x_m||_F + eps), transposed to [r, c] (r <= c) when
// the matrix is tall.
__global__ void k_ns_init(const float* x, const double* ssq, float* X, int64_t batch, int64_t r, int64_t c,
                          int transposed) {
  const int64_t n = r * c;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < batch * n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / n, j = i % n, a = j / c, b = j % c;
    const float inv = float(1.0 / (sqrt(ssq[m]) + kNsNormEps));
    X[i] = (transposed ? x[m * n + b * r + a] : x[i]) * inv;
  }
}

__global__ void k_ns_store(const float* X, float* x, int64_t batch, int64_t r, int64_t c, int transposed) {
  const int64_t n = r * c;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < batch * n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / n, j = i % n, a = j / c, b = j % c;
    if (transposed) x[m * n + b * r + a] = X[i];
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
  newton_schulz_batched(x, 1, rows, cols, steps);
}

void CudaBackend::newton_schulz_batched(float* x, int64_t batch, int64_t rows, int64_t cols, int steps) {
  ZAYA_CHECK(batch >= 0 && rows >= 0 && cols >= 0 && steps >= 0, "newton_schulz: bad shape or step count");
  if (batch == 0 || rows == 0 || cols == 0) return;
  const bool transposed = rows > cols;
  const int64_t r = transposed ? cols : rows, c = transposed ? rows : cols, n = r * c;
  const GemmCompute nc = options_.bf16_matmul ? GemmCompute::Tf32 : GemmCompute::Exact;
  const bool bf16 = newton_schulz_bf16();
  DeviceBuffer ssq(this, batch * 8), xb(this, batch * n * 4), yb(this, batch * n * 4), A(this, batch * r * r * 4),
      Bm(this, batch * r * r * 4);
  DeviceBuffer xh, ah, bh;  // bf16 copies of X, A and B (bf16 operands only)
  for (int64_t i = 0; i < batch; ++i) gpu_sum_squares(*this, x + i * n, n, ssq.d() + i);
  k_ns_init<<<gpu_blocks(batch * n), kGpuThreads, 0, stream_>>>(x, ssq.d(), xb.f(), batch, r, c, transposed);
  GPU_LAUNCH_CHECK();
  float* X = xb.f();
  float* Y = yb.f();
  const GemmBatch bx{batch, n, n, r * r}, ba{batch, r * r, r * r, r * r}, bb{batch, r * r, n, n};
  for (int s = 0; s < steps; ++s) {
    // The b A and a X terms are read from A and X as the GEMMs' C inputs (no copies); the
    // iterates X, A and B stay fp32 in every mode.
    if (bf16) {  // bf16 operands, fp32 accumulation (each operand converted once per iteration)
      const GemmOperand x_op = operand(X, batch * r, c, c, false, true, xh);
      GemmOperand x_t = x_op;
      x_t.trans = true;
      gemm(r, r, c, 1.0f, x_op, x_t, 0.0f, A.f(), r, bx);  // A = X X^T
      const GemmOperand a_op = operand(A.f(), batch * r, r, r, false, true, ah);
      gemm_into(r, r, r, kNsC, a_op, a_op, kNsB, A.f(), Bm.f(), r, ba);  // B = b A + c A A
      gemm_into(r, c, r, 1.0f, operand(Bm.f(), batch * r, r, r, false, true, bh), x_op, kNsA, X, Y, c, bb);
    } else {
      // Under the bf16 policy the products run in TF32 (fp32 operands on the tensor cores, fp32
      // accumulation: ~1e-3 from fp32, about 8x its rate); otherwise exactly in fp32.
      const GemmOperand x_op = f32_operand(X, c, false);
      gemm(r, r, c, 1.0f, x_op, f32_operand(X, c, true), 0.0f, A.f(), r, bx, nc);  // A = X X^T
      const GemmOperand a_op = f32_operand(A.f(), r, false);
      gemm_into(r, r, r, kNsC, a_op, a_op, kNsB, A.f(), Bm.f(), r, ba, nc);                  // B = b A + c A A
      gemm_into(r, c, r, 1.0f, f32_operand(Bm.f(), r, false), x_op, kNsA, X, Y, c, bb, nc);  // Y = a X + B X
    }
    float* t = X;
    X = Y;
    Y = t;
  }
  k_ns_store<<<gpu_blocks(batch * n), kGpuThreads, 0, stream_>>>(X, x, batch, r, c, transposed);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::muon_momentum(float* m, const float* g, float* u, int64_t n, float mu, bool nesterov) {
  if (n == 0) return;
  k_muon_momentum<<<gpu_blocks(n), kGpuThreads, 0, stream_>>>(m, g, u, n, mu, nesterov);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::muon_update(float* w, const float* x, int64_t n, float lr, float scale, float wd) {
  drop_shadows_over(w, n * 4);
  if (n == 0) return;
  k_muon_update<<<gpu_blocks(n), kGpuThreads, 0, stream_>>>(w, x, n, lr, scale, wd);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::adamw_update(float* w, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                               float beta2, float eps, float wd, int64_t t) {
  drop_shadows_over(w, n * 4);
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
  drop_shadows_over(x, n * 4);
  if (n == 0) return;
  k_scale<<<gpu_blocks(n), kGpuThreads, 0, stream_>>>(x, s, n);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
