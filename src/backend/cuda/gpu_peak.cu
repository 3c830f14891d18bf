// The GPU backend's measured matmul peak, the denominator of every GPU MFU figure: square
// n^3 GEMMs through the same GEMM engine and operand precision the ops use (bf16 operands with
// fp32 accumulation and output under the bf16 policy, fp32 otherwise), on pseudo-random data
// (never zeros: they run faster than real data), timed with events after warm-up; the median.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_device.h"

namespace zaya {
namespace {

__global__ void k_peak_fill(float* x, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = float(h & 0xffff) * (1.0f / 65536.0f) - 0.5f;
  }
}

}  // namespace

double CudaBackend::matmul_peak_gflops() {
  if (peak_gflops_ > 0) return peak_gflops_;
#if defined(ZAYA_SIMT)
  const int64_t n = 128, runs = 2;  // the host emulation: a GEMM of 8192^3 there takes hours
#else
  const int64_t n = 8192, runs = 10;
#endif
  const bool bf16 = options_.bf16_matmul;
  DeviceBuffer a(this, n * n * 4), b(this, n * n * 4), c(this, n * n * 4);
  gpu_launch(k_peak_fill, gpu_blocks(n * n), kGpuThreads, 0, stream_, a.f(), n * n, 17u);
  gpu_launch(k_peak_fill, gpu_blocks(n * n), kGpuThreads, 0, stream_, b.f(), n * n, 91u);
  GPU_LAUNCH_CHECK();
  DeviceBuffer ha, hb;
  const GemmOperand A = operand(a.f(), n, n, n, false, bf16, ha);
  const GemmOperand B = operand(b.f(), n, n, n, true, bf16, hb);
  gpuEvent_t start, stop;
  GPU_CHECK(gpuEventCreate(&start));
  GPU_CHECK(gpuEventCreate(&stop));
  for (int i = 0; i < 3; ++i) gemm(n, n, n, 1.0f, A, B, 0.0f, c.f(), n);
  std::vector<double> gflops;
  for (int64_t r = 0; r < runs; ++r) {
    GPU_CHECK(gpuEventRecord(start, stream_));
    gemm(n, n, n, 1.0f, A, B, 0.0f, c.f(), n);
    GPU_CHECK(gpuEventRecord(stop, stream_));
    GPU_CHECK(gpuEventSynchronize(stop));
    float ms = 0;
    GPU_CHECK(gpuEventElapsedTime(&ms, start, stop));
    gflops.push_back(2.0 * double(n) * double(n) * double(n) / (double(ms) * 1e-3) * 1e-9);
  }
  GPU_CHECK(gpuEventDestroy(start));
  GPU_CHECK(gpuEventDestroy(stop));
  std::sort(gflops.begin(), gflops.end());
  peak_gflops_ = 0.5 * (gflops[size_t(runs / 2 - 1)] + gflops[size_t(runs / 2)]);
  return peak_gflops_;
}

}  // namespace zaya
