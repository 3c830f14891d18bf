// The index ranges of the GPU flash attention kernels (src/backend/cuda/flash_ranges.h),
// checked on the host by brute force against the visibility rule (key s visible from query t
// iff seg(t) <= s <= pos0 + t and, with a window, pos0 + t - s < window) over random chunks:
// decode offsets, sliding windows, packed-document starts, lengths that are not multiples of
// the tiles. A block of queries must be given every key any of them sees, and a block of keys
// every query that sees one of them, without reading past the padded operands (rows rounded up
// to 64, as the kernels pack them). Also the key splits of the attention forward for short
// chunks (src/backend/cuda/attention_key_splits.h): how many blocks share a query tile's keys, and
// the slices they take, which must cover the tile's visible keys exactly once, in order, in whole
// key tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention_key_splits.h"
#include "backend/cuda/flash_ranges.h"

namespace zaya {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct Chunk {
  int64_t T = 0, S = 0, pos0 = 0, window = 0;
  std::vector<int64_t> seg;  // [T] document start of each query's position (0 without documents)

  bool visible(int64_t t, int64_t s) const {
    const int64_t pos = pos0 + t;
    return s >= seg[size_t(t)] && s <= pos && (window <= 0 || pos - s < window);
  }
  std::string describe() const {
    const bool documents = std::any_of(seg.begin(), seg.end(), [](int64_t x) { return x > 0; });
    return "T " + std::to_string(T) + " S " + std::to_string(S) + " pos0 " + std::to_string(pos0) + " window " +
           std::to_string(window) + (documents ? " with documents" : "");
  }
};

// Packed documents: starts at random positions (about one in 30), non-decreasing in t.
void add_documents(Chunk& c, std::mt19937_64& rng) {
  int64_t start = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    if (std::uniform_int_distribution<int>(0, 30)(rng) == 0) start = c.pos0 + t;
    c.seg[size_t(t)] = start;
  }
}

Chunk random_chunk(std::mt19937_64& rng) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Chunk c;
  c.T = uniform(1, 300);
  c.pos0 = uniform(0, 3) == 0 ? uniform(1, 120) : 0;
  c.S = c.pos0 + c.T + uniform(0, 1) * uniform(0, 70);
  c.window = uniform(0, 2) == 0 ? uniform(1, 160) : 0;
  c.seg.assign(size_t(c.T), 0);
  if (uniform(0, 1) == 1) add_documents(c, rng);
  return c;
}

// Every window from 0 (none) to 70 over a few lengths and offsets, with and without documents:
// off-by-one errors at the window's edge show only when it meets a tile boundary, which random
// windows rarely do; then random larger chunks.
std::vector<Chunk> chunks() {
  std::mt19937_64 rng(11);
  std::vector<Chunk> out;
  for (int64_t T : {int64_t(1), int64_t(17), int64_t(64), int64_t(100), int64_t(131)})
    for (int64_t pos0 : {int64_t(0), int64_t(5), int64_t(37)})
      for (int64_t window = 0; window <= 70; ++window)
        for (bool documents : {false, true}) {
          Chunk c;
          c.T = T;
          c.pos0 = pos0;
          c.S = pos0 + T + (window % 3 == 0 ? 9 : 0);
          c.window = window;
          c.seg.assign(size_t(T), 0);
          if (documents) add_documents(c, rng);
          out.push_back(c);
        }
  for (int i = 0; i < 100; ++i) out.push_back(random_chunk(rng));
  return out;
}

TEST(FlashRanges, KeyTilesHoldEveryVisibleKey) {
  for (const Chunk& c : chunks()) {
    for (int64_t rows : {int64_t(64), int64_t(16)})
      for (int64_t tile : {int64_t(64), int64_t(16)})
        for (int64_t t_begin = 0; t_begin < c.T; t_begin += rows) {
          const int64_t t_end = std::min(t_begin + rows, c.T);
          const FlashKeyTiles k = flash_key_tiles(c.pos0, t_begin, t_end, c.window, c.seg[size_t(t_begin)], tile);
          const std::string what = c.describe() + ", queries " + std::to_string(t_begin) + ".." +
                                   std::to_string(t_end) + ", tile " + std::to_string(tile);
          ASSERT_EQ(k.tile0 % tile, 0) << what;
          ASSERT_GE(k.tile0, 0) << what;
          ASSERT_GE(k.n_tiles, 1) << what;  // every query sees its own position
          ASSERT_LE(k.tile0 + k.n_tiles * tile, round_up(c.S, tile)) << what << ": past the packed keys";
          for (int64_t t = t_begin; t < t_end; ++t)
            for (int64_t s = 0; s < c.S; ++s)
              if (c.visible(t, s)) {
                ASSERT_TRUE(s >= k.tile0 && s < k.tile0 + k.n_tiles * tile)
                    << what << ": key " << s << " seen by query " << t << " is outside the tiles";
              }
        }
  }
}

TEST(FlashRanges, QueryTilesHoldEveryQueryThatSeesTheKeys) {
  for (const Chunk& c : chunks()) {
    for (int64_t keys : {int64_t(64), int64_t(16)})
      for (int64_t tile : {int64_t(32), int64_t(16)})
        for (int64_t s_lo = 0; s_lo < c.S; s_lo += keys) {
          const int64_t s_hi = std::min(s_lo + keys, c.S);
          const FlashQueryTiles q = flash_query_tiles(c.pos0, c.T, c.window, s_lo, s_hi, tile);
          const std::string what = c.describe() + ", keys " + std::to_string(s_lo) + ".." + std::to_string(s_hi) +
                                   ", tile " + std::to_string(tile);
          ASSERT_EQ(q.t0 % tile, 0) << what;
          ASSERT_GE(q.n_tiles, 0) << what;
          if (q.n_tiles > 0) {
            ASSERT_LE(q.t0 + q.n_tiles * tile, round_up(c.T, 64)) << what << ": past the packed queries";
          }
          for (int64_t t = 0; t < c.T; ++t)
            for (int64_t s = s_lo; s < s_hi; ++s)
              if (c.visible(t, s)) {
                ASSERT_TRUE(q.n_tiles > 0 && t >= q.t0 && t < q.t0 + q.n_tiles * tile)
                    << what << ": query " << t << " sees key " << s << " but is outside the tiles";
              }
        }
  }
}

// The ranges are not just "everything": a causal chunk's first block of 64 queries visits one
// key tile, and a window keeps a late block's keys to the window's tiles.
TEST(FlashRanges, RangesSkipWhatNoQuerySees) {
  const FlashKeyTiles first = flash_key_tiles(0, 0, 64, 0, 0, 64);
  EXPECT_EQ(first.tile0, 0);
  EXPECT_EQ(first.n_tiles, 1);
  const FlashKeyTiles windowed = flash_key_tiles(0, 1024, 1088, 128, 0, 64);  // sees keys 897..1087
  EXPECT_EQ(windowed.tile0, 896);
  EXPECT_EQ(windowed.n_tiles, 3);
  const FlashQueryTiles late_keys = flash_query_tiles(0, 4096, 0, 4032, 4096, 32);  // queries 4032..4095
  EXPECT_EQ(late_keys.t0, 4032);
  EXPECT_EQ(late_keys.n_tiles, 2);
  const FlashQueryTiles unseen = flash_query_tiles(100, 50, 0, 200, 264, 32);  // positions 100..149 < 200
  EXPECT_EQ(unseen.n_tiles, 0);
}

TEST(AttentionKeySplits, SplitOnlyWhatLeavesTheDeviceIdleAndHasKeysEnough) {
  const int64_t sms = 132;
  // Decode at batch 1 over 32k keys: 8 blocks (one per query head) would use 8 of 132
  // multiprocessors; 66 splits reach 4 blocks a multiprocessor, capped at 64.
  EXPECT_EQ(attention_key_splits(8, 32768, sms, 0), kAttnMaxSplits);
  // Batch 16 over 2k keys: 128 blocks; 528 wanted, so 5 splits, and 2048 keys allow 8.
  EXPECT_EQ(attention_key_splits(128, 2048, sms, 0), 5);
  // Short caches keep every split at 256 keys or more: 600 keys, at most 2.
  EXPECT_EQ(attention_key_splits(8, 600, sms, 0), 2);
  EXPECT_EQ(attention_key_splits(8, 511, sms, 0), 1);
  // A launch that already fills the device is not split, however long the cache.
  EXPECT_EQ(attention_key_splits(4 * sms, 32768, sms, 0), 1);
  EXPECT_EQ(attention_key_splits(4 * sms - 1, 32768, sms, 0), 2);
  // An unknown device (0 multiprocessors) is never split; a forced count is taken as it is, up
  // to the most the merge supports.
  EXPECT_EQ(attention_key_splits(8, 32768, 0, 0), 1);
  EXPECT_EQ(attention_key_splits(1000, 10, sms, 3), 3);
  EXPECT_EQ(attention_key_splits(8, 32768, sms, 1000), kAttnMaxSplits);
}

TEST(AttentionKeySplits, LongestKeysAreTheLastPositionOrTheWindowsReach) {
  const int64_t pos0[] = {100, 1000, 7};
  EXPECT_EQ(attention_longest_keys(pos0, 3, 5, 0, 16), 1005);  // sequence 1's last query at 1004
  EXPECT_EQ(attention_longest_keys(pos0, 1, 5, 0, 16), 105);
  // A window of 200: a tile's 16 queries reach 200 + 15 keys at most.
  EXPECT_EQ(attention_longest_keys(pos0, 3, 5, 200, 16), 215);
  EXPECT_EQ(attention_longest_keys(pos0, 1, 5, 2000, 16), 105);
}

TEST(AttentionKeySplits, SlicesCoverTheKeysOnceInWholeTiles) {
  std::mt19937_64 rng(7);
  const int64_t tile = 32;
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t s_begin = int64_t(rng() % 3000);
    const int64_t s_end = s_begin + int64_t(rng() % 5000) * (trial % 10 == 0 ? 0 : 1);
    const int64_t splits = 1 + int64_t(rng() % kAttnMaxSplits);
    const std::string what = "keys [" + std::to_string(s_begin) + ", " + std::to_string(s_end) + ") over " +
                             std::to_string(splits) + " splits";
    int64_t next = s_begin;
    for (int64_t j = 0; j < splits; ++j) {
      const AttnKeySlice r = attention_key_slice(s_begin, s_end, j, splits, tile);
      ASSERT_LE(r.begin, r.end) << what << ", split " << j;
      if (r.begin == r.end) {  // empty slices come after every key is taken
        ASSERT_EQ(next, s_end) << what << ", split " << j << ": empty while keys are left";
        continue;
      }
      ASSERT_EQ(r.begin, next) << what << ", split " << j << ": a gap or an overlap";
      ASSERT_LE(r.end, s_end) << what << ", split " << j;
      // Every slice but the last of the keys is whole key tiles.
      if (r.end < s_end) {
        ASSERT_EQ((r.end - r.begin) % tile, 0) << what << ", split " << j;
      }
      next = r.end;
    }
    ASSERT_EQ(next, s_end) << what << ": keys left over";
    // One split is the whole range.
    const AttnKeySlice whole = attention_key_slice(s_begin, s_end, 0, 1, tile);
    ASSERT_EQ(whole.begin, s_begin) << what;
    ASSERT_EQ(whole.end, s_end) << what;
  }
}

}  // namespace
}  // namespace zaya
