// best_of's selection of the likeliest candidates (see best_of.h).
#include "serve/best_of.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace zaya {

double mean_token_logprob(const CompletionResult& candidate) {
  const double mean =
      candidate.scored_tokens > 0 ? candidate.logprob_sum / double(candidate.scored_tokens) : NAN;
  return std::isnan(mean) ? -INFINITY : mean;
}

std::vector<CompletionResult> keep_best_of(std::vector<CompletionResult> candidates, int64_t best_of,
                                           int64_t n) {
  if (!(n >= 1 && best_of >= n && int64_t(candidates.size()) % best_of == 0))
    fail("serve", "best_of: " + std::to_string(candidates.size()) + " candidates cannot be kept " +
                      std::to_string(n) + " of every " + std::to_string(best_of) +
                      "; expected groups of best_of >= n >= 1 candidates");
  const int64_t prompts = int64_t(candidates.size()) / best_of;
  std::vector<CompletionResult> kept;
  kept.reserve(size_t(prompts * n));
  std::vector<int64_t> order(static_cast<size_t>(best_of));
  for (int64_t p = 0; p < prompts; ++p) {
    CompletionResult* group = candidates.data() + p * best_of;
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return mean_token_logprob(group[a]) > mean_token_logprob(group[b]);
    });
    for (int64_t k = 0; k < n; ++k) kept.push_back(std::move(group[order[size_t(k)]]));
  }
  return kept;
}

}  // namespace zaya
