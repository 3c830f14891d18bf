// Window sampling for training and evaluation (see sampler.h).
#include "train/sampler.h"

#include "core/error.h"

namespace zaya {

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

WindowSampler::WindowSampler(const TokenFile& data, int64_t seq_len, uint64_t seed)
    : data_(data), seq_len_(seq_len), seed_(seed) {
  if (windows() < 1)
    fail("data", "the token file holds " + std::to_string(data.tokens.size()) + " tokens, too few for seq_len " +
                     std::to_string(seq_len));
}

void WindowSampler::window(int64_t start, int32_t* in, int32_t* tg) const {
  for (int64_t t = 0; t < seq_len_; ++t) {
    in[t] = int32_t(data_.tokens[size_t(start + t)]);
    tg[t] = int32_t(data_.tokens[size_t(start + t + 1)]);
  }
}

void WindowSampler::fill(int64_t first, int64_t n, int32_t* inputs, int32_t* targets) const {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = mix(mix(seed_) ^ uint64_t(first + i));
    window(int64_t(h % uint64_t(windows())), inputs + i * seq_len_, targets + i * seq_len_);
  }
}

void WindowSampler::fill_eval(int64_t k, int64_t n, int32_t* inputs, int32_t* targets) const {
  const int64_t tiles = std::max<int64_t>(1, windows() / seq_len_);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = ((k * n + i) % tiles) * seq_len_;
    window(std::min(start, windows() - 1), inputs + i * seq_len_, targets + i * seq_len_);
  }
}

}  // namespace zaya
