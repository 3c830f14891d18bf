// Backward of the tensor-core flash attention (CUDA sm_80+, mma.sync m16n8k16 bf16, fp32
// accumulation; ops_attention_flash_tc.cu has the forward), for the same chunks: 64 or more
// queries, bf16 policy, head_dim 64 or 128. Nothing of size T x S reaches device memory, and
// nothing is accumulated with atomics, so the result repeats bitwise:
//   1. Q, dO, K, V packed to bf16 (K and V rows past each sequence's last position zeroed);
//      D = rowsum(dO * O) per query row, in fp32 from the fp32 O and dO rounded to bf16: the dO
//      of the dP products, which D must match (dS = scale P (dP - D) cancels where the values
//      share an offset; D from the fp32 dO gave dq and dk 2.7x the GEMM path's error there);
//   2. the forward kernel in its lse_only form: each row's base-2 log-sum-exp;
//   3. dQ, one block per 64 queries of a head, over tiles of 64 keys (double-buffered):
//      S = Q K^T, dP = dO V^T, P = 2^(x - lse2) on visible keys, dS = scale P (dP - D),
//      dQ += dS K, with P and dS kept in registers and dS fed to the tensor cores as A fragments;
//   4. dK and dV, one block per 64 keys of a KV group, each warp 16 keys, over the query heads of
//      the group and tiles of 32 queries (double-buffered): S^T = K Q^T, dP^T = V dO^T,
//      dV += P^T dO, dK += dS^T Q, written once at the end.
// P and dS are rounded to bf16 as the GEMM path rounds them; the visibility rule is the
// forward's (causal, sliding window, document starts, decode offsets).
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_attention_flash_tc_backward_kernels.h"
#include "backend/cuda/ops_attention_flash_tc_common.h"

namespace zaya {

#if defined(ZAYA_GPU_MMA_SYNC)
namespace {

using namespace flash_tc;

template <typename Kernel>
void launch_with_smem(Kernel kernel, size_t bytes, dim3 grid, gpuStream_t s, const FlashParams& p) {
  GPU_CHECK(gpuFuncSetAttribute(reinterpret_cast<const void*>(kernel), gpuFuncAttributeMaxDynamicSharedMemorySize,
                                int(bytes)));
  gpu_launch(kernel, grid, kFlashThreads, bytes, s, p);
  GPU_LAUNCH_CHECK();
}

template <int DH>
void launch_backward(gpuStream_t s, const FlashParams& p) {
  const AttnParams& a = p.a;
  launch_with_smem(k_flash_dq<DH>, DqLayout<DH>::bytes,
                   dim3(unsigned((a.T + kFlashRows - 1) / kFlashRows), unsigned(a.Hq), unsigned(a.B)), s, p);
  launch_with_smem(k_flash_dkdv<DH>, DkvLayout<DH>::bytes,
                   dim3(unsigned((a.S + kFlashKeys - 1) / kFlashKeys), unsigned(a.Hkv), unsigned(a.B)), s, p);
}

}  // namespace

size_t flash_backward_smem_bytes(int64_t dh) {
  return dh == 64 ? std::max(DqLayout<64>::bytes, DkvLayout<64>::bytes)
                  : std::max(DqLayout<128>::bytes, DkvLayout<128>::bytes);
}
#endif

void CudaBackend::attention_backward_flash_tc(const AttentionArgs& a, const float* dout, float* dq, float* dk,
                                              float* dv) {
#if defined(ZAYA_GPU_MMA_SYNC)
  FlashCall call(*this, a, "attention_backward");
  FlashParams& fp = call.fp;
  fp.a.o = a.out;
  fp.a.dout = dout;
  fp.a.dq = dq;
  fp.a.dk = dk;
  fp.a.dv = dv;
  const int64_t q_bytes = a.B * a.Hq * fp.T_pad * a.dh * 2;
  DeviceBuffer qp(this, q_bytes), dop(this, q_bytes);
  DeviceBuffer lse2(this, a.B * a.Hq * fp.T_pad * 4), drow(this, a.B * a.Hq * fp.T_pad * 4);
  flash_pack_rows(stream_, a.q, qp.h(), a.B, a.T, fp.T_pad, a.Hq, a.dh);
  flash_pack_rows(stream_, dout, dop.h(), a.B, a.T, fp.T_pad, a.Hq, a.dh);
  fp.q = qp.h();
  fp.dout = dop.h();
  fp.lse2 = lse2.f();
  fp.drow = drow.f();
  gpu_launch(k_flash_drow, gpu_warp_blocks(a.B * a.T * a.Hq, 32), kGpuThreads, 0, stream_, dout, a.out,
             fp.drow, a.B, a.T, a.Hq, a.dh, fp.T_pad);
  GPU_LAUNCH_CHECK();
  flash_forward(stream_, fp, true);  // lse2 only
  if (a.dh == 64) launch_backward<64>(stream_, fp);
  else launch_backward<128>(stream_, fp);
#else
  (void)a; (void)dout; (void)dq; (void)dk; (void)dv;
  fail("cuda", "attention_backward: the tensor-core flash kernels are CUDA-only");
#endif
}

}  // namespace zaya
