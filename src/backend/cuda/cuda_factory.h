// Plain C++ entry points of the GPU backend (no vendor header): what make_backend("cuda") and
// the GPU tests call. Defined in cuda_backend.cu; only linked when zaya is configured with
// -DZAYA_CUDA=ON (compile definition ZAYA_CUDA).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace zaya {

struct CudaBackendOptions {
  int device = 0;
  // true: linear and MoE GEMMs take bf16 operands (fp32 accumulation, fp32 outputs), the
  // project's GPU precision policy. false: every GEMM in fp32 (for exact comparisons).
  bool bf16_matmul = true;
  // true: our tiled GEMM kernel even where cuBLASLt/hipBLASLt exists (tests the HIP path on CUDA).
  bool portable_gemm = false;
  // true (with bf16_matmul): the MoE's experts run as grouped GEMMs driven by the routing
  // offsets on the device, with no host round trip per layer (gpu_grouped_gemm.h; tensor cores
  // on CUDA sm_80+, FMAs on HIP or with portable_gemm).
  // false: one BLASLt GEMM per expert after copying the offsets to the host. Off by default:
  // on an H100 the grouped kernels pass their tests but are slower (docs/benchmarks.md);
  // make_backend turns it on when the environment sets ZAYA_MOE_DEVICE_GROUPED=1.
  bool moe_device_grouped = false;
  // true (with bf16_matmul, not moe_device_grouped): MoE calls of at most kGroupedGemvMaxRows
  // (16) tokens, as decode makes them, run their experts' products as device GEMVs from the
  // device offsets (gpu_grouped_gemv.cu), with no host round trip. false: the per-expert GEMMs
  // at every size; make_backend sets it when the environment has ZAYA_MOE_PER_EXPERT=1.
  bool moe_few_rows_gemv = true;
  // true: linears of at most kLinearGemvMaxRows (4) token rows, as decode makes them, run as one
  // kernel on the fp32 activations (gpu_gemv.h), with the bias added in it: under the bf16 policy
  // the dense linears read the weight's bf16 copy (no conversion of the activations, no bias
  // pass), and the fp32 linears (the router, generation's logits; every linear under the fp32
  // policy) the fp32 weights as stored. false: GEMMs at every size; make_backend sets it when
  // the environment has ZAYA_LINEAR_GEMM=1.
  bool linear_few_rows_gemv = true;
  // true (with bf16_matmul and a BLASLt engine): the training and evaluation LM head
  // (lm_head_loss) multiplies its fp32 operands as three TF32 tensor-core GEMMs each
  // (tf32_split.h: fp32 accuracy, spec A.11), over vocabulary slices. false: exact fp32 GEMMs
  // (CUDA cores); make_backend sets it when the environment has ZAYA_LM_HEAD_EXACT=1.
  // Generation's logits (few rows) always use exact fp32.
  bool lm_head_tf32x3 = true;
  // Token rows per chunk of the LM head (0: as many as keep a chunk's fp32 logits within 1 GiB)
  // and vocabulary rows per slice of the 3xTF32 head (0: as many as keep a slice's split copies
  // within 256 MiB of weight and 512 MiB of logits). Tests set them small to cover several.
  int64_t lm_head_chunk_rows = 0;
  int64_t lm_head_vocab_slice = 0;
  // The 3xTF32 LM head splits the whole weight once per call when both split copies fit in this
  // many bytes, else each slice as it goes (tests set 0 to cover that path).
  int64_t lm_head_split_cache_bytes = int64_t(1) << 30;
  // Newton-Schulz's GEMM operands under the bf16 policy. true (the spec's C.4 proposal): bf16
  // operands with fp32 accumulation and fp32 iterates, 2-3% from fp32 in the Frobenius norm
  // (bench/ns_bf16_study) and about 1.6x faster than TF32 on an H100 (docs/benchmarks.md).
  // false: TF32 (fp32 operands on the tensor cores; within 1e-2 of fp32 per element);
  // make_backend sets it when the environment has ZAYA_NS_TF32=1.
  bool newton_schulz_bf16 = true;
  // true (with newton_schulz_bf16): the iterates X, A and B are bf16 as well: each product
  // writes its bf16 result directly (cuBLASLt bf16 C and D) and reads the b A and a X terms in
  // bf16, as PyTorch's Muon runs it, so no operand is packed per iteration. On the host it is
  // nearer fp32 than fp32 iterates with bf16 operands (1.2-1.8% against 2.0-3.3% in the
  // Frobenius norm, bench/ns_bf16_study); make_backend sets it when the environment has
  // ZAYA_NS_BF16_ITERATES=1.
  bool newton_schulz_bf16_iterates = false;
  // Small host-to-device uploads (positions, cache offsets, document starts: CudaBackend::upload)
  // are staged in a pinned ring of this many chunks of this many bytes (staging_ring.h), so
  // their copies run in stream order without a wait (HIP waited for the GPU after each) or the
  // driver's staging of pageable memory (CUDA). Larger uploads, and every upload when the ring
  // is off (chunks 0; make_backend sets that when the environment has ZAYA_UPLOAD_PAGEABLE=1) or
  // its pinned memory cannot be had, copy from the caller's memory as before. Tests set tiny
  // chunks to make the ring wrap.
  int64_t upload_staging_chunk_bytes = 256 << 10;
  int upload_staging_chunks = 8;
  // Most bytes of bf16 weight shadows (Backend::set_weights_frozen) held at once; past it, a
  // weight matrix is converted per call as when not frozen. -1: half the device memory free
  // (including the pool's cached blocks) when the weights are frozen.
  int64_t weight_shadow_budget_bytes = -1;
  // true (with bf16_matmul, on CUDA sm_80+): attention of 64 or more queries with head_dim 64
  // or 128 runs forward and backward as flash kernels on the tensor cores (mma.sync:
  // ops_attention_flash_tc.cu, ops_attention_flash_tc_backward.cu) instead of through the GEMM
  // engine with materialised scores; make_backend sets it when the environment has
  // ZAYA_ATTN_FLASH=1. Ignored, with a warning at start, where the check of the mma.sync
  // primitives fails on the device (cuda_mma_self_check).
  bool attention_flash_tc = false;
  // The attention forward of chunks under 64 queries (decode) splits each query tile's keys over
  // this many blocks, merged by a second kernel; 0: chosen from the launch's size, the keys and
  // the device's multiprocessors (attention_key_splits.h), 1: never. make_backend takes it from
  // ZAYA_ATTN_KEY_SPLITS when set (tests and benchmarks). The slices take B T Hq N (dh + 2) floats
  // of workspace per call: a few MB as chosen, hundreds of MB if N is forced high at a large batch.
  int attention_key_splits = 0;
};

// The options make_backend gives the GPU backend it names ("cuda": bf16 GEMMs; "cuda-fp32":
// every GEMM in fp32, for exact comparisons with the CPU) on GPU `device` mod `visible_gpus` (more
// ranks than GPUs on a node share them: the host-staged MPI path allows it, NCCL does not), with
// the environment's switches (NAME=1): ZAYA_MOE_DEVICE_GROUPED, ZAYA_MOE_PER_EXPERT, ZAYA_LM_HEAD_EXACT,
// ZAYA_NS_TF32, ZAYA_NS_BF16_ITERATES, ZAYA_ATTN_FLASH; and ZAYA_ATTN_KEY_SPLITS=N (0 to 64; anything
// else fails naming the variable). cuda_options.cpp (every build).
CudaBackendOptions cuda_backend_options_for(const std::string& name, int device, int visible_gpus);

// The GPU backend (CUDA, or HIP when built with hipcc). Throws zaya::Error("cuda", ...) when
// no device is usable.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

// Number of usable GPUs (0 when there is no driver or no device); never throws.
int cuda_device_count();

// Whether this build has the tensor-core (mma.sync) kernels: the flash attention and the
// pipelined grouped GEMMs. CUDA builds do (they run on sm_80 and newer devices), HIP builds do
// not, nor does the host emulation with 64-lane warps (tests/simt).
bool cuda_tensor_core_kernels_built();

// The warp-level tensor-core primitives (mma.sync, ldmatrix, cp.async, bf16x2 rounding) run on
// the GPU backend's device with inputs drawn from `seed`, against plain products of the same
// values (gpu_mma_check.cu). ran: false where the build or device has no mma.sync kernels (HIP,
// below sm_80, the portable kernels); mismatches: one line per primitive that disagrees, empty
// when all agree. The backend runs it once at start when a path that uses those kernels is asked
// for, and keeps them off when it fails. Throws zaya::Error when `gpu` is not the GPU backend.
struct MmaSelfCheck {
  bool ran = false;
  std::vector<std::string> mismatches;
};
MmaSelfCheck cuda_mma_self_check(Backend& gpu, uint64_t seed);

}  // namespace zaya
