// Token sampling from logits: greedy (temperature 0), temperature, top-k and top-p (nucleus),
// driven by zaya's deterministic Rng so a seed reproduces a generation exactly; and OpenAI's
// logit adjustments (presence and frequency penalties over the tokens generated so far, and a
// per-token bias), applied before any of them.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/rng.h"

namespace zaya {

struct SamplingParams {
  SamplingParams() = default;
  SamplingParams(float temperature_, int64_t top_k_, float top_p_)
      : temperature(temperature_), top_k(top_k_), top_p(top_p_) {}

  float temperature = 1.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  // logit[j] -= frequency_penalty * count[j] + presence_penalty * (count[j] > 0), where count[j]
  // is how often token j was generated so far in this completion (the prompt does not count).
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)

  bool adjusts_logits() const {
    return presence_penalty != 0 || frequency_penalty != 0 || !logit_bias.empty();
  }
};

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, Rng& rng);

// One completion's sampler: its own Rng (seeded once), the counts of the tokens it has drawn
// (for the penalties) and a scratch copy for the adjusted logits. next() draws token after
// token; the same seed and logits give the same tokens wherever the sequence runs (alone or
// in a batch).
class TokenSampler {
 public:
  TokenSampler(const SamplingParams& params, int64_t vocab, uint64_t seed);
  // Applies the adjustments to a copy of logits [vocab] (left untouched), samples, and counts
  // the token as generated.
  int32_t next(const float* logits);

 private:
  SamplingParams params_;
  int64_t vocab_;
  Rng rng_;
  std::vector<float> adjusted_;
  std::vector<int32_t> counts_;
};

// The adjustments above, in place. counts: [vocab] generated-token counts (may be empty when
// both penalties are 0). Ids outside [0, vocab) in logit_bias are an error.
void adjust_logits(float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& counts);

}  // namespace zaya
