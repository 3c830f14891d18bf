// The serialised completion engine (see completion_engine.h).
#include "serve/completion_engine.h"

#include <chrono>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "serve/api_error.h"
#include "serve/completion_run.h"

namespace zaya {

using Clock = std::chrono::steady_clock;

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

CompletionEngine::CompletionEngine(Model& model, const Tokenizer* tokenizer, EngineOptions options)
    : model_(model), tok_(tokenizer), opt_(options) {
  thread_ = std::thread([this] { loop(); });
}

CompletionEngine::~CompletionEngine() { shutdown(); }

bool CompletionEngine::accepting() const {
  std::lock_guard lk(mu_);
  return !stopping_ && queue_.size() < opt_.max_queue;
}

CompletionResult CompletionEngine::run(CompletionJob in, const ChunkFn& on_chunk) {
  auto job = std::make_shared<Job>();
  job->in = std::move(in);
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw ApiError(503, "unavailable_error", "the server is shutting down");
    if (queue_.size() >= opt_.max_queue)
      throw ApiError(503, "unavailable_error",
                     "the server is busy: " + std::to_string(queue_.size()) +
                         " completions are already waiting; retry later");
    queue_.push_back(job);
  }
  cv_.notify_all();
  std::unique_lock lk(job->m);
  for (;;) {
    job->cv.wait(lk, [&] { return job->done || !job->chunks.empty(); });
    while (!job->chunks.empty()) {
      CompletionChunk chunk = std::move(job->chunks.front());
      job->chunks.pop_front();
      if (!on_chunk || job->cancelled) continue;
      lk.unlock();
      bool keep = false;
      try {
        keep = on_chunk(chunk);
      } catch (...) {
        job->cancelled = true;
        throw;
      }
      lk.lock();
      if (!keep) job->cancelled = true;
    }
    if (job->done) break;
  }
  if (job->error_status) throw ApiError(job->error_status, job->error_type, job->error_message);
  return std::move(job->result);
}

void CompletionEngine::loop() {
#ifdef _OPENMP
  if (opt_.threads > 0) omp_set_num_threads(opt_.threads);  // per thread: set on the one that runs the model
#endif
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;  // shutdown() fails whatever is still queued
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    execute(*job);
  }
}

void CompletionEngine::execute(Job& job) {
  CompletionResult r;
  int error_status = 0;
  std::string error_type, error_message;
  const double queue_seconds = std::chrono::duration<double>(Clock::now() - job.queued_at).count();
  try {
    if (job.cancelled) {
      r.prompt_tokens = int64_t(job.in.prompt.size());
      r.finish_reason = "cancelled";
    } else {
      r = run_completion(model_, tok_, job.in, [&job, this](CompletionChunk chunk) {
        {
          std::lock_guard lk(job.m);
          job.chunks.push_back(std::move(chunk));
        }
        job.cv.notify_all();
        return !job.cancelled && !stopping_;
      });
    }
    r.queue_seconds = queue_seconds;
  } catch (const ApiError& e) {
    error_status = e.status();
    error_type = e.type();
    error_message = e.what();
  } catch (const std::exception& e) {
    error_status = 500;
    error_type = "server_error";
    error_message = std::string("internal error: ") + e.what();
  } catch (...) {
    error_status = 500;
    error_type = "server_error";
    error_message = "internal error: unknown exception";
  }
  {
    std::lock_guard lk(job.m);
    job.result = std::move(r);
    job.error_status = error_status;
    job.error_type = std::move(error_type);
    job.error_message = std::move(error_message);
    job.done = true;
  }
  job.cv.notify_all();
}

void CompletionEngine::shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (auto& job : dropped) {
    {
      std::lock_guard lk(job->m);
      job->error_status = 503;
      job->error_type = "unavailable_error";
      job->error_message = "the server is shutting down";
      job->done = true;
    }
    job->cv.notify_all();
  }
  std::lock_guard lk(join_mu_);
  if (thread_.joinable()) thread_.join();
}

}  // namespace zaya
