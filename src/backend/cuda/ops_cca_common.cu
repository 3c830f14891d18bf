// Launchers shared by the GPU CCA forward and backward: the depthwise conv stage and the row
// scatter/gather used by the packed-document re-layout. Passed against the CPU backend on an
// H100.
#include "backend/cuda/gpu_device.h"
#include "backend/cuda/ops_cca_common.h"

namespace zaya {

namespace {

__global__ void k_conv_depthwise(const float* u, const float* state, const float* w_dw, const float* b_dw, float* y,
                                 int64_t B, int64_t T, int64_t C, int64_t P, int64_t t0, int64_t Ly) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < B * Ly * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, s = (i / C) % Ly, b = i / (C * Ly);
    float acc = b_dw[c];
    for (int64_t k = 0; k < t0; ++k) acc += w_dw[c * t0 + k] * conv_ext(u, state, b, s + k, c, T, C, P);
    y[i] = acc;
  }
}

__global__ void k_scatter_rows(const float* src, const int32_t* rows, int64_t T, int64_t C, float* dst, int acc) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < T * C; i += int64_t(gridDim.x) * blockDim.x) {
    float* d = dst + int64_t(rows[i / C]) * C + i % C;
    *d = acc ? *d + src[i] : src[i];
  }
}

__global__ void k_gather_rows(const float* src, const int32_t* rows, int64_t T, int64_t C, float* dst, int acc) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < T * C; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = src[int64_t(rows[i / C]) * C + i % C];
    dst[i] = acc ? dst[i] + v : v;
  }
}

}  // namespace

void launch_conv_depthwise(gpuStream_t s, const float* u, const float* state, const float* w_dw, const float* b_dw,
                           float* y, int64_t B, int64_t T, int64_t C, int64_t P, int64_t t0, int64_t t1) {
  const int64_t Ly = T + t1 - 1;
  if (B * Ly * C == 0) return;
  gpu_launch(k_conv_depthwise, gpu_blocks(B * Ly * C), kGpuThreads, 0, s, u, state, w_dw, b_dw, y, B, T, C, P,
             t0, Ly);
  GPU_LAUNCH_CHECK();
}

void launch_scatter_rows(gpuStream_t s, const float* src, const int32_t* rows, int64_t T, int64_t C, float* dst,
                         bool accumulate) {
  if (T * C == 0) return;
  gpu_launch(k_scatter_rows, gpu_blocks(T * C), kGpuThreads, 0, s, src, rows, T, C, dst, accumulate);
  GPU_LAUNCH_CHECK();
}

void launch_gather_rows(gpuStream_t s, const float* src, const int32_t* rows, int64_t T, int64_t C, float* dst,
                        bool accumulate) {
  if (T * C == 0) return;
  gpu_launch(k_gather_rows, gpu_blocks(T * C), kGpuThreads, 0, s, src, rows, T, C, dst, accumulate);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
