// One completion, echo and logprobs included (see completion_run.h).
#include "serve/completion_run.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

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

CompletionRun::CompletionRun(const ModelConfig& config, const Tokenizer* tok, const CompletionJob& job,
                             EmitFn emit)
    : cfg_(config),
      tok_(tok),
      job_(job),
      emit_(std::move(emit)),
      sampler_(job.sampling, config.vocab_size, job.seed),
      text_(tok, job.text_alone ? std::vector<int32_t>{} : id_tail(job.prompt, CompletionText::kContextTail),
            job.stop),
      seen_(job.prompt),
      echo_sent_(!job.echo),
      prompt_logits_wanted_(job.echo && job.logprobs >= 0) {
  r_.prompt_tokens = int64_t(job.prompt.size());
  // The echo: the prompt's text piece by piece; its logprobs arrive with the prefill.
  if (job.echo) {
    const std::vector<std::string> pieces = prompt_pieces(tok, job.prompt);
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (job.logprobs >= 0)
        entries_.push_back({token_name(tok, pieces[i], job.prompt[i]), int64_t(echo_text_.size()),
                            std::nullopt, std::nullopt});
      echo_text_ += pieces[i];
    }
  }
  offset_ = int64_t(echo_text_.size());
}

PromptLogitsFn CompletionRun::prompt_logits() {
  if (!prompt_logits_wanted_) return {};
  return [this](int64_t p, const float* logits) {
    if (p + 1 >= r_.prompt_tokens) return;  // the last position predicts the first generated token
    const TokenLogprob lp = token_logprob(logits, cfg_.vocab_size, job_.prompt[size_t(p + 1)], job_.logprobs);
    LogprobEntry& e = entries_[size_t(p + 1)];
    e.logprob = lp.logprob;
    e.top = named_alternatives(tok_, std::span<const int32_t>(job_.prompt.data(), size_t(p + 1)), lp);
  };
}

bool CompletionRun::send_echo() {
  if (echo_sent_) return true;
  echo_sent_ = true;
  CompletionChunk c{echo_text_, {}, std::nullopt};
  if (job_.logprobs >= 0) c.logprobs = entries_;
  return emit_(std::move(c));
}

int32_t CompletionRun::step(const float* logits) {
  if (ended_ || int64_t(r_.ids.size()) >= job_.max_tokens) {
    ended_ = true;
    return -1;
  }
  const int32_t id = sampler_.next(logits);
  // The chosen token's log-probability, when the job reports or scores it.
  std::optional<TokenLogprob> lp;
  if (job_.logprobs >= 0 || job_.score)
    lp = token_logprob(logits, cfg_.vocab_size, id, std::max(job_.logprobs, 0));
  if (job_.score) {
    r_.logprob_sum += lp->logprob;
    ++r_.scored_tokens;
  }
  const bool end_of_reply = std::find(job_.end_ids.begin(), job_.end_ids.end(), id) != job_.end_ids.end();
  const bool eos = std::find(cfg_.eos_token_ids.begin(), cfg_.eos_token_ids.end(), int64_t(id)) !=
                   cfg_.eos_token_ids.end();
  if (eos || end_of_reply) {
    reason_ = "stop";
    ended_ = true;
    return -1;
  }
  if (!send_echo()) {
    reason_ = "cancelled";
    ended_ = true;
    return -1;
  }
  r_.ids.push_back(id);
  CompletionText::Step step = text_.push(id);
  CompletionChunk c{step.text, {id}, std::nullopt};
  if (job_.logprobs >= 0) {
    entries_.push_back({token_name(tok_, step.text, id), offset_, lp->logprob,
                        named_alternatives(tok_, text_context(), *lp)});
    c.logprobs = std::vector<LogprobEntry>{entries_.back()};
  }
  offset_ += int64_t(step.text.size());
  seen_.push_back(id);
  const bool keep = emit_(std::move(c));
  if (step.stop)
    reason_ = "stop";
  else if (!keep)
    reason_ = "cancelled";
  ended_ = step.stop || !keep || int64_t(r_.ids.size()) == job_.max_tokens;
  return ended_ ? -1 : id;
}

CompletionResult CompletionRun::finish() {
  send_echo();  // when nothing was generated
  if (std::string rest = text_.finish(); !rest.empty()) {
    if (job_.logprobs >= 0 && tok_ && !r_.ids.empty()) entries_.back().token += rest;
    CompletionChunk c{std::move(rest), {}, std::nullopt};
    if (job_.logprobs >= 0) c.logprobs = std::vector<LogprobEntry>{};
    emit_(std::move(c));
  }
  r_.text = echo_text_ + text_.text();
  r_.finish_reason = reason_;
  if (job_.logprobs >= 0) r_.logprobs = std::move(entries_);
  return std::move(r_);
}

CompletionResult run_completion(Model& model, const Tokenizer* tok, const CompletionJob& job,
                                const EmitFn& emit) {
  using Clock = std::chrono::steady_clock;
  const ModelConfig& c = model.config();
  CompletionRun run(c, tok, job, emit);
  double prefill_seconds = 0, decode_seconds = 0;
  if (run.needs_model()) {
    const int64_t n = int64_t(job.prompt.size());
    DecodeState state(c, model.backend(), 1, n + job.max_tokens);
    std::vector<float> logits(size_t(c.vocab_size));
    const auto t0 = Clock::now();
    prefill(model, job.prompt, state, logits.data(), run.prompt_logits());
    const auto t1 = Clock::now();
    ForwardOutputs last;
    last.logits = logits.data();
    last.last_only = true;
    for (int32_t next = run.step(logits.data()); next >= 0; next = run.step(logits.data()))
      model.forward(&next, 1, 1, &state, last);
    prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  }
  CompletionResult r = run.finish();
  r.prefill_seconds = prefill_seconds;
  r.decode_seconds = decode_seconds;
  return r;
}

}  // namespace zaya
