// Flash-style causal GQA attention forward on the tensor cores (CUDA sm_80+, mma.sync m16n8k16
// bf16 with fp32 accumulation), for chunks of kAttnGemmMinQueries or more queries under the bf16
// policy and head_dim 64 or 128 (CudaBackendOptions::attention_flash_tc). K and V are packed to
// bf16 once per call (ops_attention_flash_tc_common.h). One block of 4 warps per 64 queries of
// one head; each warp keeps its 16 query rows as A fragments, and per tile of 64 keys:
//   S = Q K^T in registers; the visibility rule (causal, sliding window, document starts,
//   decode offsets) and the scale applied in place; an online softmax per row in base 2, the
//   row max reduced over the 4 lanes that share a row; the output accumulator (registers)
//   rescaled; O += P V with P rounded to bf16 straight from the score registers.
// K and V tiles are double-buffered through cp.async, so the next tile loads while this one
// multiplies. Scores never leave registers. The same kernel, with lse_only, computes just the
// rows' log-sum-exp for the backward (ops_attention_flash_tc_backward.cu). HIP, fp32 and other
// head dims keep the GEMM path.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_attention_flash_tc_common.h"
#include "backend/cuda/ops_attention_flash_tc_kernels.h"

namespace zaya {

#if defined(ZAYA_GPU_MMA_SYNC)
namespace {

using namespace flash_tc;

template <int DH, bool kLseOnly>
void launch_forward(gpuStream_t s, const FlashParams& p) {
  const size_t bytes = ForwardLayout<DH, kLseOnly>::bytes;  // over the default 48 KiB for DH 128: allowed per kernel (sm_80+)
  GPU_CHECK(gpuFuncSetAttribute(reinterpret_cast<const void*>(&k_flash_forward<DH, kLseOnly>),
                                gpuFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  const dim3 grid(unsigned((p.a.T + kFlashRows - 1) / kFlashRows), unsigned(p.a.Hq), unsigned(p.a.B));
  gpu_launch(k_flash_forward<DH, kLseOnly>, grid, kFlashThreads, bytes, s, p);
  GPU_LAUNCH_CHECK();
}

}  // namespace

void flash_pack_rows(gpuStream_t s, const float* src, bf16_t* dst, int64_t B, int64_t rows, int64_t rows_pad,
                     int64_t H, int64_t dh, const int64_t* pos0, int64_t chunk) {
  gpu_launch(k_pack_rows, gpu_blocks(B * H * rows_pad * dh / 4), kGpuThreads, 0, s, src, dst, B, rows,
             rows_pad, H, dh, pos0, chunk);
  GPU_LAUNCH_CHECK();
}

FlashCall::FlashCall(CudaBackend& be, const AttentionArgs& a, const char* op) {
  fp.a = attn_params(be, a, 32, op, pos0, seg);  // the flash kernels are CUDA-only: 32-lane warps
  fp.S_pad = flash_padded(a.S);
  fp.T_pad = flash_padded(a.T);
  fp.scale_log2 = a.scale * 1.4426950408889634f;
  const int64_t kv_bytes = a.B * a.Hkv * fp.S_pad * a.dh * 2;
  k = DeviceBuffer(&be, kv_bytes);
  v = DeviceBuffer(&be, kv_bytes);
  flash_pack_rows(be.stream(), a.k_cache, k.h(), a.B, a.S, fp.S_pad, a.Hkv, a.dh, fp.a.pos0, a.T);
  flash_pack_rows(be.stream(), a.v_cache, v.h(), a.B, a.S, fp.S_pad, a.Hkv, a.dh, fp.a.pos0, a.T);
  fp.k = k.h();
  fp.v = v.h();
}

size_t flash_forward_smem_bytes(int64_t dh) { return dh == 64 ? ForwardLayout<64>::bytes : ForwardLayout<128>::bytes; }

void flash_forward(gpuStream_t s, const FlashParams& p, bool lse_only) {
  if (p.a.dh == 64) lse_only ? launch_forward<64, true>(s, p) : launch_forward<64, false>(s, p);
  else if (p.a.dh == 128) lse_only ? launch_forward<128, true>(s, p) : launch_forward<128, false>(s, p);
  else fail("cuda", "flash attention: head_dim " + std::to_string(p.a.dh) + " is not 64 or 128");
}
#endif

bool CudaBackend::attention_flash_tc_enabled() const {
#if defined(ZAYA_GPU_MMA_SYNC)
  return options_.attention_flash_tc && options_.bf16_matmul && mma_sync_ok_;
#else
  return false;
#endif
}

bool CudaBackend::attention_flash_tc_applies(const AttentionArgs& a, std::initializer_list<const void*> more) const {
  if (!attention_flash_tc_enabled() || (a.dh != 64 && a.dh != 128)) return false;
#if defined(ZAYA_GPU_MMA_SYNC)
  // Forward and backward together or not at all (sm_86/89 allow 99 KB a block: not dQ's at 128).
  const size_t smem = std::max(flash_forward_smem_bytes(a.dh), flash_backward_smem_bytes(a.dh));
  if (int64_t(smem) > max_shared_per_block_) return false;
#endif
  // The kernels move 16 bytes a thread (float4 loads, cp.async) and store float2 pairs.
  if (!gpu_aligned(a.q) || !gpu_aligned(a.k_cache) || !gpu_aligned(a.v_cache) || !gpu_aligned(a.out)) return false;
  for (const void* ptr : more)
    if (!gpu_aligned(ptr)) return false;
  return true;
}

void CudaBackend::attention_flash_tc(const AttentionArgs& a) {
#if defined(ZAYA_GPU_MMA_SYNC)
  FlashCall call(*this, a, "attention");
  call.fp.a.out = a.out;
  flash_forward(stream_, call.fp, false);
#else
  (void)a;
  fail("cuda", "attention: the tensor-core flash kernel is CUDA-only");
#endif
}

}  // namespace zaya
