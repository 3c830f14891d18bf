// One completion, echo and logprobs included (see completion_run.h).
#include "serve/completion_run.h"

#include <utility>

#include "serve/completion_text.h"
#include "serve/generate.h"

namespace zaya {

namespace {

// The alternatives of one position, named by their text after `context`.
std::vector<std::pair<std::string, float>> named_alternatives(const Tokenizer* tokenizer,
                                                              std::span<const int32_t> context,
                                                              const TokenLogprob& lp) {
  std::vector<std::pair<std::string, float>> named;
  named.reserve(lp.top.size());
  for (const auto& [id, logprob] : lp.top)
    named.emplace_back(alternative_token_text(tokenizer, context, id), logprob);
  return named;
}

// A token's name in "tokens": its text, or "token_id:<id>" without a tokenizer (no text then).
std::string token_name(const Tokenizer* tokenizer, const std::string& text, int32_t id) {
  return tokenizer ? text : "token_id:" + std::to_string(id);
}

}  // namespace

CompletionResult run_completion(Model& model, const Tokenizer* tok, const CompletionJob& in,
                                const std::function<bool(CompletionChunk)>& emit) {
  const int64_t V = model.config().vocab_size;
  const bool with_logprobs = in.logprobs >= 0;
  CompletionResult r;
  r.prompt_tokens = int64_t(in.prompt.size());
  std::vector<int32_t> seen = in.prompt;  // prompt + generated: the context that names alternatives
  std::vector<LogprobEntry> entries;      // the echo's, then the generated tokens'

  // The echo: the prompt's text piece by piece; its logprobs arrive with the prefill.
  std::string echo_text;
  if (in.echo) {
    const std::vector<std::string> pieces = prompt_pieces(tok, in.prompt);
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (with_logprobs)
        entries.push_back({token_name(tok, pieces[i], in.prompt[i]), int64_t(echo_text.size()), std::nullopt,
                           std::nullopt});
      echo_text += pieces[i];
    }
  }
  PromptLogitsFn on_prompt_logits;
  if (in.echo && with_logprobs)
    on_prompt_logits = [&](int64_t p, const float* logits) {
      if (p + 1 >= r.prompt_tokens) return;  // the last position predicts the first generated token
      const TokenLogprob lp = token_logprob(logits, V, in.prompt[size_t(p + 1)], in.logprobs);
      LogprobEntry& e = entries[size_t(p + 1)];
      e.logprob = lp.logprob;
      e.top = named_alternatives(tok, std::span<const int32_t>(in.prompt.data(), size_t(p + 1)), lp);
    };
  bool echo_sent = !in.echo;
  auto send_echo = [&] {
    if (echo_sent) return true;
    echo_sent = true;
    CompletionChunk c{echo_text, {}, std::nullopt};
    if (with_logprobs) c.logprobs = entries;
    return emit(std::move(c));
  };

  CompletionText text(tok, id_tail(in.prompt, CompletionText::kContextTail), in.stop);
  int64_t offset = int64_t(echo_text.size());
  std::string reason = "length";
  GenerateStats st = generate(
      model, in.prompt, in.max_tokens, in.sampling, in.seed,
      [&](int32_t id, const float* logits) {
        if (!send_echo()) {
          reason = "cancelled";
          return false;
        }
        r.ids.push_back(id);
        CompletionText::Step step = text.push(id);
        CompletionChunk c{step.text, {id}, std::nullopt};
        if (with_logprobs) {
          const TokenLogprob lp = token_logprob(logits, V, id, in.logprobs);
          entries.push_back(
              {token_name(tok, step.text, id), offset, lp.logprob, named_alternatives(tok, seen, lp)});
          c.logprobs = std::vector<LogprobEntry>{entries.back()};
        }
        offset += int64_t(step.text.size());
        seen.push_back(id);
        const bool keep = emit(std::move(c));
        if (step.stop) {
          reason = "stop";
          return false;
        }
        if (!keep) {
          reason = "cancelled";
          return false;
        }
        return true;
      },
      on_prompt_logits);
  if (st.stopped_at_eos) reason = "stop";
  send_echo();  // when nothing was generated
  if (std::string rest = text.finish(); !rest.empty()) {
    if (with_logprobs && tok && !r.ids.empty()) entries.back().token += rest;
    CompletionChunk c{std::move(rest), {}, std::nullopt};
    if (with_logprobs) c.logprobs = std::vector<LogprobEntry>{};
    emit(std::move(c));
  }
  r.text = echo_text + text.text();
  r.finish_reason = reason;
  if (with_logprobs) r.logprobs = std::move(entries);
  r.prefill_seconds = st.prefill_seconds;
  r.decode_seconds = st.decode_seconds;
  return r;
}

}  // namespace zaya
