// Token log-probabilities (see logprobs.h).
#include "serve/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace zaya {

TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int top_n) {
  if (vocab <= 0 || id < 0 || id >= vocab)
    fail("logprobs", "token id " + std::to_string(id) + " is outside the vocabulary");
  double mx = logits[0];
  for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, double(logits[j]));
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(logits[j]) - mx);
  const double log_z = mx + std::log(sum);
  TokenLogprob r;
  r.logprob = float(double(logits[id]) - log_z);
  const int64_t n = std::clamp<int64_t>(top_n, 0, vocab);
  if (n > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t k = 0; k < n; ++k)
      r.top.emplace_back(idx[size_t(k)], float(double(logits[idx[size_t(k)]]) - log_z));
  }
  return r;
}

}  // namespace zaya
