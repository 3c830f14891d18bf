// The CCA's grouped conv stage (spec A.5: each head's G = head_dim channels mixed over t1 taps)
// through the GEMM engine. For sequence b and tap j, the rows y[b, j .. j + T) of group g times
// the tap's [G x G] weight matrix is one GEMM; the C / G groups are one strided batch (the
// groups sit G columns apart in every row), so a sequence costs t1 BLASLt calls forward and
// 2 t1 backward. Operands stay fp32 (spec A.11), accumulated in fp32 by the library. Replaced
// per-element kernels that took 23 ms (forward) and 16 ms (backward) per layer at 16384 tokens
// on an H100. T (the token count, and with packed documents each row's expanded length) is the
// GEMMs' ragged dimension (GemmShape::RaggedM / RaggedK), so changing lengths share plans rather
// than building one per length. Passed against the CPU backend on an H100.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_cca_common.h"

namespace zaya {

namespace {

// w_r[((g * t1 + j) * G + co) * G + ci] = w_grp[((g * G + co) * G + ci) * t1 + j]: per group
// and tap, the [co][ci] matrix.
__global__ void k_weights_by_tap(const float* w_grp, float* w_r, int64_t C, int64_t G, int64_t t1) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < C * G * t1; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ci = i % G, co = (i / G) % G, j = (i / (G * G)) % t1, g = i / (G * G * t1);
    w_r[i] = w_grp[((g * G + co) * G + ci) * t1 + j];
  }
}

// dw_grp[((g * G + co) * G + ci) * t1 + j] += dw_r[((g * t1 + j) * G + co) * G + ci]
__global__ void k_add_weights_from_taps(const float* dw_r, float* dw_grp, int64_t C, int64_t G, int64_t t1) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < C * G * t1; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % t1, ci = (i / t1) % G, co = (i / (t1 * G)) % G, g = i / (t1 * G * G);
    dw_grp[i] += dw_r[((g * t1 + j) * G + co) * G + ci];
  }
}

// z[r, c] = bias[c]
__global__ void k_bias_rows(float* z, const float* bias, int64_t rows, int64_t C) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * C; i += int64_t(gridDim.x) * blockDim.x)
    z[i] = bias[i % C];
}

DeviceBuffer weights_by_tap(CudaBackend& be, const float* w_grp, int64_t C, int64_t G, int64_t t1) {
  DeviceBuffer w_r(&be, C * G * t1 * 4);
  gpu_launch(k_weights_by_tap, gpu_blocks(C * G * t1), kGpuThreads, 0, be.stream(), w_grp, w_r.f(), C, G, t1);
  GPU_LAUNCH_CHECK();
  return w_r;
}

// The C / G head groups as one strided batch: group g's columns start g * G into the
// activation rows (A and C), its per-tap weights g * t1 * G * G into w_r (B).
GemmBatch head_groups(int64_t C, int64_t G, int64_t t1) {
  if (G <= 0 || C % G != 0)
    fail("cuda", "cca_conv: " + std::to_string(C) + " channels are not whole groups of " + std::to_string(G));
  GemmBatch groups;
  groups.count = C / G;
  groups.stride_a = G;
  groups.stride_b = t1 * G * G;
  groups.stride_c = G;
  return groups;
}

}  // namespace

void grouped_conv_gemm(CudaBackend& be, const float* y, const float* w_grp, const float* b_grp, float* z, int64_t B,
                       int64_t T, int64_t C, int64_t G, int64_t t1) {
  if (B * T * C == 0) return;
  const GemmBatch groups = head_groups(C, G, t1);
  const int64_t Ly = T + t1 - 1;
  const DeviceBuffer w_r = weights_by_tap(be, w_grp, C, G, t1);
  gpu_launch(k_bias_rows, gpu_blocks(B * T * C), kGpuThreads, 0, be.stream(), z, b_grp, B * T, C);
  GPU_LAUNCH_CHECK();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < t1; ++j) {
      // z[b, t, co] += sum_ci y[b, t + j, ci] W_j[co, ci]: A = y rows [T, G], B = W_j stored [co][ci] (trans).
      be.gemm(T, G, G, 1.0f, f32_operand(y + (b * Ly + j) * C, C, false), f32_operand(w_r.f() + j * G * G, G, true),
              1.0f, z + b * T * C, C, groups, GemmCompute::Exact, GemmShape::RaggedM);
    }
}

void grouped_conv_gemm_backward(CudaBackend& be, const float* dz, const float* y, const float* w_grp, float* dy,
                                float* dw_grp, int64_t B, int64_t T, int64_t C, int64_t G, int64_t t1) {
  const int64_t Ly = T + t1 - 1;
  if (B * Ly * C == 0) return;
  const GemmBatch groups = head_groups(C, G, t1);
  be.fill(dy, 0.0f, B * Ly * C);
  if (T == 0) return;
  const DeviceBuffer w_r = weights_by_tap(be, w_grp, C, G, t1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < t1; ++j) {
      // dy[b, t + j, ci] += sum_co dz[b, t, co] W_j[co, ci]: B = W_j stored [co][ci] = [K][N].
      be.gemm(T, G, G, 1.0f, f32_operand(dz + b * T * C, C, false), f32_operand(w_r.f() + j * G * G, G, false), 1.0f,
              dy + (b * Ly + j) * C, C, groups, GemmCompute::Exact, GemmShape::RaggedM);
    }
  if (!dw_grp) return;
  DeviceBuffer dw_r(&be, C * G * t1 * 4);
  GemmBatch dw_groups = groups;  // group g: dz and y columns g*G.., dw_r matrices g*t1*G*G..
  dw_groups.stride_b = G;
  dw_groups.stride_c = t1 * G * G;
  for (int64_t j = 0; j < t1; ++j)
    for (int64_t b = 0; b < B; ++b) {
      // dW_j[co, ci] (+)= sum_t dz[b, t, co] y[b, t + j, ci]: A = dz stored [T][co] (trans), B = y rows [T][ci].
      be.gemm(G, G, T, 1.0f, f32_operand(dz + b * T * C, C, true), f32_operand(y + (b * Ly + j) * C, C, false),
              b == 0 ? 0.0f : 1.0f, dw_r.f() + j * G * G, G, dw_groups, GemmCompute::Exact, GemmShape::RaggedK);
    }
  gpu_launch(k_add_weights_from_taps, gpu_blocks(C * G * t1), kGpuThreads, 0, be.stream(), dw_r.f(), dw_grp,
             C, G, t1);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
