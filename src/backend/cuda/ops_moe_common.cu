// The GPU MoE routing plan in three kernels over tiles of 256 tokens (per-tile class counts;
// class offsets and each tile's start per class; a stable placement by rank within the tile),
// row gathers and SwiGLU forward/backward. Integer-only plan, so it is deterministic. The
// three-kernel plan replaced a one-block plan (one prefix sum per class per 1024 tokens) and has
// not yet run on a GPU.
#include "backend/cuda/ops_moe_common.h"

#include <algorithm>

namespace zaya {

namespace {

constexpr int kMaxClasses = 1024;
constexpr int kPlanTile = 256;  // tokens per tile: the threads of a count or place block

// counts[tile, c] = tokens of class c in the tile (tile = blockIdx.x).
__global__ void k_plan_count(const int32_t* expert, int64_t N, int64_t classes, int32_t* counts) {
  __shared__ int32_t hist[kMaxClasses + 1];
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) hist[c] = 0;
  __syncthreads();
  const int64_t n = int64_t(blockIdx.x) * kPlanTile + threadIdx.x;
  if (n < N) atomicAdd(&hist[expert[n]], 1);  // integer: exact in any order
  __syncthreads();
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) counts[int64_t(blockIdx.x) * classes + c] = hist[c];
}

// One block. offsets[c] = tokens of classes before c (offsets[classes] = N), and
// starts[tile, c] = offsets[c] + tokens of class c in earlier tiles: where the tile's first
// token of class c goes.
__global__ void k_plan_offsets(const int32_t* counts, int64_t tiles, int64_t classes, int32_t* starts,
                               int32_t* offsets) {
  __shared__ int32_t total[kMaxClasses + 1];
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    int32_t run = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      starts[t * classes + c] = run;
      run += counts[t * classes + c];
    }
    total[c] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int64_t c = 0; c < classes; ++c) {
      offsets[c] = run;
      run += total[c];
    }
    offsets[classes] = run;
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    for (int64_t t = 0; t < tiles; ++t) starts[t * classes + c] += offsets[c];
}

// perm[starts[tile, c] + rank] = n, rank = tokens of class c before n in its tile: stable.
__global__ void k_plan_place(const int32_t* expert, int64_t N, int64_t classes, const int32_t* starts,
                             int32_t* perm) {
  __shared__ int32_t cls[kPlanTile];
  const int64_t n = int64_t(blockIdx.x) * kPlanTile + threadIdx.x;
  const int32_t c = n < N ? expert[n] : -1;
  cls[threadIdx.x] = c;
  __syncthreads();
  if (n >= N) return;
  int32_t rank = 0;
  for (unsigned j = 0; j < threadIdx.x; ++j) rank += cls[j] == c;
  perm[starts[int64_t(blockIdx.x) * classes + c] + rank] = int32_t(n);
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
  const int64_t tiles = (N + kPlanTile - 1) / kPlanTile;
  DeviceBuffer counts(&be, std::max<int64_t>(1, tiles * classes) * 4), starts(&be, std::max<int64_t>(1, tiles * classes) * 4);
  if (tiles > 0) {
    k_plan_count<<<unsigned(tiles), kPlanTile, 0, be.stream()>>>(expert, N, classes, counts.i());
    GPU_LAUNCH_CHECK();
  }
  k_plan_offsets<<<1, kPlanTile, 0, be.stream()>>>(counts.i(), tiles, classes, starts.i(), off.i());
  GPU_LAUNCH_CHECK();
  if (tiles > 0) {
    k_plan_place<<<unsigned(tiles), kPlanTile, 0, be.stream()>>>(expert, N, classes, starts.i(), plan.perm.i());
    GPU_LAUNCH_CHECK();
  }
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
    be.gemm_ragged(rows, 2 * I, D, 1.0f, operand_rows(xo, r0), operand_rows(guo, e * 2 * I), 0.0f, hid + r0 * 2 * I, 2 * I);
  });
  gpu_swiglu(be.stream(), hid, act, routed, I);
}

}  // namespace zaya
