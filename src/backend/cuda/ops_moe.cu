// GPU mixture-of-experts forward: device routing plan, gather of each expert's tokens into
// contiguous rows, a grouped GEMM pair per expert (gate_up, SwiGLU, down; bf16 operands by
// policy, fp32 accumulation), and a scatter applying the unbiased router weight. Skip-class
// tokens output 0 or weight*x. The experts' GEMMs run per expert from host offsets or grouped
// from device offsets (ExpertGemms): passed against the CPU backend on an H100 in both forms. A
// few tokens (decode) run as two fused GEMV kernels from the router's classes, with no plan (not
// yet run on a GPU).
#include "backend/cuda/gpu_grouped_gemm.h"
#include "backend/cuda/ops_moe_common.h"

namespace zaya {

namespace {

__global__ void k_moe_scatter(const float* ys, const int32_t* perm, const float* weight, const float* x, float* out,
                              int64_t N, const int32_t* routed_dev, int64_t D, int skip_identity) {
  const int64_t routed = *routed_dev;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * D; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / D, d = i % D, n = perm[row];
    const float w = weight[n];
    float v = 0.0f;
    if (row < routed) v = w * ys[row * D + d];
    else if (skip_identity) v = w * x[n * D + d];
    out[n * D + d] = v;
  }
}

}  // namespace

void CudaBackend::moe(const MoeArgs& a) {
  const int64_t N = a.N, D = a.D, I = a.I, E = a.E;
  if (N == 0) return;
  const bool bf16 = options_.bf16_matmul;
  if (ExpertGemms::few_rows_for(*this, N)) {  // decode: two launches, no plan (gpu_grouped_gemm.h)
    DeviceBuffer hgu, hdn, act(this, N * I * 4);
    const GemmOperand guo = weight_operand(a.gate_up, E * 2 * I, D, true, bf16, hgu);  // each expert [2I, D]
    const GemmOperand dno = weight_operand(a.down, E * D, I, true, bf16, hdn);         // each expert [D, I]
    ZAYA_CHECK(guo.type == GemmType::BF16 && dno.type == GemmType::BF16 && guo.trans && dno.trans,
               "moe: few-rows weights");
    moe_gate_up_swiglu_tokens(stream_, warp_size_, a.expert, E, N, I, D, a.x, static_cast<const bf16_t*>(guo.ptr),
                              guo.ld, 2 * I * D, act.f());
    moe_down_weighted_tokens(stream_, warp_size_, a.expert, E, N, D, I, act.f(), static_cast<const bf16_t*>(dno.ptr),
                             dno.ld, D * I, a.weight, a.x, a.skip_identity, a.out);
    return;
  }
  const ExpertGemms experts(*this, a.expert, N, E);
  const GpuMoePlan& plan = experts.plan();
  const int64_t rows = experts.rows(), R = rows > 0 ? rows : 1;  // R: rows of the buffers
  DeviceBuffer xs(this, R * D * 4), hid(this, R * 2 * I * 4), act(this, R * I * 4), ys(this, R * D * 4);
  DeviceBuffer hx, hgu, hdn, hact;
  if (rows > 0) {
    gpu_gather_rows(stream_, a.x, plan.perm.i(), nullptr, rows, D, xs.f());
    const GemmOperand xo = operand(xs.f(), rows, D, D, false, bf16, hx);
    const GemmOperand guo = weight_operand(a.gate_up, E * 2 * I, D, true, bf16, hgu);  // each expert [2I, D]
    const GemmOperand dno = weight_operand(a.down, E * D, I, true, bf16, hdn);         // each expert [D, I]
    gpu_moe_gate_up(*this, experts, I, D, xo, guo, hid.f(), act.f());
    const GemmOperand ao = operand(act.f(), rows, I, I, false, bf16, hact);
    experts.by_rows(D, I, ao, dno, D * I, 0.0f, ys.f(), D);  // ys = act DN_e^T
  }
  gpu_launch(k_moe_scatter, gpu_blocks(N * D), kGpuThreads, 0, stream_, ys.f(), plan.perm.i(), a.weight, a.x,
             a.out, N, plan.routed_dev(E), D, a.skip_identity);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
