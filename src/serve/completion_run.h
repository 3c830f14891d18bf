// One completion on the model, start to end: the echoed prompt, generation with incremental
// text and stop sequences, and the logprobs of every token, handed out chunk by chunk as they
// are made. CompletionRun is the completion's side of it, driven by whoever runs the model:
// run_completion() drives one alone; the engine (completion_engine.h) drives many together in
// one decoding batch. Single-threaded; knows nothing about HTTP or queues.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/model.h"
#include "serve/completion_engine.h"
#include "serve/completion_text.h"
#include "serve/generate.h"
#include "serve/sampling.h"

namespace zaya {

// emit(chunk) receives each chunk in order: the echo first (with job.echo, even when empty),
// then one per generated token, then the held-back tail when there is one. It returns false to
// cancel: generation stops at once, with finish_reason "cancelled".
using EmitFn = std::function<bool(CompletionChunk)>;

class CompletionRun {
 public:
  // The job and the tokenizer (may be null) must outlive the run.
  CompletionRun(const ModelConfig& config, const Tokenizer* tokenizer, const CompletionJob& job, EmitFn emit);

  // What the prefill must report: every prompt position's logits (echo with logprobs), or
  // nothing (an empty function).
  PromptLogitsFn prompt_logits();
  // Whether the job has anything to run on the model at all (not a bare echo of max_tokens 0).
  bool needs_model() const { return job_.max_tokens > 0 || bool(prompt_logits_wanted_); }

  // Takes the logits after the last token fed to the model (first the prompt's last position):
  // samples the next token, emits its chunk, and returns the token to feed next, or -1 when the
  // completion has ended (EOS, a stop sequence, max_tokens, or cancellation).
  int32_t step(const float* logits);

  // The prompt and every token sampled so far (the last one sampled has not been fed to the
  // model yet, and never is once the completion has ended).
  const std::vector<int32_t>& tokens() const { return seen_; }

  // Sends what is still unsent (the echo, the held-back tail) and returns the result. Once,
  // after step() returned -1, or at once when nothing was to be generated.
  CompletionResult finish();

 private:
  const ModelConfig& cfg_;
  const Tokenizer* tok_;
  const CompletionJob& job_;
  EmitFn emit_;
  TokenSampler sampler_;
  CompletionText text_;
  CompletionResult r_;
  std::vector<int32_t> seen_;          // prompt + generated: the context that names alternatives
  std::vector<LogprobEntry> entries_;  // the echo's, then the generated tokens'
  std::string echo_text_;
  bool echo_sent_, ended_ = false, prompt_logits_wanted_ = false;
  int64_t offset_ = 0;
  std::string reason_ = "length";

  bool send_echo();
  // The ids a generated token's text follows: the prompt and the tokens before it, or with
  // job.text_alone only the tokens before it (the alternatives are named as the token is).
  std::span<const int32_t> text_context() const {
    std::span<const int32_t> all(seen_);
    return job_.text_alone ? all.subspan(job_.prompt.size()) : all;
  }
};

// Runs one completion alone on the model (a batch of one) and returns its result.
CompletionResult run_completion(Model& model, const Tokenizer* tokenizer, const CompletionJob& job,
                                const EmitFn& emit);

}  // namespace zaya
