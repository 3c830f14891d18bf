// The completion engine with continuous batching (see completion_engine.h).
#include "serve/completion_engine.h"

#include <algorithm>
#include <chrono>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"
#include "serve/api_error.h"
#include "serve/completion_run.h"
#include "serve/generate.h"

namespace zaya {

using Clock = std::chrono::steady_clock;

namespace {
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

struct CompletionEngine::Job {
  CompletionJob in;
  Clock::time_point queued_at = Clock::now();
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

// A completion in the decoding batch; running[i] lives in sequence i of batch_.
struct CompletionEngine::Running {
  std::shared_ptr<Job> job;
  std::unique_ptr<CompletionRun> run;
  int32_t next = -1;  // the token to feed at the next step; -1: ended
  double queue_seconds = 0, prefill_seconds = 0;
  Clock::time_point decode_start;
};

CompletionEngine::Ticket::~Ticket() {
  if (job_) job_->cancelled = true;  // harmless once done; frees the slot if still running
}

CompletionEngine::CompletionEngine(Model& model, const Tokenizer* tokenizer, EngineOptions options)
    : model_(model), tok_(tokenizer), opt_(options) {
  const ModelConfig& c = model.config();
  if (opt_.max_batch < 1)
    fail("serve",
         "the decoding batch must hold at least 1 completion, got " + std::to_string(opt_.max_batch));
  context_ = opt_.context > 0 ? opt_.context : c.max_position_embeddings;
  if (context_ > c.max_position_embeddings)
    fail("serve", "a context of " + std::to_string(context_) +
                      " positions exceeds the model's max_position_embeddings " +
                      std::to_string(c.max_position_embeddings));
  batch_ = std::make_unique<DecodeState>(c, model.backend(), opt_.max_batch, context_);
  single_ = std::make_unique<DecodeState>(c, model.backend(), 1, context_);
  kept_ = std::make_unique<KeptStates>(c, model.backend(), opt_.keep_bytes);
  if (opt_.prefill_chunk < 1)
    fail("serve", "a prefill chunk must hold at least 1 position, got " + std::to_string(opt_.prefill_chunk));
  logits_.resize(size_t(opt_.max_batch * c.vocab_size));
  prefill_logits_.resize(size_t(c.vocab_size));
  thread_ = std::thread([this] { loop(); });
}

CompletionEngine::~CompletionEngine() { shutdown(); }

int64_t CompletionEngine::decode_state_bytes() const {
  return DecodeState::bytes(model_.config(), opt_.max_batch + 1, context_);
}

EngineStats CompletionEngine::stats() const {
  std::lock_guard lk(mu_);
  EngineStats s = stats_;
  s.waiting = int64_t(queue_.size());
  return s;
}

bool CompletionEngine::accepting() const {
  std::lock_guard lk(mu_);
  return !stopping_ && queue_.size() < opt_.max_queue;
}

std::vector<CompletionEngine::Ticket> CompletionEngine::submit(std::vector<CompletionJob> in) {
  std::vector<Ticket> tickets;
  for (CompletionJob& j : in) {
    auto job = std::make_shared<Job>();
    job->in = std::move(j);
    tickets.push_back(Ticket(std::move(job)));
  }
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw ApiError(503, "unavailable_error", "the server is shutting down");
    if (queue_.size() >= opt_.max_queue)
      throw ApiError(503, "unavailable_error",
                     "the server is busy: " + std::to_string(queue_.size()) +
                         " completions are already waiting; retry later");
    for (const Ticket& t : tickets) queue_.push_back(t.job_);
  }
  cv_.notify_all();
  return tickets;
}

CompletionResult CompletionEngine::run(CompletionJob job, const ChunkFn& on_chunk) {
  std::vector<CompletionJob> one;
  one.push_back(std::move(job));
  std::vector<Ticket> t = submit(std::move(one));
  return wait(t[0], on_chunk);
}

CompletionResult CompletionEngine::wait(Ticket& ticket, const ChunkFn& on_chunk) {
  ZAYA_CHECK(ticket.job_, "wait() on a ticket whose result was already taken");
  const std::shared_ptr<Job> job = std::move(ticket.job_);
  Ticket cancel_on_exit(job);  // an exception from on_chunk cancels the completion
  std::unique_lock lk(job->m);
  for (;;) {
    job->cv.wait(lk, [&] { return job->done || !job->chunks.empty(); });
    while (!job->chunks.empty()) {
      CompletionChunk chunk = std::move(job->chunks.front());
      job->chunks.pop_front();
      if (!on_chunk || job->cancelled) continue;
      lk.unlock();
      const bool keep = on_chunk(chunk);
      lk.lock();
      if (!keep) job->cancelled = true;
    }
    if (job->done) break;
  }
  cancel_on_exit.job_.reset();
  if (job->error_status) throw ApiError(job->error_status, job->error_type, job->error_message);
  return std::move(job->result);
}

// The completion whose prompt is being prefilled into single_, one chunk per turn of the loop.
struct CompletionEngine::Prefilling {
  Running r;
  std::unique_ptr<PromptPrefill> prefill;  // null: the same prompt as the prefill before, reused whole
  int64_t reused_positions = 0;            // prompt positions a state kept before already ran
  bool continues_finished = false;         // that state was a finished completion's
  Clock::time_point started;
};

void CompletionEngine::loop() {
#ifdef _OPENMP
  if (opt_.threads > 0) omp_set_num_threads(opt_.threads);  // per thread: set on the one that runs the model
#endif
  std::vector<Running> running;
  running.reserve(size_t(opt_.max_batch));
  std::unique_ptr<Prefilling> prefilling;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !running.empty() || prefilling; });
      if (stopping_ && running.empty() && !prefilling) return;  // shutdown() fails whatever is still queued
    }
    // Prefill up to prefill_chunk prompt positions: the rest of a prompt begun earlier, then
    // new prompts while the batch has room, then one decode step for everything running.
    int64_t budget = opt_.prefill_chunk;
    while (budget > 0) {
      if (!prefilling) {
        std::shared_ptr<Job> next;
        {
          std::lock_guard lk(mu_);
          if (stopping_ || queue_.empty() || int64_t(running.size()) >= opt_.max_batch) break;
          next = std::move(queue_.front());
          queue_.pop_front();
        }
        prefilling = begin(next);
        if (!prefilling) continue;  // it ended at once
      }
      budget -= advance_prefill(prefilling, running, budget);
      if (prefilling) break;  // the budget ran out within this prompt
    }
    if (!running.empty()) decode_step(running);
    std::lock_guard lk(mu_);
    stats_.running = int64_t(running.size()) + (prefilling ? 1 : 0);
  }
}

namespace {
// The length of kept when it is a prefix of prompt (the positions a state holding kept has
// already run), else 0.
int64_t kept_prefix(const std::optional<std::vector<int32_t>>& kept, const std::vector<int32_t>& prompt) {
  return kept && begins_with(prompt, *kept) ? int64_t(kept->size()) : 0;
}

CompletionResult cancelled_result(const CompletionJob& in, double queue_seconds) {
  CompletionResult r;
  r.prompt_tokens = int64_t(in.prompt.size());
  r.finish_reason = "cancelled";
  r.queue_seconds = queue_seconds;
  return r;
}
}  // namespace

// Checks the job and sets up its completion; returns its prefill (with no PromptPrefill when the
// prompt's prefill is reused), or null when the job ended at once (cancelled, refused, or
// nothing to run on the model).
std::unique_ptr<CompletionEngine::Prefilling> CompletionEngine::begin(const std::shared_ptr<Job>& job) {
  auto p = std::make_unique<Prefilling>();
  Running& r = p->r;
  r.job = job;
  r.queue_seconds = seconds_between(job->queued_at, Clock::now());
  try {
    const CompletionJob& in = job->in;
    const int64_t context = context_, need = int64_t(in.prompt.size()) + in.max_tokens;
    if (in.prompt.empty() || need > context)
      throw ApiError(400, "invalid_request_error",
                     "the prompt's " + std::to_string(in.prompt.size()) + " tokens + max_tokens " +
                         std::to_string(in.max_tokens) + " must fit the model's context of " +
                         std::to_string(context));
    if (job->cancelled || stopping_) {
      deliver(*job, cancelled_result(in, r.queue_seconds));
      return nullptr;
    }
    r.run = std::make_unique<CompletionRun>(model_.config(), tok_, in, [job, this](CompletionChunk chunk) {
      chunk.produced_at = Clock::now();
      {
        std::lock_guard lk(job->m);
        job->chunks.push_back(std::move(chunk));
      }
      job->cv.notify_all();
      return !job->cancelled && !stopping_;
    });
    if (!r.run->needs_model()) {
      CompletionResult result = r.run->finish();
      result.queue_seconds = r.queue_seconds;
      deliver(*job, std::move(result));
      return nullptr;
    }
    p->started = Clock::now();
    // The prompt just prefilled, or the tokens of a finished completion, or a prompt that
    // extends either (the next turn of a conversation), with nothing to report for its
    // positions: start from the state that holds the most of the prompt, which is what running
    // the prompt again would give (up to rounding: where its chunks fall, and positions that a
    // finished completion fed one at a time), and prefill only what follows. A completion that
    // reports the prompt's logprobs (echo) runs the whole prompt.
    int64_t start = 0;
    if (!r.run->prompt_logits()) {
      const int64_t from_prefill = kept_prefix(prefilled_prompt_, in.prompt);
      const KeptStates::Entry* kept = kept_->longest_prefix(in.prompt);
      const int64_t from_finished = kept ? int64_t(kept->tokens.size()) : 0;
      if (from_finished > from_prefill) {
        prefilled_prompt_.reset();  // single_ changes from here on (forgotten first: a copy may throw)
        try {
          single_->copy_sequence(*kept->state, 0, 0);
          kept_->touch(kept);
          start = from_finished;
          p->continues_finished = true;
        } catch (const std::exception&) {
          start = 0;  // the copy failed (a GPU error): run the whole prompt instead
        }
        if (start == int64_t(in.prompt.size())) {  // exactly its tokens: no prefill at all
          prefill_logits_ = kept->logits;
          prefilled_prompt_ = in.prompt;
          return p;
        }
      } else if (from_prefill > 0) {
        start = from_prefill;
        ZAYA_CHECK(single_->pos[0] == start, "the remembered prefill does not match its decode state");
        if (start == int64_t(in.prompt.size())) return p;  // the same prompt: no prefill at all
      }
    }
    prefilled_prompt_.reset();  // single_ changes from here on (forgotten first: a reset may throw)
    if (start == 0) single_->reset();
    p->reused_positions = start;
    p->prefill = std::make_unique<PromptPrefill>(model_, in.prompt, *single_, prefill_logits_.data(),
                                                 r.run->prompt_logits(), start);
    return p;
  } catch (const ApiError& e) {
    deliver_error(*job, e.status(), e.type(), e.what());
  } catch (const std::exception& e) {
    deliver_error(*job, 500, "server_error", std::string("internal error: ") + e.what());
  }
  return nullptr;
}

// Runs the next positions of the prompt (at most max_positions) and returns how many ran (none
// when the prompt's prefill is reused). Once the whole prompt has run: samples the first token
// and, unless the completion has ended already, gives it the next free sequence of the batch.
int64_t CompletionEngine::advance_prefill(std::unique_ptr<Prefilling>& p, std::vector<Running>& running,
                                          int64_t max_positions) {
  Running& r = p->r;
  int64_t ran = 0;
  try {
    if (r.job->cancelled || stopping_) {
      deliver(*r.job, cancelled_result(r.job->in, r.queue_seconds));
      p.reset();
      return 0;
    }
    if (p->prefill) {
      ran = std::min(max_positions, p->prefill->remaining());
      {
        std::lock_guard lk(mu_);
        stats_.prefill_positions += ran;  // given to the model, whether or not the chunk succeeds
      }
      p->prefill->run(ran);
      {
        std::lock_guard lk(mu_);
        ++stats_.prefill_chunks;
      }
      if (!p->prefill->done()) return ran;
      prefilled_prompt_ = r.job->in.prompt;
      std::lock_guard lk(mu_);
      stats_.prefill_positions_reused += p->reused_positions;
      if (p->continues_finished) ++stats_.finished_continued;
    } else {  // begin() found this prompt already run
      std::lock_guard lk(mu_);
      ++stats_.prefills_reused;
      if (p->continues_finished) ++stats_.finished_continued;
    }
    r.decode_start = Clock::now();
    r.prefill_seconds = seconds_between(p->started, r.decode_start);
    r.next = r.run->step(prefill_logits_.data());
    if (r.next < 0) {
      CompletionResult result = r.run->finish();
      result.queue_seconds = r.queue_seconds;
      result.prefill_seconds = r.prefill_seconds;
      deliver(*r.job, std::move(result));
    } else {
      batch_->copy_sequence(*single_, 0, int64_t(running.size()));
      running.push_back(std::move(r));
    }
  } catch (const ApiError& e) {
    deliver_error(*r.job, e.status(), e.type(), e.what());
  } catch (const std::exception& e) {
    deliver_error(*r.job, 500, "server_error", std::string("internal error: ") + e.what());
  }
  p.reset();
  return ran;
}

// One token for every running completion in one forward pass; the ended ones leave, and the
// last sequence of the batch moves into each freed slot so the batch stays contiguous.
void CompletionEngine::decode_step(std::vector<Running>& running) {
  const int64_t B = int64_t(running.size()), V = model_.config().vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) ids[size_t(i)] = running[size_t(i)].next;
  try {
    ForwardOutputs last;
    last.logits = logits_.data();
    last.last_only = true;
    model_.forward(ids.data(), B, 1, batch_.get(), last);
    std::lock_guard lk(mu_);
    ++stats_.decode_steps;
    stats_.decoded_tokens += B;
    stats_.peak_batch = std::max(stats_.peak_batch, B);
  } catch (const std::exception& e) {
    for (Running& r : running)
      deliver_error(*r.job, 500, "server_error", std::string("internal error: ") + e.what());
    running.clear();
    return;
  }
  std::vector<bool> failed(size_t(B), false);
  std::vector<int64_t> logits_row(static_cast<size_t>(B));  // running[i]'s logits, while sequences move
  for (int64_t i = 0; i < B; ++i) {
    logits_row[size_t(i)] = i;
    Running& r = running[size_t(i)];
    try {
      r.next = r.run->step(logits_.data() + i * V);
    } catch (const std::exception& e) {
      deliver_error(*r.job, 500, "server_error", std::string("internal error: ") + e.what());
      r.next = -1;
      failed[size_t(i)] = true;
    }
  }
  for (size_t i = 0; i < running.size();) {
    Running& r = running[i];
    if (r.next >= 0) {
      ++i;
      continue;
    }
    if (!failed[i]) {
      CompletionResult result = r.run->finish();
      result.queue_seconds = r.queue_seconds;
      result.prefill_seconds = r.prefill_seconds;
      result.decode_seconds = seconds_between(r.decode_start, Clock::now());
      if (result.finish_reason != "cancelled")
        keep_finished(r, int64_t(i), logits_.data() + logits_row[i] * V);
      deliver(*r.job, std::move(result));
    }
    const size_t last = running.size() - 1;
    if (i != last) {
      batch_->copy_sequence(*batch_, int64_t(last), int64_t(i));
      running[i] = std::move(running[last]);
      failed[i] = failed[last];
      logits_row[i] = logits_row[last];
    }
    running.pop_back();
  }
}

// Keeps the state of the completion that just finished in sequence seq of the batch, with the
// tokens it holds and the logits after them. A failure only means it is not kept: the
// completion itself has finished well.
void CompletionEngine::keep_finished(const Running& r, int64_t seq, const float* logits) {
  try {
    const int64_t n = batch_->pos[size_t(seq)];
    const std::vector<int32_t>& tokens = r.run->tokens();
    ZAYA_CHECK(n >= 1 && n <= int64_t(tokens.size()), "a finished completion's state holds " +
                                                          std::to_string(n) + " positions for " +
                                                          std::to_string(tokens.size()) + " tokens");
    kept_->keep(std::vector<int32_t>(tokens.begin(), tokens.begin() + n), *batch_, seq, logits);
  } catch (const std::exception&) {
  }
  std::lock_guard lk(mu_);  // exact when the completion is delivered, which follows
  stats_.kept = int64_t(kept_->size());
  stats_.kept_bytes = kept_->bytes();
}

void CompletionEngine::deliver(Job& job, CompletionResult result) {
  count_completion();
  {
    std::lock_guard lk(job.m);
    job.result = std::move(result);
    job.done = true;
  }
  job.cv.notify_all();
}

void CompletionEngine::deliver_error(Job& job, int status, const std::string& type,
                                     const std::string& message) {
  count_completion();
  {
    std::lock_guard lk(job.m);
    job.error_status = status;
    job.error_type = type;
    job.error_message = message;
    job.done = true;
  }
  job.cv.notify_all();
}

void CompletionEngine::count_completion() {
  std::lock_guard lk(mu_);
  ++stats_.completions;
}

void CompletionEngine::shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (auto& job : dropped) deliver_error(*job, 503, "unavailable_error", "the server is shutting down");
  std::lock_guard lk(join_mu_);
  if (thread_.joinable()) thread_.join();
}

}  // namespace zaya
