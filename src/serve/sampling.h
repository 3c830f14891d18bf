// Token sampling from logits: greedy (temperature 0), temperature, top-k and top-p (nucleus),
// driven by zaya's deterministic Rng so a seed reproduces a generation exactly.
#pragma once
#include <cstdint>

#include "core/rng.h"

namespace zaya {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
};

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, Rng& rng);

}  // namespace zaya
