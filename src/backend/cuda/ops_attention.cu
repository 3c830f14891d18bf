// GPU causal GQA attention over a KV cache, flash-style: one block per (query tile, head,
// sequence), key/value tiles staged in shared memory, an online softmax per query kept in
// registers (by one warp, or by every warp of the block over its share of the keys for a tile of
// at most 4 queries, merged at the end), so memory is O(tile) rather than O(T^2). fp32 scores and
// softmax (CUDA cores). Supports per-sequence start positions (chunked prefill, decode), sliding
// windows and packed-document starts. Used for short chunks (decode); when such a launch has too
// few blocks for the device and the cache is long, each query tile's keys are split over several
// blocks and a second kernel merges their slices (attention_key_splits.h). Chunks of
// kAttnGemmMinQueries or more queries go through the GEMM engine (ops_attention_gemm.cu) or, when
// asked, the tensor-core flash kernel (ops_attention_flash_tc.cu), at any offset (prefill
// chunks, context-parallel chunks).
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_attention_common.h"
#include "backend/cuda/ops_attention_kernels.h"

namespace zaya {

using namespace attention_fwd;  // the kernels (ops_attention_kernels.h)

void CudaBackend::attention(const AttentionArgs& a) {
  if (a.B * a.T == 0) return;
  if (a.T >= kAttnGemmMinQueries)
    return attention_flash_tc_applies(a) ? attention_flash_tc(a) : attention_gemm(a);
  DeviceBuffer pos0, seg;
  AttnParams p = attn_params(*this, a, warp_size_, "attention", pos0, seg);
  p.out = a.out;
  const int64_t tile_q = int64_t(kAttnWarps) * kQueriesPerWarp, tiles = (a.T + tile_q - 1) / tile_q;
  const int64_t longest = attention_longest_keys(a.pos0, a.B, a.T, a.window, tile_q);
  p.splits = attention_key_splits(tiles * a.Hq * a.B, longest, multiprocessors_, options_.attention_key_splits);
  DeviceBuffer part;
  if (p.splits > 1) {
    part = DeviceBuffer(this, a.B * a.T * a.Hq * p.splits * (a.dh + 2) * 4);
    p.part = part.f();
  }
  dim3 grid(unsigned(tiles * p.splits), unsigned(a.Hq), unsigned(a.B));
  gpu_launch(k_attention, grid, unsigned(kAttnWarps * warp_size_), 0, stream_, p);
  GPU_LAUNCH_CHECK();
  if (p.splits > 1) {
    gpu_launch(k_attention_merge, gpu_warp_blocks(a.B * a.T * a.Hq, warp_size_), kGpuThreads, 0, stream_, p);
    GPU_LAUNCH_CHECK();
  }
}

}  // namespace zaya
