// The GPU MoE routing plan in three kernels over tiles of 256 tokens (per-tile class counts;
// class offsets and each tile's start per class; a stable placement by rank within the tile),
// or, for one tile's worth (decode), the same three steps in one block and one launch; row
// gathers, SwiGLU forward/backward and the experts' GEMMs (ExpertGemms). Integer-only plan, so
// it is deterministic. The three-kernel plan replaced a one-block plan (one prefix sum per class
// per 1024 tokens). Passed against the CPU backend on an H100 (the one-launch plan came later).
#include "backend/cuda/ops_moe_common.h"

#include <algorithm>

#include "backend/cuda/gpu_grouped_gemm.h"

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

// The whole plan of at most kPlanTile tokens in one block (as k_plan_count, k_plan_offsets and
// k_plan_place for a single tile, in one launch): the same offsets and the same perm.
__global__ void k_plan_one_tile(const int32_t* expert, int64_t N, int64_t classes, int32_t* offsets, int32_t* perm) {
  __shared__ int32_t start[kMaxClasses + 1];  // counts, then where each class's first token goes
  __shared__ int32_t cls[kPlanTile];
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) start[c] = 0;
  const int64_t n = threadIdx.x;
  const int32_t c = n < N ? expert[n] : -1;
  cls[n] = c;
  __syncthreads();
  if (n < N) atomicAdd(&start[c], 1);  // integer: exact in any order
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int64_t k = 0; k < classes; ++k) {
      const int32_t count = start[k];
      offsets[k] = run;
      start[k] = run;
      run += count;
    }
    offsets[classes] = run;
  }
  __syncthreads();
  if (n >= N) return;
  int32_t rank = 0;
  for (int64_t j = 0; j < n; ++j) rank += cls[j] == c;
  perm[start[c] + rank] = int32_t(n);
}

__global__ void k_gather(const float* src, const int32_t* perm, const float* row_scale, int64_t rows, int64_t D,
                         float* dst) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * D; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = perm[i / D];
    const float v = src[n * D + i % D];
    dst[i] = row_scale ? row_scale[n] * v : v;
  }
}

__global__ void k_swiglu(const float* hid, float* act, int64_t rows, int64_t I, const int32_t* rows_dev) {
  if (rows_dev && *rows_dev < rows) rows = *rows_dev;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * I; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / I, j = i % I;
    const float g = hid[r * 2 * I + j], u = hid[r * 2 * I + I + j];
    act[i] = g / (1.0f + expf(-g)) * u;
  }
}

}  // namespace

GpuMoePlan gpu_plan_moe(CudaBackend& be, const int32_t* expert, int64_t N, int64_t E, bool to_host) {
  const int64_t classes = E + 1;
  if (classes > kMaxClasses) fail("cuda", "moe: at most " + std::to_string(kMaxClasses - 1) + " experts");
  GpuMoePlan plan;
  plan.perm = DeviceBuffer(&be, (N > 0 ? N : 1) * 4);
  plan.offsets_dev = DeviceBuffer(&be, (classes + 1) * 4);
  const int64_t tiles = (N + kPlanTile - 1) / kPlanTile;
  if (tiles == 1) {  // decode and other small calls: one launch
    gpu_launch(k_plan_one_tile, 1, kPlanTile, 0, be.stream(), expert, N, classes, plan.offsets_dev.i(),
               plan.perm.i());
    GPU_LAUNCH_CHECK();
  } else {
    DeviceBuffer counts(&be, std::max<int64_t>(1, tiles * classes) * 4),
        starts(&be, std::max<int64_t>(1, tiles * classes) * 4);
    if (tiles > 0) {
      gpu_launch(k_plan_count, unsigned(tiles), kPlanTile, 0, be.stream(), expert, N, classes, counts.i());
      GPU_LAUNCH_CHECK();
    }
    gpu_launch(k_plan_offsets, 1, kPlanTile, 0, be.stream(), counts.i(), tiles, classes, starts.i(),
               plan.offsets_dev.i());
    GPU_LAUNCH_CHECK();
    if (tiles > 0) {
      gpu_launch(k_plan_place, unsigned(tiles), kPlanTile, 0, be.stream(), expert, N, classes, starts.i(),
                 plan.perm.i());
      GPU_LAUNCH_CHECK();
    }
  }
  if (to_host) {
    plan.offsets.resize(static_cast<size_t>(classes + 1));
    be.to_host(plan.offsets.data(), plan.offsets_dev.i(), (classes + 1) * 4);
    plan.routed = plan.offsets[size_t(E)];
  }
  return plan;
}

void gpu_gather_rows(gpuStream_t s, const float* src, const int32_t* perm, const float* row_scale, int64_t rows,
                     int64_t D, float* dst) {
  if (rows * D == 0) return;
  gpu_launch(k_gather, gpu_blocks(rows * D), kGpuThreads, 0, s, src, perm, row_scale, rows, D, dst);
  GPU_LAUNCH_CHECK();
}

void gpu_swiglu(gpuStream_t s, const float* hid, float* act, int64_t rows, int64_t I, const int32_t* rows_dev) {
  if (rows * I == 0) return;
  gpu_launch(k_swiglu, gpu_blocks(rows * I), kGpuThreads, 0, s, hid, act, rows, I, rows_dev);
  GPU_LAUNCH_CHECK();
}

// The grouped GEMMs' cores on this backend's device (gpu_grouped_gemm.h): the pipelined mma.sync
// kernels only in device-grouped mode, where they were asked for (the few-rows weight gradients
// keep WMMA even when the flash attention's check turned mma.sync on).
static GroupedCores grouped_cores(const CudaBackend& be, bool device_grouped) {
  if (be.mma_sync() && device_grouped) return GroupedCores::mma_sync;
  return be.wmma() ? GroupedCores::wmma : GroupedCores::fma;
}

ExpertGemms::ExpertGemms(CudaBackend& be, const int32_t* expert, int64_t N, int64_t E)
    : be_(be),
      E_(E),
      grouped_(be.moe_device_grouped() && be.bf16_matmul()),
      few_rows_(few_rows_for(be, N)),
      plan_(gpu_plan_moe(be, expert, N, E, /*to_host=*/!device_offsets())),
      rows_(device_offsets() ? N : plan_.routed) {}

void ExpertGemms::by_rows(int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& W, int64_t stride_w,
                          float beta, float* C, int64_t ldc) const {
  if (few_rows_) {
    ZAYA_CHECK(W.type == GemmType::BF16 && !A.trans, "moe: few-rows operands");
    const auto* w = static_cast<const bf16_t*>(W.ptr);
    if (A.type == GemmType::F32)
      grouped_gemv_rows(be_.stream(), be_.warp_size(), plan_.offsets_dev.i(), E_, rows_, N, K, 1.0f,
                        static_cast<const float*>(A.ptr), A.ld, w, W.ld, W.trans, stride_w, beta, C, ldc);
    else
      grouped_gemv_rows(be_.stream(), be_.warp_size(), plan_.offsets_dev.i(), E_, rows_, N, K, 1.0f,
                        static_cast<const bf16_t*>(A.ptr), A.ld, w, W.ld, W.trans, stride_w, beta, C, ldc);
    return;
  }
  if (grouped_) {
    ZAYA_CHECK(A.type == GemmType::BF16 && W.type == GemmType::BF16 && !A.trans, "moe: grouped operands");
    grouped_gemm_rows(be_.stream(), grouped_cores(be_, grouped_), plan_.offsets_dev.i(), E_, rows_, N, K, 1.0f,
                      static_cast<const bf16_t*>(A.ptr), A.ld, static_cast<const bf16_t*>(W.ptr), W.ld, W.trans,
                      stride_w, beta, C, ldc);
    return;
  }
  const int64_t elem = W.type == GemmType::BF16 ? 2 : 4;
  for (int64_t e = 0; e < E_; ++e) {
    const int64_t r0 = plan_.offsets[size_t(e)], rows = plan_.offsets[size_t(e + 1)] - r0;
    if (rows == 0) continue;
    GemmOperand w = W;
    w.ptr = static_cast<const char*>(W.ptr) + e * stride_w * elem;
    be_.gemm_ragged(GemmShape::RaggedM, rows, N, K, 1.0f, operand_rows(A, r0), w, beta, C + r0 * ldc, ldc);
  }
}

void ExpertGemms::weight_grads(int64_t M, int64_t N, const GemmOperand& A, const GemmOperand& B, float* C,
                               int64_t ldc, int64_t stride_c) const {
  ZAYA_CHECK(!A.trans && !B.trans, "moe: weight gradient operands are stored by rows");
  if (grouped_ || few_rows_) {
    ZAYA_CHECK(A.type == GemmType::BF16 && B.type == GemmType::BF16, "moe: grouped operands");
    grouped_gemm_weights(be_.stream(), grouped_cores(be_, grouped_), plan_.offsets_dev.i(), E_, M, N, 1.0f,
                         static_cast<const bf16_t*>(A.ptr), A.ld, static_cast<const bf16_t*>(B.ptr), B.ld, 1.0f, C,
                         ldc, stride_c);
    return;
  }
  GemmOperand at = A;
  at.trans = true;  // stored [rows, M]: the logical [M, rows]
  for (int64_t e = 0; e < E_; ++e) {
    const int64_t r0 = plan_.offsets[size_t(e)], rows = plan_.offsets[size_t(e + 1)] - r0;
    if (rows == 0) continue;
    be_.gemm_ragged(GemmShape::RaggedK, M, N, rows, 1.0f, operand_rows(at, r0), operand_rows(B, r0), 1.0f,
                    C + e * stride_c, ldc);
  }
}

void gpu_moe_gate_up(CudaBackend& be, const ExpertGemms& experts, int64_t I, int64_t D, const GemmOperand& xo,
                     const GemmOperand& guo, float* hid, float* act) {
  experts.by_rows(2 * I, D, xo, guo, 2 * I * D, 0.0f, hid, 2 * I);
  gpu_swiglu(be.stream(), hid, act, experts.rows(), I, experts.routed_rows_dev());
}

}  // namespace zaya
