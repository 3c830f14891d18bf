// The model behind the inference server and the one thread that runs it, with continuous
// batching: up to max_batch completions decode together, one token each per forward pass of
// the model. Completions join the batch between two steps. New prompts are prefilled in the
// batch's free sequences, several together in one forward pass of the model (a group), in
// chunks that alternate with the running completions' decode steps; a completion whose prompt
// is in the group already (another of a request's n choices) shares that prefill. Each
// completion starts from the kept state that holds the longest prefix of its prompt, if any:
// prompts just prefilled and finished completions (their prompts and the tokens they generated)
// are kept, up to a memory budget, least recently used first out, so that the same prompt again
// runs nothing and a conversation's next turn, which sends the reply back followed by a new
// message, prefills only that message. Completions leave the batch between two steps too.
// Completions waiting for a place sit in a FIFO queue guarded by a mutex. The engine thread
// also keeps the model's OpenMP team and GPU work on one thread. A completion's text comes back
// on the caller's own thread as it is released, so an HTTP handler can stream it; the caller
// cancels by returning false from its chunk callback (its client went away), which frees the
// slot at the next step. Knows nothing about HTTP.
#pragma once
#include <atomic>
#include <chrono>
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
#include "serve/kept_states.h"
#include "serve/logprobs.h"
#include "serve/sampling.h"
#include "serve/seconds_histogram.h"

namespace zaya {

struct CompletionJob {
  std::vector<int32_t> prompt;  // validated: non-empty, in the vocabulary, fits with max_tokens
  int64_t max_tokens = 16;      // 0: no generation (an echo, or prompt scoring)
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  // Tokens that end the completion as the model's EOS does (not included, finish_reason "stop"):
  // a chat template's end of reply.
  std::vector<int32_t> end_ids;
  // The text is the generated ids decoded on their own, not past the prompt's seam: a chat
  // reply, which a chat template tokenises on its own and which must tokenise back to its ids.
  bool text_alone = false;
  bool echo = false;  // the text starts with the prompt's (and logprobs with its tokens')
  int logprobs = -1;  // -1: none; else the alternatives per token (0 .. kMaxLogprobs)
  // Sum the model's log-probability of every sampled token (best_of ranks candidates by it).
  bool score = false;
};

struct CompletionChunk {
  std::string text;          // text released by this step (may be empty)
  std::vector<int32_t> ids;  // tokens generated in this step (empty for the echo and the final flush)
  std::optional<std::vector<LogprobEntry>> logprobs;  // with job.logprobs >= 0: this step's tokens
  // When the engine produced it (its waiter may see it later): chunks of different completions
  // compare in the engine's own order. Unset (the clock's epoch) outside the engine.
  std::chrono::steady_clock::time_point produced_at{};
};

struct CompletionResult {
  std::string text;           // the chunks' texts, concatenated (the echo first)
  std::vector<int32_t> ids;   // the generated ids
  std::string finish_reason;  // "stop" (EOS or a stop sequence), "length", or "cancelled"
  int64_t prompt_tokens = 0;
  // With job.logprobs >= 0: one entry per echoed prompt token, then per generated token; the
  // tokens concatenate to text (a held-back tail released at the end joins the last one).
  std::optional<std::vector<LogprobEntry>> logprobs;
  // With job.score: the sum of log p(token | the tokens before it) under the model (temperature
  // 1, before any sampling adjustment) over the sampled tokens, an EOS that ended the completion
  // included, and how many tokens that is.
  double logprob_sum = 0;
  int64_t scored_tokens = 0;
  double queue_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
};

struct EngineOptions {
  // Completions that may wait for a slot: a request is refused (503) when the queue holds this
  // many. A request of several completions (prompts x n) is queued whole when there is room.
  size_t max_queue = 16;
  int threads = 0;        // OpenMP threads for the model's ops (0 = OpenMP's default)
  int64_t max_batch = 8;  // completions decoded together; each holds a context-long decode state
  // Prompt positions prefilled per turn of the engine, each turn ending with one decode step of
  // the running completions: a long prompt is prefilled in chunks of this many positions, so it
  // slows them down rather than stopping them, and short prompts share a turn and its forward
  // passes (shortest first: a pass runs the positions the shortest has left, of as many
  // prompts as fit in the turn's remaining positions; a prompt longer than those runs alone).
  int64_t prefill_chunk = 256;
  // Positions (prompt + generated) one completion may use, and the length of every decode state
  // the engine holds: 0 = the model's max_position_embeddings; at most that.
  int64_t context = 0;
  // Bytes of decode states kept after prompts are prefilled and completions finish, for the
  // same prompt again and the next turns of conversations (kept_states.h); 0 keeps none.
  int64_t keep_bytes = int64_t(1) << 30;
};

// What the engine has done so far: completions finished (however they ended), forward passes
// of the decoding batch, the tokens they fed, the largest batch decoded at once, the prefill's
// forward passes, the prompt positions given to the model in them and the most prompts one of
// them ran together, the completions that ran no prompt position at all (a kept state held the
// whole prompt, or another completion in the group prefilled it), the prompt positions not run
// because a kept state held them (counted once the rest of the prompt has run), and the
// completions that started from a finished completion's kept state (a conversation's next turn).
struct EngineStats {
  int64_t completions = 0, decode_steps = 0, decoded_tokens = 0, peak_batch = 0, prefill_chunks = 0;
  int64_t prefill_positions = 0, peak_prefill_group = 0, prefills_reused = 0, prefill_positions_reused = 0;
  int64_t finished_continued = 0;
  // Now: completions in the batch or being prefilled (as of the engine's last turn), completions
  // waiting in the queue, and the kept states (prompts and finished completions) and their bytes.
  int64_t running = 0, waiting = 0, kept = 0, kept_bytes = 0;
  // Completions' latencies: from submission to the first token (sampled after the prompt; also
  // when it ends the completion), and, for each finished completion that decoded, its decoding
  // time over the decode steps it took.
  SecondsHistogram first_token_seconds, decode_step_seconds;
};

class CompletionEngine {
 public:
  // The model (weights frozen by the caller) and tokenizer (may be null) must outlive the engine.
  CompletionEngine(Model& model, const Tokenizer* tokenizer, EngineOptions options = {});
  ~CompletionEngine();
  CompletionEngine(const CompletionEngine&) = delete;
  CompletionEngine& operator=(const CompletionEngine&) = delete;

  struct Job;
  // A queued completion. Dropping it before wait() has returned cancels the completion.
  class Ticket {
   public:
    Ticket(Ticket&&) noexcept = default;
    Ticket& operator=(Ticket&&) noexcept = default;
    ~Ticket();

   private:
    friend class CompletionEngine;
    explicit Ticket(std::shared_ptr<Job> job) : job_(std::move(job)) {}
    std::shared_ptr<Job> job_;
  };

  using ChunkFn = std::function<bool(const CompletionChunk&)>;
  // Queues the jobs (one request's completions, all or none) and returns at once; they may
  // run together. Throws ApiError 503 when the queue is full or the engine is shutting down.
  std::vector<Ticket> submit(std::vector<CompletionJob> jobs);
  // Blocks until the ticket's completion has run and returns its result. on_chunk, when set,
  // is called on this thread for every chunk in order (chunks made before the call wait for
  // it); returning false cancels the completion (finish_reason "cancelled"). Throws ApiError
  // 503 when the engine shut down first, 400 when the job does not fit the context, 500 (with
  // the message) when generation failed; the engine carries on with the others either way.
  CompletionResult wait(Ticket& ticket, const ChunkFn& on_chunk = {});
  // submit() and wait() for one job.
  CompletionResult run(CompletionJob job, const ChunkFn& on_chunk = {});

  // Whether run() would queue a job now (a hint for answering 503 before streaming starts).
  bool accepting() const;
  // Stops taking jobs, fails the queued ones with 503, cancels the running ones at their next
  // token and joins the engine thread. Idempotent, safe from any thread but the engine's.
  void shutdown();

  EngineStats stats() const;

  int64_t context() const { return context_; }  // the positions one completion may use
  // Bytes of the decode states the engine holds (max_batch context-long sequences, shared by
  // the decoding completions and the prompts being prefilled; the kept states come on top, up to
  // EngineOptions::keep_bytes).
  int64_t decode_state_bytes() const;

 private:
  struct Running;
  struct Member;
  void loop();
  // The prefill (completion_engine_prefill.cpp).
  std::unique_ptr<Member> begin(const std::shared_ptr<Job>& job);
  bool form_group();
  void place_group(std::vector<Member> members);
  int64_t advance_group(int64_t max_positions);
  void finish_prefilled();
  void drop_cancelled();
  void fail_group(const std::string& message);
  void join_batch(Running r, const float* logits, int64_t from_seq);
  int64_t in_prefill() const;
  // The decoding batch (completion_engine.cpp).
  void decode_step();
  void deliver(Job& job, CompletionResult result);
  void deliver_error(Job& job, int status, const std::string& type, const std::string& message);
  void count_completion();
  void keep_finished(const Running& r, int64_t seq, const float* logits);

  Model& model_;
  const Tokenizer* tok_;
  EngineOptions opt_;
  int64_t context_;
  // Sequence i < running_.size() holds running_[i]; the group being prefilled holds the
  // contiguous sequences of its members, above the running ones.
  std::unique_ptr<DecodeState> batch_;
  std::vector<float> logits_;          // [max_batch, vocab]: a decode step's
  std::vector<float> prefill_logits_;  // [max_batch, vocab]: a prefill pass's, each prompt's last position
  // Prompts just prefilled and finished completions: a prompt that begins with one's tokens
  // starts from its state.
  std::unique_ptr<KeptStates> kept_;
  // Used by the engine thread only: the completions decoding, the group being prefilled (in
  // ascending order of the positions each has left to run, so those a pass runs are the first
  // ones, and those it finishes leave from the front), and a completion taken from the queue
  // that starts the next group (one that reports its prompt's logprobs is prefilled alone).
  std::vector<Running> running_;
  std::vector<Member> group_;
  std::unique_ptr<Member> held_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::atomic<bool> stopping_{false};
  EngineStats stats_;  // guarded by mu_
  std::mutex join_mu_;
  std::thread thread_;
};

}  // namespace zaya
