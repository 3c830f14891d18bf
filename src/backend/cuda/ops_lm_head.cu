// The LM head fused with cross-entropy (Backend::lm_head_loss), in row chunks so that no more
// than a chunk's logits exist at once. fp32 throughout (spec A.11): either exact fp32 GEMMs, or
// (CudaBackendOptions::lm_head_tf32x3, under the bf16 policy on a BLASLt engine) each GEMM as
// three TF32 tensor-core GEMMs over operands split into TF32 pairs (tf32_split.h), which is as
// accurate as fp32 at a multiple of its speed. The split path walks the vocabulary in slices so
// that the split copies of the weight and of a logits slice stay small; a weight whose split fits
// in 1 GiB is split once per call.
// Both paths passed against the CPU backend on an H100 at the fp32 tolerance
// (GpuDense.LmHeadLoss, GpuLmHead.Tf32x3SlicesMatchFp32).
#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/tf32_split.h"

namespace zaya {

namespace {

// One block per row: loss and d(scale * loss)/d(logits) in place (zeros for target < 0).
__global__ void k_loss_rows(float* logits, const int32_t* target, int64_t V, float scale, double* row_loss) {
  __shared__ float shf[kGpuThreads];
  __shared__ double shd[kGpuThreads];
  const int64_t r = blockIdx.x;
  float* l = logits + r * V;
  const int32_t t = target[r];
  if (t < 0) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) l[v] = 0.0f;
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, l[v]);
  mx = block_max(mx, shf);
  double sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += exp(double(l[v] - mx));
  sum = block_sum(sum, shd);
  const double lse = log(sum) + mx;
  const float lt = l[t];
  __syncthreads();  // every thread has read l[t] before it is overwritten
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) l[v] = float(exp(double(l[v]) - lse)) * scale;
  __syncthreads();
  if (threadIdx.x == 0) {
    row_loss[r] = lse - lt;
    l[t] -= scale;
  }
}

// big[r * cols + c], small[...] = the TF32 split of src[r * ld + c].
__global__ void k_split_tf32(const float* src, int64_t rows, int64_t cols, int64_t ld, float* big, float* small) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x)
    tf32_split(src[(i / cols) * ld + i % cols], big + i, small + i);
}

// A stored fp32 matrix as two packed TF32 operands whose sum is the matrix (to 2^-22).
struct SplitOperand {
  DeviceBuffer big_buf, small_buf;
  GemmOperand big, small;
  // The same operands read transposed (op = stored^T).
  SplitOperand& transposed() {
    big.trans = small.trans = !big.trans;
    return *this;
  }
};

// Splits the row-major [rows, cols] matrix p (row stride ld); trans as in GemmOperand.
SplitOperand split_operand(CudaBackend& be, const float* p, int64_t rows, int64_t cols, int64_t ld, bool trans) {
  SplitOperand s;
  s.big_buf = DeviceBuffer(&be, rows * cols * 4);
  s.small_buf = DeviceBuffer(&be, rows * cols * 4);
  if (rows * cols > 0) {
    gpu_launch(k_split_tf32, gpu_blocks(rows * cols), kGpuThreads, 0, be.stream(), p, rows, cols, ld,
               s.big_buf.f(), s.small_buf.f());
    GPU_LAUNCH_CHECK();
  }
  s.big = f32_operand(s.big_buf.f(), cols, trans);
  s.small = f32_operand(s.small_buf.f(), cols, trans);
  return s;
}

// Rows v0 .. v0 + vs of the [V, D] weight w as split operands (op = the stored slice^T when
// trans): views into `whole` (the whole weight split once) when given, else split here.
SplitOperand weight_slice(CudaBackend& be, const SplitOperand* whole, const float* w, int64_t v0, int64_t vs,
                          int64_t D, bool trans) {
  if (!whole) return split_operand(be, w + v0 * D, vs, D, D, trans);
  SplitOperand s;
  s.big = f32_operand(whole->big_buf.f() + v0 * D, D, trans);
  s.small = f32_operand(whole->small_buf.f() + v0 * D, D, trans);
  return s;
}

// C = op(A) op(B) + beta * C (+ bias on every row) as three TF32 GEMMs, small terms first.
void gemm_tf32x3(CudaBackend& be, int64_t M, int64_t N, int64_t K, const SplitOperand& a, const SplitOperand& b,
                 float beta, float* C, int64_t ldc, const float* bias) {
  be.gemm(M, N, K, 1.0f, a.small, b.big, beta, C, ldc, {}, GemmCompute::Tf32);
  be.gemm(M, N, K, 1.0f, a.big, b.small, 1.0f, C, ldc, {}, GemmCompute::Tf32);
  be.gemm_bias(M, N, K, 1.0f, a.big, b.big, 1.0f, C, ldc, bias, GemmCompute::Tf32);
}

// Vocabulary rows per slice, unless the options fix it: the two split copies of a slice of the
// [V, D] weight stay within 256 MiB, and those of a [rows, slice] block of logits within 512 MiB.
int64_t vocab_slice(int64_t asked, int64_t V, int64_t D, int64_t rows) {
  int64_t slice = asked;
  if (slice <= 0) slice = std::min((int64_t(32) << 20) / std::max<int64_t>(D, 1), (int64_t(64) << 20) / rows);
  if (slice < 1) slice = 1;
  return slice < V ? slice : V;
}

}  // namespace

bool CudaBackend::lm_head_tf32x3() const {
#if defined(ZAYA_GPU_HIP)
  return false;  // TF32 is a CUDA compute type (hipBLASLt's XF32 on MI300 is not wired): exact there
#else
  return options_.lm_head_tf32x3 && options_.bf16_matmul && std::string(gemm_->engine()) != "tiled";
#endif
}

double CudaBackend::lm_head_loss(const float* y, const float* w, const float* bias, const int32_t* target, int64_t N,
                                 int64_t D, int64_t V, float scale, float* dy, float* dw, float* dbias) {
  if (N == 0) return 0.0;
  const bool split = lm_head_tf32x3();
  // Rows per chunk: up to 1 GiB of fp32 logits. Large chunks keep the head's GEMMs large (with
  // a 262k vocabulary, 256 rows would re-read the 2 GiB weight 16 times per 4096 tokens).
  int64_t chunk = (int64_t(1) << 28) / V;
  if (options_.lm_head_chunk_rows > 0) chunk = options_.lm_head_chunk_rows;
  if (chunk > N) chunk = N;
  if (chunk < 1) chunk = 1;
  const int64_t slice = vocab_slice(options_.lm_head_vocab_slice, V, D, chunk);
  DeviceBuffer logits(this, chunk * V * 4), row_loss(this, N * 8);
  // The weight's split is made once for the whole call (every chunk, forward and backward) when
  // its two halves fit the cache budget (1 GiB: a 32k vocabulary at d 2048); else once per
  // slice and pass.
  SplitOperand w_whole;
  const bool keep_weight_split = split && 2 * V * D * 4 <= options_.lm_head_split_cache_bytes;
  if (keep_weight_split) w_whole = split_operand(*this, w, V, D, D, false);
  const SplitOperand* whole = keep_weight_split ? &w_whole : nullptr;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = chunk < N - r0 ? chunk : N - r0;
    const float* x = y + r0 * D;
    SplitOperand xs;  // the chunk's rows, split (forward and backward)
    if (!split) {
      linear_impl(x, w, bias, logits.f(), rows, D, V, false, 0, /*bf16=*/false);
    } else {
      xs = split_operand(*this, x, rows, D, D, false);
      for (int64_t v0 = 0; v0 < V; v0 += slice) {
        const int64_t vs = slice < V - v0 ? slice : V - v0;
        const SplitOperand ws = weight_slice(*this, whole, w, v0, vs, D, true);  // op(B) = W_slice^T [D, vs]
        gemm_tf32x3(*this, rows, vs, D, xs, ws, 0.0f, logits.f() + v0, V, bias ? bias + v0 : nullptr);
      }
    }
    gpu_launch(k_loss_rows, unsigned(rows), kGpuThreads, 0, stream_, logits.f(), target + r0, V, scale,
               row_loss.d() + r0);
    GPU_LAUNCH_CHECK();
    if (!dy) continue;
    if (!split) {
      linear_backward_impl(x, w, logits.f(), dy + r0 * D, dw, dbias, rows, D, V, false, 0, /*bf16=*/false);
      continue;
    }
    // logits now hold d(loss)/d(logits): dX = dL W and dW += dL^T X, slice by slice.
    for (int64_t v0 = 0; v0 < V; v0 += slice) {
      const int64_t vs = slice < V - v0 ? slice : V - v0;
      SplitOperand dl = split_operand(*this, logits.f() + v0, rows, vs, V, false);  // [rows, vs]
      const SplitOperand ws = weight_slice(*this, whole, w, v0, vs, D, false);       // op(B) = W_slice [vs, D]
      gemm_tf32x3(*this, rows, D, vs, dl, ws, v0 == 0 ? 0.0f : 1.0f, dy + r0 * D, D, nullptr);
      if (dw) gemm_tf32x3(*this, vs, D, rows, dl.transposed(), xs, 1.0f, dw + v0 * D, D, nullptr);
    }
    if (dbias) gpu_column_sums(*this, rows, V, dbias, logits.f(), V, nullptr, nullptr, nullptr, nullptr);
  }
  std::vector<double> host(static_cast<size_t>(N));
  to_host(host.data(), row_loss.d(), N * 8);
  double total = 0;
  for (double v : host) total += v;  // fixed order, as on the CPU
  return total;
}

}  // namespace zaya
