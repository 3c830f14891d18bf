// GPU backward of the MoE op (experts' GEMMs per expert or grouped, ExpertGemms): recompute
// each expert's hidden activations over its contiguous rows, then per expert dDown += dY^T act,
// dAct = dY Down, SwiGLU backward, dGateUp += dH^T X, dX = dH GateUp; one block per token
// finishes dx and the router weight gradient dweight = dout . expert(x) (or dout . x for the
// identity skip). Passed against the CPU backend on an H100 in both forms.
#include "backend/cuda/ops_moe_common.h"

namespace zaya {

namespace {

__global__ void k_moe_finish(const float* dout, const float* ys, const float* dxs, const int32_t* perm,
                             const float* weight, const float* x, float* dx, float* dweight, const int32_t* routed_dev,
                             int64_t D, int skip_identity) {
  __shared__ double sh[kGpuThreads];
  const int64_t routed = *routed_dev;
  const int64_t row = blockIdx.x, n = perm[row];
  const float* g = dout + n * D;
  float* dxn = dx + n * D;
  double dw = 0;
  if (row < routed) {
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      dw += double(g[d]) * ys[row * D + d];
      dxn[d] += dxs[row * D + d];
    }
  } else if (skip_identity) {
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      dw += double(g[d]) * x[n * D + d];
      dxn[d] += weight[n] * g[d];
    }
  }
  dw = block_sum(dw, sh);
  if (threadIdx.x == 0) dweight[n] = float(dw);
}

}  // namespace

void CudaBackend::moe_backward(const MoeArgs& a, const float* dout, float* dx, float* dweight, float* dgate_up,
                               float* ddown) {
  const int64_t N = a.N, D = a.D, I = a.I, E = a.E;
  if (N == 0) return;
  const bool bf16 = options_.bf16_matmul;
  const ExpertGemms experts(*this, a.expert, N, E);
  const GpuMoePlan& plan = experts.plan();
  const int64_t rows = experts.rows(), R = rows > 0 ? rows : 1;  // R: rows of the buffers
  DeviceBuffer xs(this, R * D * 4), dys(this, R * D * 4), hid(this, R * 2 * I * 4), act(this, R * I * 4),
      ys(this, R * D * 4), dact(this, R * I * 4), dhid(this, R * 2 * I * 4), dxs(this, R * D * 4);
  DeviceBuffer hx, hdy, hgu, hdn, hact, hdhid;
  if (rows > 0) {
    gpu_gather_rows(stream_, a.x, plan.perm.i(), nullptr, rows, D, xs.f());
    gpu_gather_rows(stream_, dout, plan.perm.i(), a.weight, rows, D, dys.f());  // weight[n] * dout[n]
    const GemmOperand xo = operand(xs.f(), rows, D, D, false, bf16, hx);
    const GemmOperand dyo = operand(dys.f(), rows, D, D, false, bf16, hdy);
    const GemmOperand guo = operand(a.gate_up, E * 2 * I, D, D, true, bf16, hgu);
    const GemmOperand dno = operand(a.down, E * D, I, I, true, bf16, hdn);
    // Recompute: hid = xs GU^T, act = SwiGLU(hid), ys = act DN^T.
    gpu_moe_gate_up(*this, experts, I, D, xo, guo, hid.f(), act.f());
    const GemmOperand ao = operand(act.f(), rows, I, I, false, bf16, hact);
    experts.by_rows(D, I, ao, dno, D * I, 0.0f, ys.f(), D);
    if (ddown) experts.weight_grads(D, I, dyo, ao, ddown, I, D * I);  // ddown[e] [D, I] += dys^T act
    GemmOperand dn_plain = dno;
    dn_plain.trans = false;  // dact = dys DN, DN stored [D, I] = [K, N]
    experts.by_rows(I, D, dyo, dn_plain, D * I, 0.0f, dact.f(), I);
    gpu_swiglu_backward(stream_, hid.f(), dact.f(), dhid.f(), rows, I, experts.routed_rows_dev());
    const GemmOperand dho = operand(dhid.f(), rows, 2 * I, 2 * I, false, bf16, hdhid);
    if (dgate_up) experts.weight_grads(2 * I, D, dho, xo, dgate_up, D, 2 * I * D);  // dgate_up[e] [2I, D] += dhid^T xs
    GemmOperand gu_plain = guo;
    gu_plain.trans = false;  // dxs = dhid GU, GU stored [2I, D] = [K, N]
    experts.by_rows(D, 2 * I, dho, gu_plain, 2 * I * D, 0.0f, dxs.f(), D);
  }
  gpu_launch(k_moe_finish, unsigned(N), kGpuThreads, 0, stream_, dout, ys.f(), dxs.f(), plan.perm.i(),
             a.weight, a.x, dx, dweight, plan.routed_dev(E), D, a.skip_identity);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
