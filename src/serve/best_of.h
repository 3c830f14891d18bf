// best_of: a request generates best_of candidates per prompt and returns the n of them whose
// sampled tokens are likeliest on average under the model (OpenAI's "highest log probability
// per token"). Pure selection over finished results; no model, no I/O.
#pragma once
#include <cstdint>
#include <vector>

#include "serve/completion_engine.h"

namespace zaya {

// A candidate's rank: the mean of its scored tokens' log-probabilities; -infinity (last) when
// none was scored (max_tokens 0, or cancelled before its first token) or the mean is NaN.
double mean_token_logprob(const CompletionResult& candidate);

// candidates holds `prompts` groups of best_of results, prompt-major (candidate j of prompt i
// at i * best_of + j). Returns prompts groups of n, prompt-major, each group's likeliest first;
// equal means keep the lower candidate index first.
std::vector<CompletionResult> keep_best_of(std::vector<CompletionResult> candidates, int64_t best_of,
                                           int64_t n);

}  // namespace zaya
