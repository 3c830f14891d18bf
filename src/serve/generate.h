// Autoregressive generation over the incremental decoder: prefill the prompt, then sample
// token by token, calling back with each new token; stops at EOS or max_tokens.
#pragma once
#include <functional>
#include <vector>

#include "model/model.h"
#include "serve/sampling.h"

namespace zaya {

struct GenerateStats {
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t prompt_tokens = 0, generated = 0, decode_steps = 0;
  bool stopped_at_eos = false;
};

// on_token returns false to stop early.
GenerateStats generate(Model& model, const std::vector<int32_t>& prompt, int64_t max_tokens,
                       const SamplingParams& sampling, uint64_t seed,
                       const std::function<bool(int32_t)>& on_token);

}  // namespace zaya
