// Prefill + decode loop (see generate.h).
#include "serve/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace zaya {

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
  if (on_prompt_logits) {
    std::vector<float> rows(static_cast<size_t>(std::min(n, kPromptLogitsChunk) * V));
    ForwardOutputs all;
    all.logits = rows.data();
    for (int64_t p0 = 0; p0 < n; p0 += kPromptLogitsChunk) {
      const int64_t T = std::min(kPromptLogitsChunk, n - p0);
      model.forward(prompt.data() + p0, 1, T, &state, all);
      for (int64_t t = 0; t < T; ++t) on_prompt_logits(p0 + t, rows.data() + t * V);
    }
    std::copy_n(rows.data() + ((n - 1) % kPromptLogitsChunk) * V, V, logits.data());
  } else {
    model.forward(prompt.data(), 1, n, &state, last);
  }
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  Rng rng(seed);
  const bool adjust = sampling.adjusts_logits();
  std::vector<float> adjusted(adjust ? size_t(V) : 0);
  std::vector<int32_t> counts(adjust ? size_t(V) : 0);
  auto t1 = clock::now();
  for (int64_t i = 0; i < max_tokens; ++i) {
    const float* dist = logits.data();
    if (adjust) {
      adjusted = logits;
      adjust_logits(adjusted.data(), V, sampling, counts);
      dist = adjusted.data();
    }
    int32_t next = sample_token(dist, V, sampling, rng);
    for (int64_t e : c.eos_token_ids) st.stopped_at_eos |= next == e;
    if (st.stopped_at_eos) break;
    ++st.generated;
    if (adjust) ++counts[size_t(next)];
    if (!on_token(next, logits.data()) || i + 1 == max_tokens) break;
    model.forward(&next, 1, 1, &state, last);
    ++st.decode_steps;
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return st;
}

}  // namespace zaya
