// The NCCL communicator's watchdog (see comm_nccl_watchdog.h): the polling thread, the deadline
// and mismatch exits with their one-line reports, and the asynchronous-error abort.
#include "backend/cuda/comm_nccl_watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "dist/comm.h"

namespace zaya::nccl_detail {
namespace {

// Writes line to stderr in one write (after flushing stdout if nobody holds it). Then, when comm
// is given, ncclCommAbort (a helper thread exits anyway should it not return within 10 s), and
// _Exit(code).
[[noreturn]] void fatal_line(const std::string& line, int code, ncclComm_t comm) {
  if (ftrylockfile(stdout) == 0) {
    fflush_unlocked(stdout);
    funlockfile(stdout);
  }
  const std::string text = line + "\n";
  ssize_t written = ::write(2, text.data(), text.size());
  (void)written;
  if (comm != nullptr) {
    std::thread([code] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(code);
    }).detach();
    (void)ncclCommAbort(comm);
  }
  std::_Exit(code);
}

}  // namespace

void NcclWatchdog::start_init() {
  init_started_ = Clock::now();
  initializing_.store(true);
  thread_ = std::thread([this] { watch(); });
}

void NcclWatchdog::publish(const OpPtr& op) {
  {
    std::lock_guard<std::mutex> g(watch_mutex_);
    watch_list_.push_back(op);
  }
  watch_cv_.notify_all();
}

void NcclWatchdog::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> g(watch_mutex_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  thread_.join();
}

std::string NcclWatchdog::failure() {
  std::lock_guard<std::mutex> g(watch_mutex_);
  return failure_;
}

void NcclWatchdog::watch() {
  DeviceGuard d(device_);
  std::vector<OpPtr> ops;
  auto backoff = std::chrono::microseconds(50);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(watch_mutex_);
      if (watch_list_.empty() && !initializing_.load())
        watch_cv_.wait(lock, [&] { return stopping_ || !watch_list_.empty() || initializing_.load(); });
      else
        watch_cv_.wait_for(lock, backoff);
      if (stopping_ && watch_list_.empty()) return;
      ops = watch_list_;
    }
    const auto now = Clock::now();
    const std::chrono::duration<double> limit(timeout_s_);
    if (initializing_.load() && timeout_s_ > 0 && now - init_started_ > limit)
      fatal_line("zaya: comm watchdog: ncclCommInitRank on rank " + std::to_string(rank_) + " of " +
                     std::to_string(size_) + where() + " timed out after " + seconds() +
                     " s; peers not heard from: unknown (NCCL's own bootstrap does not say)",
                 kCommTimeoutExitCode, nullptr);
    check_async_error();
    bool progress = false;
    std::vector<const NcclOp*> retired;
    for (const OpPtr& op : ops) {
      const bool data = op_done(*op);
      std::string mismatch;
      const bool arrivals = arrivals_.poll(*op, &mismatch);
      if (!mismatch.empty())
        fatal_line(mismatch, kCommMismatchExitCode, aborted_.load() ? nullptr : comm());
      if (data && arrivals) {
        retired.push_back(op.get());
        progress = true;
      } else if (timeout_s_ > 0 && now - op->issued > limit) {
        expire(*op);
      }
    }
    ops.clear();  // our references go before the list drops its own
    if (!retired.empty()) {
      std::lock_guard<std::mutex> g(watch_mutex_);
      std::erase_if(watch_list_, [&](const OpPtr& op) {
        return std::find(retired.begin(), retired.end(), op.get()) != retired.end();
      });
    }
    backoff = progress ? std::chrono::microseconds(50) : std::min(backoff * 2, std::chrono::microseconds(1000));
  }
}

// An asynchronous NCCL error (a peer or the network failed): abort, and fail every pending op.
void NcclWatchdog::check_async_error() {
  ncclComm_t c = comm();
  if (c == nullptr || failed_.load()) return;
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(c, &async) != ncclSuccess || async == ncclSuccess || async == ncclInProgress) return;
  std::string why = std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async);
#if defined(ZAYA_GPU_NCCL_LAST_ERROR)
  if (const char* detail = ncclGetLastError(c); detail != nullptr && *detail != '\0') why += std::string(" (") + detail + ")";
#endif
  std::vector<OpPtr> pending;
  {
    std::lock_guard<std::mutex> g(watch_mutex_);
    failure_ = why;
    pending = watch_list_;
  }
  failed_.store(true);  // issuing threads check it, under issuing_, before they use the handle
  // Abort once no launch is using the handle; a launch stuck inside NCCL for a second is what the
  // abort unblocks, so then abort anyway.
  std::unique_lock<std::timed_mutex> launches(issuing_, std::defer_lock);
  (void)launches.try_lock_for(std::chrono::seconds(1));
  aborted_.store(true);
  (void)ncclCommAbort(c);
  for (const OpPtr& op : pending) {
    if (op->state.load() == kDone) continue;
    op->set_error(why);
    op->state.store(kDone, std::memory_order_release);
  }
}

void NcclWatchdog::expire(const NcclOp& op) {
  std::string state;
  const int s = op.state.load();
  if (s == kQueued) state = " (not launched: messages are launched at the next wait(), test() or collective of this rank)";
  if (s == kLaunching) state = " (still being launched: NCCL blocked on the host)";
  fatal_line("zaya: comm watchdog: " + op.describe() + state + " on rank " + std::to_string(rank_) + " of " +
                 std::to_string(size_) + where() + " timed out after " + seconds() +
                 " s; peers not heard from: " + arrivals_.silent_peers(op),
             kCommTimeoutExitCode, aborted_.load() ? nullptr : comm());
}

void NcclWatchdog::destroy(ncclComm_t c) {
  if (c == nullptr) return;
  if (timeout_s_ <= 0) {
    (void)ncclCommDestroy(c);
    return;
  }
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread deadline([&] {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return done; }))
      fatal_line("zaya: comm watchdog: ncclCommDestroy on rank " + std::to_string(rank_) + " of " +
                     std::to_string(size_) + where() + " did not return after " + seconds() +
                     " s (a peer has probably failed)",
                 kCommTimeoutExitCode, nullptr);
  });
  (void)ncclCommDestroy(c);
  {
    std::lock_guard<std::mutex> g(m);
    done = true;
  }
  cv.notify_one();
  deadline.join();
}

std::string NcclWatchdog::where() const {
  return " (local rank " + std::to_string(local_rank_) + ", device " + std::to_string(device_) + ")";
}

std::string NcclWatchdog::seconds() const {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", timeout_s_);
  return text;
}

}  // namespace zaya::nccl_detail
