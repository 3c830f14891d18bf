// Prefill + decode loop (see generate.h).
#include "serve/generate.h"

#include <chrono>

#include "core/error.h"

namespace zaya {

GenerateStats generate(Model& model, const std::vector<int32_t>& prompt, int64_t max_tokens,
                       const SamplingParams& sampling, uint64_t seed,
                       const std::function<bool(int32_t)>& on_token) {
  const ModelConfig& c = model.config();
  if (prompt.empty()) fail("generate", "the prompt has no tokens");
  const int64_t ctx = int64_t(prompt.size()) + max_tokens;
  if (ctx > c.max_position_embeddings)
    fail("generate", "prompt + max tokens = " + std::to_string(ctx) + " exceeds max_position_embeddings " +
                         std::to_string(c.max_position_embeddings));
  using clock = std::chrono::steady_clock;
  GenerateStats st;
  st.prompt_tokens = int64_t(prompt.size());
  DecodeState state(c, model.backend(), 1, ctx);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  ForwardOutputs out;
  out.logits = logits.data();
  out.last_only = true;
  auto t0 = clock::now();
  model.forward(prompt.data(), 1, int64_t(prompt.size()), &state, out);
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  Rng rng(seed);
  auto t1 = clock::now();
  for (int64_t i = 0; i < max_tokens; ++i) {
    int32_t next = sample_token(logits.data(), c.vocab_size, sampling, rng);
    for (int64_t e : c.eos_token_ids) st.stopped_at_eos |= next == e;
    if (st.stopped_at_eos) break;
    ++st.generated;
    if (!on_token(next) || i + 1 == max_tokens) break;
    model.forward(&next, 1, 1, &state, out);
    ++st.decode_steps;
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return st;
}

}  // namespace zaya
