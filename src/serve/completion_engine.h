// The model behind the inference server and the one thread that runs it. The model and its
// decode state are single, so completions are serialised: requests wait in a FIFO queue
// (guarded by a mutex) and generate one at a time on the engine thread, which also keeps the
// model's OpenMP team and GPU work on one thread. A request's text comes back on the caller's
// own thread as it is released, so an HTTP handler can stream it; the caller cancels by
// returning false from its chunk callback (its client went away), which frees the model at the
// next token. Knows nothing about HTTP.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/tokenizer.h"
#include "model/model.h"
#include "serve/logprobs.h"
#include "serve/sampling.h"

namespace zaya {

struct CompletionJob {
  std::vector<int32_t> prompt;  // validated: non-empty, in the vocabulary, fits with max_tokens
  int64_t max_tokens = 16;      // 0: no generation (an echo, or prompt scoring)
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool echo = false;  // the text starts with the prompt's (and logprobs with its tokens')
  int logprobs = -1;  // -1: none; else the alternatives per token (0 .. kMaxLogprobs)
};

struct CompletionChunk {
  std::string text;          // text released by this step (may be empty)
  std::vector<int32_t> ids;  // tokens generated in this step (empty for the echo and the final flush)
  std::optional<std::vector<LogprobEntry>> logprobs;  // with job.logprobs >= 0: this step's tokens
};

struct CompletionResult {
  std::string text;           // the chunks' texts, concatenated (the echo first)
  std::vector<int32_t> ids;   // the generated ids
  std::string finish_reason;  // "stop" (EOS or a stop sequence), "length", or "cancelled"
  int64_t prompt_tokens = 0;
  // With job.logprobs >= 0: one entry per echoed prompt token, then per generated token; the
  // tokens concatenate to text (a held-back tail released at the end joins the last one).
  std::optional<std::vector<LogprobEntry>> logprobs;
  double queue_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
};

struct EngineOptions {
  size_t max_queue = 16;  // requests that may wait behind the running one; more get a 503
  int threads = 0;        // OpenMP threads for the model's ops (0 = OpenMP's default)
};

class CompletionEngine {
 public:
  // The model (weights frozen by the caller) and tokenizer (may be null) must outlive the engine.
  CompletionEngine(Model& model, const Tokenizer* tokenizer, EngineOptions options = {});
  ~CompletionEngine();
  CompletionEngine(const CompletionEngine&) = delete;
  CompletionEngine& operator=(const CompletionEngine&) = delete;

  using ChunkFn = std::function<bool(const CompletionChunk&)>;
  // Queues the job and blocks until it has run. on_chunk, when set, is called on this thread
  // for every chunk in order; returning false cancels the job (finish_reason "cancelled").
  // Throws ApiError: 503 when the queue is full or the engine is shutting down, 500 (with the
  // message) when generation failed; the engine carries on with the next job either way.
  CompletionResult run(CompletionJob job, const ChunkFn& on_chunk = {});

  // Whether run() would queue a job now (a hint for answering 503 before streaming starts).
  bool accepting() const;
  // Stops taking jobs, fails the queued ones with 503, cancels the running one at its next
  // token and joins the engine thread. Idempotent, safe from any thread but the engine's.
  void shutdown();

 private:
  struct Job;
  void loop();
  void execute(Job& job);

  Model& model_;
  const Tokenizer* tok_;
  EngineOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::atomic<bool> stopping_{false};
  std::mutex join_mu_;
  std::thread thread_;
};

}  // namespace zaya
