// Launch helpers shared by the GPU ops: deterministic column sums (parameter gradients of
// per-column vectors), fp32 -> bf16 packing of GEMM operands, fill, and the deterministic
// sum of squares. Passed against the CPU backend on an H100.
#include "backend/cuda/cuda_backend.h"

namespace zaya {

namespace {

constexpr int64_t kRowsPerChunk = 256;
constexpr int64_t kMaxChunks = 256;
constexpr int64_t kSsqChunk = 16384;

__global__ void k_column_partials(int64_t rows, int64_t dim, int64_t rows_per_chunk, const float* a, int64_t lda,
                                  const float* b, const float* c, const float* v, const float* rv, double* part) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  const double cj = c ? double(c[j]) : 0.0;
  double s = 0;
  for (int64_t r = r0; r < r1; ++r) {
    double t = a[r * lda + j];
    if (b) t *= double(b[r * dim + j]) + cj;
    if (rv) t *= rv[r];
    if (v) t *= v[j];
    s += t;
  }
  part[int64_t(blockIdx.y) * dim + j] = s;
}

__global__ void k_column_finish(int64_t dim, int64_t chunks, const double* part, float* out) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  double s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += part[k * dim + j];
  out[j] += float(s);
}

// A contiguous matrix (ld == cols), four elements per thread: one 16-byte load, one 8-byte store.
__global__ void k_to_bf16_vec4(const float4* src, int64_t n4, uint2* dst) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 v = src[i];
    uint2 o;
    o.x = uint32_t(f32_to_bf16(v.x)) | (uint32_t(f32_to_bf16(v.y)) << 16);
    o.y = uint32_t(f32_to_bf16(v.z)) | (uint32_t(f32_to_bf16(v.w)) << 16);
    dst[i] = o;
  }
}

// Any row stride: blockIdx.y strides over rows, the threads of blockIdx.x over a row's columns
// (no per-element division).
__global__ void k_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, bf16_t* dst) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < cols; j += int64_t(gridDim.x) * blockDim.x)
      dst[r * cols + j] = f32_to_bf16(src[r * ld + j]);
}

__global__ void k_from_bf16(const bf16_t* src, int64_t n, float* dst) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = bf16_to_f32(src[i]);
}

__global__ void k_fill(float* dst, float value, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

__global__ void k_ssq_partials(const float* x, int64_t n, double* part) {
  __shared__ double sh[kGpuThreads];
  const int64_t begin = int64_t(blockIdx.x) * kSsqChunk;
  const int64_t end = begin + kSsqChunk < n ? begin + kSsqChunk : n;
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) s += double(x[i]) * double(x[i]);
  s = block_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_ssq_finish(const double* part, int64_t parts, double* out) {
  __shared__ double sh[kGpuThreads];
  double s = 0;
  for (int64_t i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

GpuColumnChunks gpu_column_chunks(int64_t rows) {
  GpuColumnChunks c{kRowsPerChunk, (rows + kRowsPerChunk - 1) / kRowsPerChunk};
  if (c.chunks > kMaxChunks) {
    c.chunks = kMaxChunks;
    c.rows_per_chunk = (rows + c.chunks - 1) / c.chunks;
  }
  if (c.chunks < 1) c.chunks = 1;
  return c;
}

void gpu_column_finish(CudaBackend& be, int64_t dim, int64_t chunks, const double* part, float* out) {
  if (!out || dim <= 0) return;
  gpu_launch(k_column_finish, unsigned((dim + kGpuThreads - 1) / kGpuThreads), kGpuThreads, 0, be.stream(), dim,
             chunks, part, out);
  GPU_LAUNCH_CHECK();
}

void gpu_column_sums(CudaBackend& be, int64_t rows, int64_t dim, float* out, const float* a, int64_t lda,
                     const float* b, const float* c, const float* v, const float* rv) {
  if (!out || dim <= 0) return;
  const GpuColumnChunks plan = gpu_column_chunks(rows);
  DeviceBuffer part(&be, plan.chunks * dim * 8);
  dim3 grid(unsigned((dim + kGpuThreads - 1) / kGpuThreads), unsigned(plan.chunks));
  gpu_launch(k_column_partials, grid, kGpuThreads, 0, be.stream(), rows, dim, plan.rows_per_chunk, a, lda, b, c, v,
             rv, part.d());
  GPU_LAUNCH_CHECK();
  gpu_column_finish(be, dim, plan.chunks, part.d(), out);
}

void gpu_to_bf16(gpuStream_t s, const float* src, int64_t rows, int64_t cols, int64_t ld, bf16_t* dst) {
  if (rows * cols <= 0) return;
  const int64_t n = rows * cols;
  const bool aligned = gpu_aligned(src, 16) && gpu_aligned(dst, 8);
  if (ld == cols && aligned && n >= 4) {  // contiguous: vectorised, then the (< 4) tail
    const int64_t n4 = n / 4;
    gpu_launch(k_to_bf16_vec4, gpu_blocks(n4), kGpuThreads, 0, s, reinterpret_cast<const float4*>(src), n4,
               reinterpret_cast<uint2*>(dst));
    GPU_LAUNCH_CHECK();
    if (n % 4 != 0) {
      gpu_launch(k_to_bf16, 1, kGpuThreads, 0, s, src + n4 * 4, 1, n % 4, n % 4, dst + n4 * 4);
      GPU_LAUNCH_CHECK();
    }
    return;
  }
  const int64_t col_blocks = (cols + kGpuThreads - 1) / kGpuThreads;
  const dim3 grid(unsigned(col_blocks < 64 ? col_blocks : 64), unsigned(rows < 65535 ? rows : 65535));
  gpu_launch(k_to_bf16, grid, kGpuThreads, 0, s, src, rows, cols, ld, dst);
  GPU_LAUNCH_CHECK();
}

void gpu_from_bf16(gpuStream_t s, const bf16_t* src, int64_t n, float* dst) {
  if (n <= 0) return;
  gpu_launch(k_from_bf16, gpu_blocks(n), kGpuThreads, 0, s, src, n, dst);
  GPU_LAUNCH_CHECK();
}

void gpu_fill(gpuStream_t s, float* dst, float value, int64_t n) {
  if (n <= 0) return;
  gpu_launch(k_fill, gpu_blocks(n), kGpuThreads, 0, s, dst, value, n);
  GPU_LAUNCH_CHECK();
}

void gpu_sum_squares(CudaBackend& be, const float* x, int64_t n, double* out) {
  const int64_t parts = n > 0 ? (n + kSsqChunk - 1) / kSsqChunk : 1;
  DeviceBuffer part(&be, parts * 8);
  if (n > 0) {
    gpu_launch(k_ssq_partials, unsigned(parts), kGpuThreads, 0, be.stream(), x, n, part.d());
    GPU_LAUNCH_CHECK();
  } else {
    GPU_CHECK(gpuMemsetAsync(part.d(), 0, 8, be.stream()));
  }
  gpu_launch(k_ssq_finish, 1, kGpuThreads, 0, be.stream(), part.d(), parts, out);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
