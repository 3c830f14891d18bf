// GPU backward of the MoE op (experts' GEMMs per expert or grouped, ExpertGemms): recompute
// each expert's hidden activations over its contiguous rows, then per expert dDown += (w dY)^T
// act and dA = dY Down with the unweighted dY. One block per row takes the router weight's
// gradient as dA . act (= dY . expert(x), without recomputing the down GEMM) and the SwiGLU
// backward of w dA; then dGateUp += dH^T X and dX = dH GateUp, and one block per token
// finishes dx and dweight (dout . x for the identity skip). The per-expert and grouped forms
// passed against the CPU backend on an H100 with the recomputed down GEMM; the dA . act form
// has passed the same tests in the host emulation of the GPU (tests/simt) and not yet on one.
#include "backend/cuda/ops_moe_common.h"

namespace zaya {

namespace {

// One block per grouped row r < rows (and < *rows_dev when given): dweight_rows[r] = dA[r] .
// act[r] (dA = dY Down, unweighted), then the SwiGLU backward of dact = weight[perm[r]] * dA
// into dhid.
__global__ void k_moe_router_grad_swiglu_backward(const float* hid, const float* act, const float* da,
                                                  const int32_t* perm, const float* weight, float* dhid,
                                                  float* dweight_rows, int64_t rows, int64_t I,
                                                  const int32_t* rows_dev) {
  __shared__ double sh[kGpuThreads];
  if (rows_dev && *rows_dev < rows) rows = *rows_dev;
  const int64_t r = blockIdx.x;
  if (r >= rows) return;  // the whole block leaves together: no barrier is skipped
  const float w = weight[perm[r]];
  double dw = 0;
  for (int64_t j = threadIdx.x; j < I; j += blockDim.x) {
    const float g = hid[r * 2 * I + j], u = hid[r * 2 * I + I + j];
    const float sg = 1.0f / (1.0f + expf(-g));
    const float dar = da[r * I + j];
    dw += double(dar) * act[r * I + j];
    const float dact = w * dar;
    dhid[r * 2 * I + j] = dact * u * sg * (1.0f + g * (1.0f - sg));
    dhid[r * 2 * I + I + j] = dact * g * sg;
  }
  dw = block_sum(dw, sh);
  if (threadIdx.x == 0) dweight_rows[r] = float(dw);
}

__global__ void k_moe_finish(const float* dout, const float* dweight_rows, const float* dxs,
                             const int32_t* perm, const float* weight, const float* x, float* dx,
                             float* dweight, const int32_t* routed_dev, int64_t D, int skip_identity) {
  __shared__ double sh[kGpuThreads];
  const int64_t routed = *routed_dev;
  const int64_t row = blockIdx.x, n = perm[row];
  float* dxn = dx + n * D;
  if (row < routed) {
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dxn[d] += dxs[row * D + d];
    if (threadIdx.x == 0) dweight[n] = dweight_rows[row];
    return;
  }
  double dw = 0;
  if (skip_identity) {
    const float* g = dout + n * D;
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
  DeviceBuffer xs(this, R * D * 4), dyus(this, R * D * 4), hid(this, R * 2 * I * 4), act(this, R * I * 4),
      da(this, R * I * 4), dhid(this, R * 2 * I * 4), dxs(this, R * D * 4), dweight_rows(this, R * 4);
  DeviceBuffer dys, hx, hdyu, hdy, hgu, hdn, hact, hdhid;
  if (rows > 0) {
    gpu_gather_rows(stream_, a.x, plan.perm.i(), nullptr, rows, D, xs.f());
    gpu_gather_rows(stream_, dout, plan.perm.i(), nullptr, rows, D, dyus.f());  // dout[n], unweighted
    const GemmOperand xo = operand(xs.f(), rows, D, D, false, bf16, hx);
    const GemmOperand dyuo = operand(dyus.f(), rows, D, D, false, bf16, hdyu);
    const GemmOperand guo = operand(a.gate_up, E * 2 * I, D, D, true, bf16, hgu);
    const GemmOperand dno = operand(a.down, E * D, I, I, true, bf16, hdn);
    // Recompute: hid = xs GU^T, act = SwiGLU(hid), from the operand the forward used (the
    // few-rows GEMVs read fp32 rows; xo's bf16 copy still feeds the weight gradient).
    const GemmOperand x_forward = experts.few_rows() ? f32_operand(xs.f(), D, false) : xo;
    gpu_moe_gate_up(*this, experts, I, D, x_forward, guo, hid.f(), act.f());
    const GemmOperand ao = operand(act.f(), rows, I, I, false, bf16, hact);
    if (ddown) {  // ddown[e] [D, I] += (weight * dout)^T act
      dys = DeviceBuffer(this, R * D * 4);
      gpu_gather_rows(stream_, dout, plan.perm.i(), a.weight, rows, D, dys.f());
      const GemmOperand dyo = operand(dys.f(), rows, D, D, false, bf16, hdy);
      experts.weight_grads(D, I, dyo, ao, ddown, I, D * I);
    }
    GemmOperand dn_plain = dno;
    dn_plain.trans = false;  // da = dyus DN, DN stored [D, I] = [K, N]
    experts.by_rows(I, D, dyuo, dn_plain, D * I, 0.0f, da.f(), I);
    gpu_launch(k_moe_router_grad_swiglu_backward, unsigned(rows), kGpuThreads, 0, stream_, hid.f(), act.f(),
               da.f(), plan.perm.i(), a.weight, dhid.f(), dweight_rows.f(), rows, I,
               experts.routed_rows_dev());
    GPU_LAUNCH_CHECK();
    const GemmOperand dho = operand(dhid.f(), rows, 2 * I, 2 * I, false, bf16, hdhid);
    if (dgate_up) experts.weight_grads(2 * I, D, dho, xo, dgate_up, D, 2 * I * D);  // dgate_up[e] [2I, D] += dhid^T xs
    GemmOperand gu_plain = guo;
    gu_plain.trans = false;  // dxs = dhid GU, GU stored [2I, D] = [K, N]
    experts.by_rows(D, 2 * I, dho, gu_plain, 2 * I * D, 0.0f, dxs.f(), D);
  }
  gpu_launch(k_moe_finish, unsigned(N), kGpuThreads, 0, stream_, dout, dweight_rows.f(), dxs.f(),
             plan.perm.i(), a.weight, a.x, dx, dweight, plan.routed_dev(E), D, a.skip_identity);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
