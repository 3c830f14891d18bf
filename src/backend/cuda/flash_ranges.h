// The index ranges of the tensor-core flash attention kernels (ops_attention_flash_tc*.cu):
// which key tiles a block of queries must visit, and which query tiles a block of keys must
// visit, under the visibility rule of ops_attention_common.h (key s visible from query t of a
// sequence at offset pos0 iff seg(t) <= s <= pos0 + t and, with a window, pos0 + t - s <
// window). Plain C++ shared by the kernels and the CPU unit test that checks the ranges against
// the rule by brute force (tests/unit/test_flash_ranges.cpp). Document starts are
// non-decreasing in t (packed documents), so a block's first query has the smallest.
#pragma once

#include <cstdint>

#include "backend/cuda/host_device.h"

namespace zaya {

// Key tiles [tile0, tile0 + n_tiles * tile) (tile0 a multiple of tile) holding every key that
// queries [t_begin, t_end) (t_end > t_begin) may see; seg_first: the first query's document
// start (0 without documents); window 0: none.
struct FlashKeyTiles {
  int64_t tile0 = 0, n_tiles = 0;
};

ZAYA_HOST_DEVICE inline FlashKeyTiles flash_key_tiles(int64_t pos0, int64_t t_begin, int64_t t_end, int64_t window,
                                                      int64_t seg_first, int64_t tile) {
  const int64_t pos_first = pos0 + t_begin, pos_last = pos0 + t_end - 1;
  int64_t s_begin = window > 0 && pos_first - window + 1 > 0 ? pos_first - window + 1 : 0;
  if (seg_first > s_begin) s_begin = seg_first;
  FlashKeyTiles r;
  r.tile0 = s_begin / tile * tile;
  r.n_tiles = (pos_last + 1 - r.tile0 + tile - 1) / tile;
  return r;
}

// Query tiles [t0, t0 + n_tiles * tile) (t0 a multiple of tile; n_tiles 0 when none) holding
// every query of a T-query chunk at offset pos0 that may see a key in [s_lo, s_hi).
struct FlashQueryTiles {
  int64_t t0 = 0, n_tiles = 0;
};

ZAYA_HOST_DEVICE inline FlashQueryTiles flash_query_tiles(int64_t pos0, int64_t T, int64_t window, int64_t s_lo,
                                                          int64_t s_hi, int64_t tile) {
  // Position >= s_lo and, with a window, position < s_hi - 1 + window.
  const int64_t t_first = s_lo - pos0 > 0 ? s_lo - pos0 : 0;
  int64_t t_end = T;
  if (window > 0 && s_hi - 1 + window - pos0 < t_end) t_end = s_hi - 1 + window - pos0;
  FlashQueryTiles r;
  r.t0 = t_first / tile * tile;
  r.n_tiles = t_end > t_first ? (t_end - r.t0 + tile - 1) / tile : 0;
  return r;
}

}  // namespace zaya
