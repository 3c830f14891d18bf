// How many blocks share one query tile's keys in the CUDA-core attention forward (split-K over
// the keys, as "flash decoding" does). Decode and other short chunks have few query tiles: at
// batch 1, one per query head, so without splitting a handful of blocks each walk the whole KV
// cache, one key after another, while the rest of the GPU idles. With S splits, each block runs
// its own online softmax over 1/S of the tile's visible keys and writes its unnormalised output
// with its running max and sum; a second kernel merges the S slices in a fixed order
// (ops_attention.cu, ops_attention_kernels.h). Plain C++ for the host, checked by
// tests/unit/test_flash_ranges.cpp.
#pragma once

#include <cstdint>

#include "backend/cuda/host_device.h"

namespace zaya {

constexpr int64_t kAttnSplitMinKeys = 256;  // keys a split covers at least when the count is chosen here
constexpr int64_t kAttnMaxSplits = 64;
constexpr int64_t kAttnBlocksPerSm = 4;     // the launch aims at this many blocks per multiprocessor

// blocks: the launch's blocks without splitting; longest: the most keys one query tile may see;
// sms: the device's multiprocessors; forced > 0: that many splits whatever the shape (tests and
// benchmarks; at most kAttnMaxSplits), forced == 0: chosen here. Returns 1 (no split) when the
// launch already fills the device or the keys are too few to be worth a second kernel.
inline int64_t attention_key_splits(int64_t blocks, int64_t longest, int64_t sms, int64_t forced) {
  if (forced > 0) return forced < kAttnMaxSplits ? forced : kAttnMaxSplits;
  const int64_t target = kAttnBlocksPerSm * sms;
  if (blocks <= 0 || sms <= 0 || blocks >= target) return 1;
  int64_t splits = (target + blocks - 1) / blocks;
  if (longest / kAttnSplitMinKeys < splits) splits = longest / kAttnSplitMinKeys;
  if (splits > kAttnMaxSplits) splits = kAttnMaxSplits;
  return splits > 1 ? splits : 1;
}

// The most keys one query tile of tile_q queries may see, over B sequences whose T-query chunks
// start at pos0[b] (host memory): the last query's position + 1, or a window's reach.
inline int64_t attention_longest_keys(const int64_t* pos0, int64_t B, int64_t T, int64_t window, int64_t tile_q) {
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) longest = pos0[b] + T > longest ? pos0[b] + T : longest;
  if (window > 0 && window + tile_q - 1 < longest) longest = window + tile_q - 1;
  return longest;
}

// The keys [begin, end) of split `split` of `splits` over a tile's visible keys [s_begin, s_end):
// equal slices rounded up to whole key tiles of `tile` keys, the last ones possibly empty.
struct AttnKeySlice {
  int64_t begin = 0, end = 0;
};

ZAYA_HOST_DEVICE inline AttnKeySlice attention_key_slice(int64_t s_begin, int64_t s_end, int64_t split, int64_t splits,
                                                         int64_t tile) {
  const int64_t span = s_end > s_begin ? s_end - s_begin : 0;
  const int64_t per = ((span + splits - 1) / splits + tile - 1) / tile * tile;
  AttnKeySlice r;
  r.begin = s_begin + split * per;
  r.end = r.begin + per < s_end ? r.begin + per : s_end;
  if (r.begin > r.end) r.begin = r.end;
  return r;
}

}  // namespace zaya
