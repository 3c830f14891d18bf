// The NCCL communicator's watchdog (comm_nccl.h, "Watchdog"): one thread that polls every
// published operation (its event, its arrival messages, its deadline) and
// ncclCommGetAsyncError. An operation leaves the watch list when its data and its arrival
// messages have completed. On expiry (of an operation, or of ncclCommInitRank while it runs) it
// prints one line naming the operation and the peers not heard from, calls ncclCommAbort and
// exits with kCommTimeoutExitCode; an arrival message describing another operation exits with
// kCommMismatchExitCode; an asynchronous NCCL error aborts the communicator (once no launch is
// in progress, or after a second: the abort is what unblocks a launch stuck in NCCL) and fails
// every pending operation. ncclCommDestroy at teardown runs under the same deadline. Defined in
// comm_nccl_watchdog.cu.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/comm_nccl_arrival.h"
#include "backend/cuda/comm_nccl_op.h"

namespace zaya::nccl_detail {

class NcclWatchdog {
 public:
  // comm: the communicator's NCCL handle (null until ncclCommInitRank returns); arrivals: its
  // arrival channel; issuing: the mutex its issuing threads hold while they use the handle. All
  // are the communicator's and outlive the thread (stop() joins it).
  NcclWatchdog(int device, double timeout_s, int rank, int size, int local_rank,
               const std::atomic<ncclComm_t>& comm, const NcclArrivals& arrivals, std::timed_mutex& issuing)
      : device_(device),
        timeout_s_(timeout_s),
        rank_(rank),
        size_(size),
        local_rank_(local_rank),
        comm_(comm),
        arrivals_(arrivals),
        issuing_(issuing) {}
  ~NcclWatchdog() { stop(); }
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // Starts the thread, with ncclCommInitRank's deadline counted from now; init_done() ends it.
  void start_init();
  void init_done() { initializing_.store(false); }
  // Adds op to the watch list; from then on its deadline applies (publish before launching).
  void publish(const OpPtr& op);
  // Waits until every published operation has left the list (the deadlines still apply), then
  // joins the thread. Nothing to do when it never started or has stopped.
  void stop();

  // Whether an asynchronous NCCL error has failed the communicator, and why.
  bool failed() const { return failed_.load(); }
  std::string failure();
  // Whether the thread has called ncclCommAbort (the handle must then not be destroyed).
  bool aborted() const { return aborted_.load(); }
  // ncclCommDestroy(c) under the deadline: should it not return within timeout_s (a peer that
  // failed can hold it), one line and _Exit(kCommTimeoutExitCode). Call after stop().
  void destroy(ncclComm_t c);

 private:
  ncclComm_t comm() const { return comm_.load(std::memory_order_acquire); }
  void watch();
  void check_async_error();
  [[noreturn]] void expire(const NcclOp& op);
  std::string where() const;
  std::string seconds() const;

  const int device_;
  const double timeout_s_;
  const int rank_, size_, local_rank_;
  const std::atomic<ncclComm_t>& comm_;
  const NcclArrivals& arrivals_;
  std::timed_mutex& issuing_;

  std::mutex watch_mutex_;  // guards watch_list_, stopping_, failure_
  std::condition_variable watch_cv_;
  std::vector<OpPtr> watch_list_;  // published, not yet retired
  bool stopping_ = false;
  std::string failure_;
  std::atomic<bool> failed_{false}, aborted_{false}, initializing_{false};
  Clock::time_point init_started_;
  std::thread thread_;
};

}  // namespace zaya::nccl_detail
