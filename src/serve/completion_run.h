// One completion on the model, start to end: the echoed prompt, generation with incremental
// text and stop sequences, and the logprobs of every token, handed out chunk by chunk as they
// are made. Single-threaded and synchronous; the engine (completion_engine.h) queues jobs and
// runs them here on its thread. Knows nothing about HTTP or queues.
#pragma once
#include <functional>

#include "data/tokenizer.h"
#include "model/model.h"
#include "serve/completion_engine.h"

namespace zaya {

// emit(chunk) receives each chunk in order: the echo first (with job.echo, even when empty),
// then one per generated token, then the held-back tail when there is one. It returns false to
// cancel: generation stops at once, with finish_reason "cancelled". tokenizer may be null.
CompletionResult run_completion(Model& model, const Tokenizer* tokenizer, const CompletionJob& job,
                                const std::function<bool(CompletionChunk)>& emit);

}  // namespace zaya
