// The GPU MoE routing plan (one block: histogram, offsets, then a stable placement chunk by
// chunk with one block-wide prefix sum per class), row gathers and SwiGLU forward/backward.
// Integer-only plan, so it is deterministic. Not yet run on a GPU.
#include "backend/cuda/ops_moe_common.h"

namespace zaya {

namespace {

constexpr int kPlanThreads = 1024;
constexpr int kMaxClasses = 1024;

__global__ void k_moe_plan(const int32_t* expert, int64_t N, int64_t classes, int32_t* offsets, int32_t* perm) {
  __shared__ int32_t count[kMaxClasses + 1];
  __shared__ int32_t cursor[kMaxClasses];
  __shared__ int32_t scan[kPlanThreads];
  for (int64_t e = threadIdx.x; e <= classes; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) atomicAdd(&count[expert[n]], 1);  // integer: exact
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int64_t e = 0; e < classes; ++e) {
      offsets[e] = run;
      cursor[e] = run;
      run += count[e];
    }
    offsets[classes] = run;
  }
  __syncthreads();
  for (int64_t base = 0; base < N; base += blockDim.x) {
    const int64_t n = base + threadIdx.x;
    const int32_t cls = n < N ? expert[n] : -1;
    for (int64_t e = 0; e < classes; ++e) {
      // Inclusive prefix sum of (cls == e) over the chunk (Hillis-Steele, any block size).
      scan[threadIdx.x] = cls == e ? 1 : 0;
      __syncthreads();
      for (unsigned off = 1; off < blockDim.x; off *= 2) {
        const int32_t add = threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
        __syncthreads();
        scan[threadIdx.x] += add;
        __syncthreads();
      }
      if (cls == e) perm[cursor[e] + scan[threadIdx.x] - 1] = int32_t(n);
      __syncthreads();
      if (threadIdx.x == 0) cursor[e] += scan[blockDim.x - 1];
      __syncthreads();
    }
  }
}

__global__ void k_gather(const float* src, const int32_t* perm, const float* row_scale, int64_t rows, int64_t D,
                         float* dst) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * D; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = perm[i / D];
    const float v = src[n * D + i % D];
    dst[i] = row_scale ? row_scale[n] * v : v;
  }
}

__global__ void k_swiglu(const float* hid, float* act, int64_t rows, int64_t I) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * I; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / I, j = i % I;
    const float g = hid[r * 2 * I + j], u = hid[r * 2 * I + I + j];
    act[i] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void k_swiglu_backward(const float* hid, const float* dact, float* dhid, int64_t rows, int64_t I) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * I; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / I, j = i % I;
    const float g = hid[r * 2 * I + j], u = hid[r * 2 * I + I + j];
    const float sg = 1.0f / (1.0f + expf(-g));
    const float da = dact[i];
    dhid[r * 2 * I + j] = da * u * sg * (1.0f + g * (1.0f - sg));
    dhid[r * 2 * I + I + j] = da * g * sg;
  }
}

}  // namespace

GpuMoePlan gpu_plan_moe(CudaBackend& be, const int32_t* expert, int64_t N, int64_t E) {
  const int64_t classes = E + 1;
  if (classes > kMaxClasses) fail("cuda", "moe: at most " + std::to_string(kMaxClasses - 1) + " experts");
  GpuMoePlan plan;
  plan.perm = DeviceBuffer(&be, (N > 0 ? N : 1) * 4);
  DeviceBuffer off(&be, (classes + 1) * 4);
  k_moe_plan<<<1, kPlanThreads, 0, be.stream()>>>(expert, N, classes, off.i(), plan.perm.i());
  GPU_LAUNCH_CHECK();
  plan.offsets.resize(static_cast<size_t>(classes + 1));
  be.to_host(plan.offsets.data(), off.i(), (classes + 1) * 4);
  plan.routed = plan.offsets[size_t(E)];
  return plan;
}

void gpu_gather_rows(gpuStream_t s, const float* src, const int32_t* perm, const float* row_scale, int64_t rows,
                     int64_t D, float* dst) {
  if (rows * D == 0) return;
  k_gather<<<gpu_blocks(rows * D), kGpuThreads, 0, s>>>(src, perm, row_scale, rows, D, dst);
  GPU_LAUNCH_CHECK();
}

void gpu_swiglu(gpuStream_t s, const float* hid, float* act, int64_t rows, int64_t I) {
  if (rows * I == 0) return;
  k_swiglu<<<gpu_blocks(rows * I), kGpuThreads, 0, s>>>(hid, act, rows, I);
  GPU_LAUNCH_CHECK();
}

void gpu_swiglu_backward(gpuStream_t s, const float* hid, const float* dact, float* dhid, int64_t rows, int64_t I) {
  if (rows * I == 0) return;
  k_swiglu_backward<<<gpu_blocks(rows * I), kGpuThreads, 0, s>>>(hid, dact, dhid, rows, I);
  GPU_LAUNCH_CHECK();
}

void gpu_moe_gate_up(CudaBackend& be, const GpuMoePlan& plan, int64_t E, int64_t I, int64_t D, int64_t routed,
                     const GemmOperand& xo, const GemmOperand& guo, float* hid, float* act) {
  for_each_expert(plan, E, [&](int64_t e, int64_t r0, int64_t rows) {
    be.gemm(rows, 2 * I, D, 1.0f, operand_rows(xo, r0), operand_rows(guo, e * 2 * I), 0.0f, hid + r0 * 2 * I, 2 * I);
  });
  gpu_swiglu(be.stream(), hid, act, routed, I);
}

}  // namespace zaya
