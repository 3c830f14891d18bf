// Prefill + decode loop (see generate.h).
#include "serve/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace zaya {

PromptPrefill::PromptPrefill(Model& model, const std::vector<int32_t>& prompt, DecodeState& state,
                             float* last_logits, PromptLogitsFn on_prompt_logits, int64_t seq)
    : model_(model),
      prompt_(prompt),
      state_(state),
      last_logits_(last_logits),
      on_prompt_logits_(std::move(on_prompt_logits)),
      seq_(seq) {
  ZAYA_CHECK(seq >= 0 && seq < state.batch, "prefill: sequence index out of range");
  if (prompt.empty() || state.pos[size_t(seq)] != 0)
    fail("prefill", "a prompt of " + std::to_string(prompt.size()) +
                        " tokens cannot be prefilled into a sequence at position " +
                        std::to_string(state.pos[size_t(seq)]) +
                        "; expected a non-empty prompt and a fresh sequence");
  if (on_prompt_logits_)
    rows_.resize(size_t(std::min(int64_t(prompt.size()), kPromptLogitsChunk) * model.config().vocab_size));
}

void PromptPrefill::run(int64_t max_positions) {
  const int64_t V = model_.config().vocab_size,
                end = std::min(int64_t(prompt_.size()), next_ + max_positions);
  while (next_ < end) {
    if (!on_prompt_logits_) {
      ForwardOutputs last;
      last.logits = last_logits_;
      last.last_only = true;
      model_.forward(prompt_.data() + next_, 1, end - next_, &state_, last, nullptr, seq_);
      next_ = end;
      return;
    }
    const int64_t T = std::min(kPromptLogitsChunk, end - next_);
    ForwardOutputs all;
    all.logits = rows_.data();
    model_.forward(prompt_.data() + next_, 1, T, &state_, all, nullptr, seq_);
    for (int64_t t = 0; t < T; ++t) on_prompt_logits_(next_ + t, rows_.data() + t * V);
    std::copy_n(rows_.data() + (T - 1) * V, V, last_logits_);
    next_ += T;
  }
}

void prefill(Model& model, const std::vector<int32_t>& prompt, DecodeState& state, float* last_logits,
             const PromptLogitsFn& on_prompt_logits) {
  PromptPrefill p(model, prompt, state, last_logits, on_prompt_logits);
  p.run(int64_t(prompt.size()));
}

GenerateStats generate(Model& model, const std::vector<int32_t>& prompt, int64_t max_tokens,
                       const SamplingParams& sampling, uint64_t seed, const TokenFn& on_token,
                       const PromptLogitsFn& on_prompt_logits) {
  const ModelConfig& c = model.config();
  const int64_t V = c.vocab_size, n = int64_t(prompt.size());
  if (prompt.empty()) fail("generate", "the prompt has no tokens");
  if (max_tokens < 0) fail("generate", "max tokens must be >= 0, got " + std::to_string(max_tokens));
  const int64_t ctx = n + max_tokens;
  if (ctx > c.max_position_embeddings)
    fail("generate", "prompt + max tokens = " + std::to_string(ctx) + " exceeds max_position_embeddings " +
                         std::to_string(c.max_position_embeddings));
  using clock = std::chrono::steady_clock;
  GenerateStats st;
  st.prompt_tokens = n;
  if (max_tokens == 0 && !on_prompt_logits) return st;
  DecodeState state(c, model.backend(), 1, ctx);
  std::vector<float> logits(static_cast<size_t>(V));
  ForwardOutputs last;
  last.logits = logits.data();
  last.last_only = true;
  auto t0 = clock::now();
  prefill(model, prompt, state, logits.data(), on_prompt_logits);
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  TokenSampler sampler(sampling, V, seed);
  auto t1 = clock::now();
  for (int64_t i = 0; i < max_tokens; ++i) {
    int32_t next = sampler.next(logits.data());
    for (int64_t e : c.eos_token_ids) st.stopped_at_eos |= next == e;
    if (st.stopped_at_eos) break;
    ++st.generated;
    if (!on_token(next, logits.data()) || i + 1 == max_tokens) break;
    model.forward(&next, 1, 1, &state, last);
    ++st.decode_steps;
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return st;
}

}  // namespace zaya
