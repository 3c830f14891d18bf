// GPU backward of the MoE op: recompute each expert's hidden activations over its contiguous
// rows, then per expert dDown += dY^T act, dAct = dY Down, SwiGLU backward, dGateUp += dH^T X,
// dX = dH GateUp; one block per token finishes dx and the router weight gradient
// dweight = dout . expert(x) (or dout . x for the identity skip). Not yet run on a GPU.
#include "backend/cuda/ops_moe_common.h"

namespace zaya {

namespace {

__global__ void k_moe_finish(const float* dout, const float* ys, const float* dxs, const int32_t* perm,
                             const float* weight, const float* x, float* dx, float* dweight, int64_t routed, int64_t D,
                             int skip_identity) {
  __shared__ double sh[kGpuThreads];
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
  GpuMoePlan plan = gpu_plan_moe(*this, a.expert, N, E);
  const int64_t routed = plan.routed, R = routed > 0 ? routed : 1;  // R: rows of the buffers
  DeviceBuffer xs(this, R * D * 4), dys(this, R * D * 4), hid(this, R * 2 * I * 4), act(this, R * I * 4),
      ys(this, R * D * 4), dact(this, R * I * 4), dhid(this, R * 2 * I * 4), dxs(this, R * D * 4);
  DeviceBuffer hx, hdy, hgu, hdn, hact, hdhid;
  if (routed > 0) {
    gpu_gather_rows(stream_, a.x, plan.perm.i(), nullptr, routed, D, xs.f());
    gpu_gather_rows(stream_, dout, plan.perm.i(), a.weight, routed, D, dys.f());  // weight[n] * dout[n]
    const GemmOperand xo = operand(xs.f(), routed, D, D, false, bf16, hx);
    const GemmOperand dyo = operand(dys.f(), routed, D, D, false, bf16, hdy);
    GemmOperand guo = operand(a.gate_up, E * 2 * I, D, D, true, bf16, hgu);
    GemmOperand dno = operand(a.down, E * D, I, I, true, bf16, hdn);
    // Recompute: hid = xs GU^T, act = SwiGLU(hid), ys = act DN^T.
    gpu_moe_gate_up(*this, plan, E, I, D, routed, xo, guo, hid.f(), act.f());
    const GemmOperand ao = operand(act.f(), routed, I, I, false, bf16, hact);
    GemmOperand dyt = dyo;
    dyt.trans = true;
    for_each_expert(plan, E, [&](int64_t e, int64_t r0, int64_t rows) {
      gemm_ragged(rows, D, I, 1.0f, operand_rows(ao, r0), operand_rows(dno, e * D), 0.0f, ys.f() + r0 * D, D);
      if (ddown)  // ddown[e] [D, I] += dys^T act
        gemm_ragged(D, I, rows, 1.0f, operand_rows(dyt, r0), operand_rows(ao, r0), 1.0f, ddown + e * D * I, I);
      GemmOperand dn_plain = operand_rows(dno, e * D);
      dn_plain.trans = false;  // dact = dys DN, DN stored [D, I] = [K, N]
      gemm_ragged(rows, I, D, 1.0f, operand_rows(dyo, r0), dn_plain, 0.0f, dact.f() + r0 * I, I);
    });
    gpu_swiglu_backward(stream_, hid.f(), dact.f(), dhid.f(), routed, I);
    GemmOperand dho = operand(dhid.f(), routed, 2 * I, 2 * I, false, bf16, hdhid);
    GemmOperand dht = dho;
    dht.trans = true;
    for_each_expert(plan, E, [&](int64_t e, int64_t r0, int64_t rows) {
      if (dgate_up)  // dgate_up[e] [2I, D] += dhid^T xs
        gemm_ragged(2 * I, D, rows, 1.0f, operand_rows(dht, r0), operand_rows(xo, r0), 1.0f, dgate_up + e * 2 * I * D, D);
      GemmOperand gu_plain = operand_rows(guo, e * 2 * I);
      gu_plain.trans = false;  // dxs = dhid GU, GU stored [2I, D] = [K, N]
      gemm_ragged(rows, D, 2 * I, 1.0f, operand_rows(dho, r0), gu_plain, 0.0f, dxs.f() + r0 * D, D);
    });
  }
  k_moe_finish<<<unsigned(N), kGpuThreads, 0, stream_>>>(dout, ys.f(), dxs.f(), plan.perm.i(), a.weight, a.x, dx,
                                                         dweight, routed, D, a.skip_identity);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
