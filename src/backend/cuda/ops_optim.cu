// GPU optimizer ops: Newton-Schulz orthogonalisation, Muon momentum and update, AdamW, the
// deterministic sum of squares used by gradient clipping, and in-place scaling. The optimizer
// state stays fp32 (project decision 6).
// newton_schulz_batched orthogonalises a tensor's experts together: strided-batched GEMMs,
// one call per iteration product for the whole [E, rows, cols] tensor, reading the b A and a X
// terms as C inputs (GpuGemm::run_into) rather than copying them, and writing the last iterate
// into the caller's buffer. Under the bf16 policy its operands are bf16 (spec C.4; fp32
// iterates, or bf16 ones with CudaBackendOptions::newton_schulz_bf16_iterates), or TF32 when
// CudaBackendOptions::newton_schulz_bf16 is off; exact fp32 otherwise.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"

namespace zaya {

namespace {

constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;
constexpr double kNsNormEps = 1e-7;

__device__ inline void ns_store(float* p, float v) { *p = v; }
__device__ inline void ns_store(bf16_t* p, float v) { *p = f32_to_bf16(v); }

// X_m = x_m / (||x_m||_F + eps) for each matrix m of the batch (blockIdx.y strides over them; no
// per-element division), stored fp32 or bf16.
template <typename Out>
__global__ void k_ns_init(const float* x, const double* ssq, Out* X, int64_t batch, int64_t n) {
  for (int64_t m = blockIdx.y; m < batch; m += gridDim.y) {
    const float inv = float(1.0 / (sqrt(ssq[m]) + kNsNormEps));
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += int64_t(gridDim.x) * blockDim.x)
      ns_store(X + m * n + j, x[m * n + j] * inv);
  }
}

// Newton-Schulz with bf16 iterates (CudaBackendOptions::newton_schulz_bf16_iterates): the
// normalised input is stored in bf16, and every product writes its bf16 result directly, reading
// its b A or a X term in bf16 (fp32 accumulation and scaling, one rounding per product). Nothing
// is packed per iteration; the last iterate is widened into x. Shapes as newton_schulz_batched.
void ns_with_bf16_iterates(CudaBackend& be, float* x, const double* ssq, int64_t batch, int64_t rows,
                                 int64_t cols, int steps) {
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows, n = rows * cols;
  DeviceBuffer xa(&be, batch * n * 2), xb(&be, batch * n * 2), A(&be, batch * r * r * 2), Bm(&be, batch * r * r * 2);
  const dim3 grid(std::min(gpu_blocks(n), 4096u), unsigned(std::min<int64_t>(batch, 65535)));
  gpu_launch(k_ns_init<bf16_t>, grid, kGpuThreads, 0, be.stream(), x, ssq, xa.h(), batch, n);
  GPU_LAUNCH_CHECK();
  bf16_t* X = xa.h();
  bf16_t* Y = xb.h();
  const GemmBatch bx{batch, n, n, r * r}, ba{batch, r * r, r * r, r * r}, bb_wide{batch, r * r, n, n},
      bb_tall{batch, n, r * r, n};
  const GemmOperand a_op = bf16_operand(A.h(), r, false), b_op = bf16_operand(Bm.h(), r, false);
  for (int s = 0; s < steps; ++s) {
    const GemmOperand x_op = bf16_operand(X, cols, false), x_t = bf16_operand(X, cols, true);
    if (tall) be.gemm_bf16_out(r, r, rows, 1.0f, x_t, x_op, 0.0f, nullptr, A.h(), r, bx);  // A = X^T X
    else be.gemm_bf16_out(r, r, cols, 1.0f, x_op, x_t, 0.0f, nullptr, A.h(), r, bx);       // A = X X^T
    be.gemm_bf16_out(r, r, r, kNsC, a_op, a_op, kNsB, A.h(), Bm.h(), r, ba);              // B = b A + c A A
    if (tall) be.gemm_bf16_out(rows, cols, r, 1.0f, x_op, b_op, kNsA, X, Y, cols, bb_tall);  // Y = a X + X B
    else be.gemm_bf16_out(r, cols, r, 1.0f, b_op, x_op, kNsA, X, Y, cols, bb_wide);          // Y = a X + B X
    std::swap(X, Y);
  }
  gpu_from_bf16(be.stream(), X, batch * n, x);
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
  // The iteration runs on the wide orientation X [r, c] (r <= c). A tall matrix is not
  // transposed: with X stored [c, r] the same products read A = X^T X and X <- a X + X B (B is
  // symmetric), only the GEMMs' operand orders change.
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows, n = rows * cols;
  DeviceBuffer ssq(this, batch * 8);
  for (int64_t i = 0; i < batch; ++i) gpu_sum_squares(*this, x + i * n, n, ssq.d() + i);
  if (steps > 0 && newton_schulz_bf16_iterates())
    return ns_with_bf16_iterates(*this, x, ssq.d(), batch, rows, cols, steps);
  const GemmCompute nc = options_.bf16_matmul ? GemmCompute::Tf32 : GemmCompute::Exact;
  const bool bf16 = newton_schulz_bf16();
  // yb holds the middle iterates (none with one step: the last lands in x).
  DeviceBuffer xb(this, batch * n * 4), yb(this, (steps > 1 ? batch * n : 1) * 4),
      A(this, batch * r * r * 4), Bm(this, batch * r * r * 4);
  DeviceBuffer xh, ah, bh;  // bf16 copies of X, A and B (bf16 operands only)
  const dim3 grid(std::min(gpu_blocks(n), 4096u), unsigned(std::min<int64_t>(batch, 65535)));
  gpu_launch(k_ns_init<float>, grid, kGpuThreads, 0, stream_, x, ssq.d(), xb.f(), batch, n);
  GPU_LAUNCH_CHECK();
  if (steps == 0) {
    copy(x, xb.f(), batch * n);
    return;
  }
  float* X = xb.f();
  float* Y = yb.f();
  const GemmBatch bx{batch, n, n, r * r}, ba{batch, r * r, r * r, r * r}, bb_wide{batch, r * r, n, n},
      bb_tall{batch, n, r * r, n};
  for (int s = 0; s < steps; ++s) {
    float* out = s + 1 == steps ? x : Y;  // the last iterate lands in x itself
    // The b A and a X terms are read from A and X as the GEMMs' C inputs (no copies); the
    // iterates X, A and B stay fp32 in every mode. Under the bf16 policy the products take bf16
    // operands (the default; each converted once per iteration) or TF32 (fp32 operands on the
    // tensor cores, fp32 accumulation: ~1e-3 from fp32); otherwise they run exactly in fp32.
    const GemmOperand x_op = bf16 ? operand(X, batch * rows, cols, cols, false, true, xh) : f32_operand(X, cols, false);
    const GemmCompute compute = bf16 ? GemmCompute::Exact : nc;
    GemmOperand x_t = x_op;
    x_t.trans = true;
    if (tall) gemm(r, r, rows, 1.0f, x_t, x_op, 0.0f, A.f(), r, bx, compute);  // A = X^T X
    else gemm(r, r, cols, 1.0f, x_op, x_t, 0.0f, A.f(), r, bx, compute);       // A = X X^T
    const GemmOperand a_op = bf16 ? operand(A.f(), batch * r, r, r, false, true, ah) : f32_operand(A.f(), r, false);
    gemm_into(r, r, r, kNsC, a_op, a_op, kNsB, A.f(), Bm.f(), r, ba, compute);  // B = b A + c A A
    const GemmOperand b_op = bf16 ? operand(Bm.f(), batch * r, r, r, false, true, bh) : f32_operand(Bm.f(), r, false);
    if (tall) gemm_into(rows, cols, r, 1.0f, x_op, b_op, kNsA, X, out, cols, bb_tall, compute);  // X <- a X + X B
    else gemm_into(r, cols, r, 1.0f, b_op, x_op, kNsA, X, out, cols, bb_wide, compute);          // X <- a X + B X
    float* t = X;
    X = Y;
    Y = t;
  }
}

void CudaBackend::muon_momentum(float* m, const float* g, float* u, int64_t n, float mu, bool nesterov) {
  if (n == 0) return;
  gpu_launch(k_muon_momentum, gpu_blocks(n), kGpuThreads, 0, stream_, m, g, u, n, mu, nesterov);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::muon_update(float* w, const float* x, int64_t n, float lr, float scale, float wd) {
  drop_shadows_over(w, n * 4);
  if (n == 0) return;
  gpu_launch(k_muon_update, gpu_blocks(n), kGpuThreads, 0, stream_, w, x, n, lr, scale, wd);
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
  gpu_launch(k_adamw, gpu_blocks(n), kGpuThreads, 0, stream_, w, g, m, v, n, lr, beta1, beta2, c1, c2,
             inv_bc1, inv_bc2, eps, wd);
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
  gpu_launch(k_scale, gpu_blocks(n), kGpuThreads, 0, stream_, x, s, n);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
