// GPU backward of causal GQA attention (queries at pos0 + t over S keys), flash-style recompute in
// two kernels and no atomics:
//   dQ kernel, one warp per query: D = rowsum(dO * O); pass 1 over keys for the row
//     log-sum-exp; pass 2: P = exp(S - lse), dP = dO V^T, dS = P (dP - D) scale, dQ = dS K.
//     Stores lse and D for the second kernel.
//   dK/dV kernel, one warp per key: over the query heads of its KV group and the queries that
//     can see it: dV += P dO, dK += dS Q.
// fp32 throughout. Used for chunks of fewer than kAttnGemmMinQueries queries, as the forward's
// warp kernels are, so that the O it reads came from fp32 arithmetic too (whole, or merged from key
// slices in decode-sized launches over long caches: the same up to rounding). Longer chunks go
// through the GEMM engine (ops_attention_gemm.cu), which recomputes P and never reads O, or, when
// asked, the tensor-core flash backward (ops_attention_flash_tc_backward.cu), which reads the O of
// the flash forward that the same option selects.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_attention_backward_kernels.h"
#include "backend/cuda/ops_attention_common.h"

namespace zaya {

using namespace attention_bwd;  // the kernels (ops_attention_backward_kernels.h)

void CudaBackend::attention_backward(const AttentionArgs& a, const float* dout, float* dq, float* dk, float* dv) {
  if (a.B * a.T == 0) return;
  // Long chunks: the tensor-core flash backward when asked, else the GEMM path. Both place queries
  // at pos0 + t over the S keys: training's layout (pos0 = 0, S = T), and a context-parallel
  // chunk over its whole gathered sequence, whose keys past the chunk get gradient 0.
  if (a.T >= kAttnGemmMinQueries) {
    if (attention_flash_tc_applies(a, {dout, dq, dk, dv})) return attention_backward_flash_tc(a, dout, dq, dk, dv);
    return attention_backward_gemm(a, dout, dq, dk, dv);
  }
  DeviceBuffer pos0, seg;
  AttnParams p = attn_params(*this, a, warp_size_, "attention_backward", pos0, seg);
  DeviceBuffer lse(this, a.B * a.T * a.Hq * 4), drow(this, a.B * a.T * a.Hq * 4);
  p.o = a.out; p.dout = dout;
  p.dq = dq; p.dk = dk; p.dv = dv; p.lse = lse.f(); p.drow = drow.f();
  const unsigned threads = unsigned(kAttnWarps * warp_size_);
  const int64_t tile_q = int64_t(kAttnWarps) * kQueriesPerWarp, tile_k = int64_t(kAttnWarps) * kKeysPerWarp;
  dim3 grid_q(unsigned((a.T + tile_q - 1) / tile_q), unsigned(a.Hq), unsigned(a.B));
  gpu_launch(k_attention_dq, grid_q, threads, 0, stream_, p);
  GPU_LAUNCH_CHECK();
  dim3 grid_k(unsigned((a.S + tile_k - 1) / tile_k), unsigned(a.Hkv), unsigned(a.B));
  gpu_launch(k_attention_dkdv, grid_k, threads, 0, stream_, p);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
