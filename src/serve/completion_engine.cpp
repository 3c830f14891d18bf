// The completion engine with continuous batching (see completion_engine.h): its queue, its
// loop, and the decoding batch (the prefill is in completion_engine_prefill.cpp).
#include "serve/completion_engine.h"

#include <algorithm>
#include <chrono>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"
#include "serve/api_error.h"
#include "serve/completion_engine_parts.h"

namespace zaya {

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
  kept_ = std::make_unique<KeptStates>(c, model.backend(), opt_.keep_bytes);
  if (opt_.prefill_chunk < 1)
    fail("serve", "a prefill chunk must hold at least 1 position, got " + std::to_string(opt_.prefill_chunk));
  logits_.resize(size_t(opt_.max_batch * c.vocab_size));
  prefill_logits_.resize(size_t(opt_.max_batch * c.vocab_size));
  thread_ = std::thread([this] { loop(); });
}

CompletionEngine::~CompletionEngine() { shutdown(); }

int64_t CompletionEngine::decode_state_bytes() const {
  return DecodeState::bytes(model_.config(), opt_.max_batch, context_);
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

void CompletionEngine::loop() {
#ifdef _OPENMP
  if (opt_.threads > 0) omp_set_num_threads(opt_.threads);  // per thread: set on the one that runs the model
#endif
  running_.reserve(size_t(opt_.max_batch));
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk,
               [&] { return stopping_ || !queue_.empty() || !running_.empty() || !group_.empty() || held_; });
      // shutdown() fails whatever is still queued
      if (stopping_ && running_.empty() && group_.empty() && !held_) return;
    }
    // Prefill up to prefill_chunk prompt positions: the group begun earlier, then new groups
    // while the batch has room, then one decode step for everything running.
    drop_cancelled();
    int64_t budget = opt_.prefill_chunk;
    while (budget > 0) {
      if (group_.empty() && !form_group()) break;  // nothing (more) to take from the queue
      if (group_.empty()) continue;                // what it took ended at once
      const int64_t ran = advance_group(budget);
      budget -= ran;
      if (ran == 0 && !group_.empty()) break;
    }
    if (!running_.empty()) decode_step();
    const int64_t now_running = int64_t(running_.size()) + in_prefill();
    std::lock_guard lk(mu_);
    stats_.running = now_running;
  }
}

// One token for every running completion in one forward pass; the ended ones leave, and the
// last sequence of the batch moves into each freed slot so the batch stays contiguous.
void CompletionEngine::decode_step() {
  std::vector<Running>& running = running_;
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
    ++r.steps;
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
      try {
        CompletionResult result = r.run->finish();
        result.queue_seconds = r.queue_seconds;
        result.prefill_seconds = r.prefill_seconds;
        result.decode_seconds = seconds_between(r.decode_start, EngineClock::now());
        {
          std::lock_guard lk(mu_);
          stats_.decode_step_seconds.add(result.decode_seconds / double(r.steps));
        }
        if (result.finish_reason != "cancelled")
          keep_finished(r, int64_t(i), logits_.data() + logits_row[i] * V);
        deliver(*r.job, std::move(result));
      } catch (const std::exception& e) {
        deliver_error(*r.job, 500, "server_error", std::string("internal error: ") + e.what());
      }
    }
    // Sequence i is free: the batch's last moves into it. A last one whose state cannot move (a
    // GPU error) fails instead, and the one before it moves.
    for (;;) {
      const size_t last = running.size() - 1;
      if (i == last) {
        running.pop_back();
        break;
      }
      try {
        batch_->copy_sequence(*batch_, int64_t(last), int64_t(i));
        running[i] = std::move(running[last]);
        failed[i] = failed[last];
        logits_row[i] = logits_row[last];
        running.pop_back();
        break;
      } catch (const std::exception& e) {
        if (!failed[last])
          deliver_error(*running[last].job, 500, "server_error", std::string("internal error: ") + e.what());
        running.pop_back();
      }
    }
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
