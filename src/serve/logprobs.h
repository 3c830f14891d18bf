// Log-probabilities of tokens, as OpenAI's completions API reports them (`logprobs: N`): the
// model's own log-softmax at temperature 1, before penalties, bias, temperature, top-k or top-p
// (what the model thinks, not what the sampler did), for the chosen token and the N most
// likely ones. Pure functions over one row of logits.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zaya {

constexpr int kMaxLogprobs = 20;  // the most alternatives a request may ask for per token

struct TokenLogprob {
  float logprob = 0;                           // log p(id)
  std::vector<std::pair<int32_t, float>> top;  // the top_n most likely ids, best first (ties: lower id)
};

// log-softmax(logits)[id] and the top_n best entries, computed in double.
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int top_n);

// One column of a choice's "logprobs" object (tokens, token_logprobs, top_logprobs, text_offset).
struct LogprobEntry {
  std::string token;             // the text this token added to the choice's text
  int64_t text_offset = 0;       // where that text starts in the choice's text
  std::optional<float> logprob;  // none for a prompt's first token: nothing predicts it
  // The most likely tokens at this position as text, best first; none with logprob.
  std::optional<std::vector<std::pair<std::string, float>>> top;
};

}  // namespace zaya
