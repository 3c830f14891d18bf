// The completion engine's own records (completion_engine.h): a queued job with its results on
// the way to the waiting caller, a completion in the decoding batch, and a prompt being
// prefilled. Shared by the engine's two source files only.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "serve/completion_engine.h"
#include "serve/completion_run.h"
#include "serve/generate.h"

namespace zaya {

using EngineClock = std::chrono::steady_clock;

inline double seconds_between(EngineClock::time_point a, EngineClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct CompletionEngine::Job {
  CompletionJob in;
  EngineClock::time_point queued_at = EngineClock::now();
  std::atomic<bool> cancelled{false};
  std::mutex m;  // guards what follows
  std::condition_variable cv;
  std::deque<CompletionChunk> chunks;
  bool done = false;
  // A failure, as plain values: the caller throws a fresh ApiError on its own thread (an
  // exception object shared across threads is freed by whichever thread lets go last).
  int error_status = 0;  // 0: none
  std::string error_type, error_message;
  CompletionResult result;
};

// A completion in the decoding batch; running_[i] lives in sequence i of batch_.
struct CompletionEngine::Running {
  std::shared_ptr<Job> job;
  std::unique_ptr<CompletionRun> run;
  int32_t next = -1;  // the token to feed at the next step; -1: ended
  int64_t steps = 0;  // decode steps it has been in
  double queue_seconds = 0, prefill_seconds = 0;
  EngineClock::time_point started, decode_start;  // taken from the queue; first token sampled
};

// A prompt being prefilled in sequence `seq` of batch_, and the completions that start from it.
struct CompletionEngine::Member {
  Running r;
  int64_t seq = -1;
  // Positions of the prompt a kept state held (copied into seq before the prefill), and the
  // entry they came from while the group is placed.
  int64_t start = 0;
  const KeptStates::Entry* kept = nullptr;
  bool continues_finished = false;  // that entry was a finished completion's
  bool ran = false;                 // the model ran some of the prompt's positions
  std::vector<float> logits;        // [vocab]: after the prompt's last position, once it has run
  // With echo logprobs: the prompt's own prefill, reporting every position's logits (such a
  // prompt is prefilled alone and runs whole).
  std::unique_ptr<PromptPrefill> echo;
  std::vector<Running> followers;  // completions of the same prompt, which start from its state

  int64_t prompt_size() const { return int64_t(r.job->in.prompt.size()); }
  int64_t left_to_run(const DecodeState& batch) const { return prompt_size() - batch.pos[size_t(seq)]; }
};

}  // namespace zaya
