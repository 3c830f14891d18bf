// Autoregressive generation over the incremental decoder: prefill the prompt, then sample
// token by token, calling back with each new token and the logits it was drawn from; stops at
// EOS or max_tokens. Optionally reports the logits at every prompt position (prompt scoring,
// OpenAI's `echo` with `logprobs`), prefilling in chunks so no [T, V] buffer is ever held.
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

// on_token(id, logits): a generated token and the model's raw logits [vocab] it was drawn from
// (before penalties, bias, temperature, top-k and top-p). Returns false to stop early.
using TokenFn = std::function<bool(int32_t id, const float* logits)>;
// on_prompt_logits(p, logits): the logits [vocab] at prompt position p, for p = 0 .. n-1 in
// order; they predict prompt token p + 1 (at the last position, the first generated token).
using PromptLogitsFn = std::function<void(int64_t position, const float* logits)>;

// Prompt positions whose logits one prefill chunk returns when on_prompt_logits is set.
constexpr int64_t kPromptLogitsChunk = 64;

// A prompt's prefill, in pieces: each run() feeds the next positions of the prompt into
// sequence `seq` of `state` (fresh, with room for the prompt), so a server can interleave a long
// prompt with other completions' decoding. Once none remain, last_logits [vocab] holds the last
// position's logits. With on_prompt_logits, every position's logits are reported too, in order,
// from forward passes of at most kPromptLogitsChunk positions.
class PromptPrefill {
 public:
  PromptPrefill(Model& model, const std::vector<int32_t>& prompt, DecodeState& state, float* last_logits,
                PromptLogitsFn on_prompt_logits = {}, int64_t seq = 0);
  void run(int64_t max_positions);  // the next min(max_positions, remaining) positions
  int64_t remaining() const { return int64_t(prompt_.size()) - next_; }

 private:
  Model& model_;
  const std::vector<int32_t>& prompt_;
  DecodeState& state_;
  float* last_logits_;
  PromptLogitsFn on_prompt_logits_;
  std::vector<float> rows_;  // [kPromptLogitsChunk, vocab] with on_prompt_logits
  int64_t seq_;              // the sequence of state_ it runs in
  int64_t next_ = 0;         // prompt positions run so far
};

// The whole prompt at once (PromptPrefill run to the end).
void prefill(Model& model, const std::vector<int32_t>& prompt, DecodeState& state, float* last_logits,
             const PromptLogitsFn& on_prompt_logits = {});

// max_tokens may be 0: then only the prompt is run (and not even that without
// on_prompt_logits).
GenerateStats generate(Model& model, const std::vector<int32_t>& prompt, int64_t max_tokens,
                       const SamplingParams& sampling, uint64_t seed, const TokenFn& on_token,
                       const PromptLogitsFn& on_prompt_logits = {});

}  // namespace zaya
