// Deterministic training windows over a token file: sample i of the global stream is a pure
// function of (seed, i), so a run resumes at any step by restoring one counter, and data-
// parallel ranks can take disjoint sample indices of the same stream.
#pragma once
#include <cstdint>
#include <vector>

#include "data/token_file.h"

namespace zaya {

class WindowSampler {
 public:
  WindowSampler(const TokenFile& data, int64_t seq_len, uint64_t seed);
  // inputs/targets: [n, seq_len] for global samples first .. first+n-1.
  void fill(int64_t first, int64_t n, int32_t* inputs, int32_t* targets) const;
  // Evaluation: window k of a fixed, evenly spaced tiling (no randomness).
  void fill_eval(int64_t k, int64_t n, int32_t* inputs, int32_t* targets) const;
  int64_t windows() const { return int64_t(data_.tokens.size()) - seq_len_ - 1; }

 private:
  void window(int64_t start, int32_t* in, int32_t* tg) const;
  const TokenFile& data_;
  int64_t seq_len_;
  uint64_t seed_;
};

}  // namespace zaya
