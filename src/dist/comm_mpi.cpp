// The MPI communicator. Every call checks its arguments, queues an MpiOp (dist/mpi_op.h) and
// returns a handle at once. A communication thread posts the queued operations in FIFO order as
// non-blocking MPI calls (so any number may be in flight: gradient reduction overlaps compute,
// and a ring of sends and receives cannot deadlock; an operation on memory that an earlier
// running one writes, or reads while it writes, waits for it, and everything behind it in the
// queue waits too), polls them with MPI_Test, sleeping 50 us
// growing to 1 ms between polls that complete nothing (oversubscribed ranks must not spin), marks
// finished operations done, and runs the watchdog: an operation unfinished timeout_s after it was
// issued prints one line naming it and the peers not heard from, and the process exits with
// kCommTimeoutExitCode (no MPI_Abort, so every rank reports its own view).
#include <climits>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "dist/comm_mpi.h"
#include "dist/mpi_op.h"
#include "dist/mpi_runtime.h"

namespace zaya {
namespace {

using Clock = std::chrono::steady_clock;
using OpPtr = std::shared_ptr<MpiOp>;
constexpr std::chrono::microseconds kMinBackoff{50};
constexpr std::chrono::microseconds kMaxBackoff{1000};

class MpiRequest final : public CommRequest {
 public:
  explicit MpiRequest(OpPtr op) : op_(std::move(op)) {}
  ~MpiRequest() override { block(); }
  void wait() override {
    block();
    check();
  }
  bool test() override {
    {
      std::lock_guard<std::mutex> g(op_->m);
      if (!op_->done) return false;
    }
    check();
    return true;
  }

 private:
  void block() {
    std::unique_lock<std::mutex> lock(op_->m);
    op_->cv.wait(lock, [&] { return op_->done; });
  }
  void check() {
    if (!op_->error.empty())
      fail("comm", op_->describe() + " failed: " + op_->error,
           "every rank must issue the same operations with the same counts, types and peers");
  }
  OpPtr op_;
};

void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS) fail("comm", std::string(call) + " failed: " + mpi_error_text(rc));
}

class MpiComm final : public Comm, public MpiService {
 public:
  MpiComm(const CommOptions& options, int64_t max_chunk) : timeout_s_(options.timeout_s) {
    {
      std::lock_guard<std::mutex> g(mpi_mutex());
      check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &ctx_.data), "MPI_Comm_dup");
      check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &ctx_.arrival), "MPI_Comm_dup");
      MPI_Comm_set_errhandler(ctx_.data, MPI_ERRORS_RETURN);
      MPI_Comm_set_errhandler(ctx_.arrival, MPI_ERRORS_RETURN);
      MPI_Comm_rank(ctx_.data, &ctx_.rank);
      MPI_Comm_size(ctx_.data, &ctx_.size);
      MPI_Comm node = MPI_COMM_NULL;
      check_mpi(MPI_Comm_split_type(ctx_.data, MPI_COMM_TYPE_SHARED, ctx_.rank, MPI_INFO_NULL, &node),
                "MPI_Comm_split_type");
      MPI_Comm_rank(node, &local_rank_);
      MPI_Comm_size(node, &local_size_);
      MPI_Comm_free(&node);
      int* tag_ub = nullptr;
      int flag = 0;
      MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
      tag_ub_ = flag && tag_ub ? *tag_ub : 32767;
      // Arrival tracking needs every rank to take part: on only when every rank runs the watchdog.
      int mine = timeout_s_ > 0 ? 1 : 0, all = 0;
      check_mpi(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, ctx_.data), "MPI_Allreduce");
      ctx_.arrivals = all == 1;
      ctx_.max_chunk = max_chunk > 0 && max_chunk < INT_MAX ? max_chunk : INT_MAX;
    }
    thread_ = std::thread([this] { run(); });
    mpi_register(this);
  }
  ~MpiComm() override {
    mpi_unregister(this);
    stop();
  }

  std::string name() const override { return "mpi"; }
  int rank() const override { return ctx_.rank; }
  int size() const override { return ctx_.size; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  CommHandle all_reduce(const void* send, void* recv, int64_t count, CommType type, ReduceOp op) override {
    check_count("all_reduce", count);
    check_buffer("all_reduce", "send", send, count);
    check_buffer("all_reduce", "recv", recv, count);
    auto o = new_op(MpiOpKind::AllReduce, type);
    o->send = send, o->recv = recv, o->count = count, o->reduce = op;
    return enqueue(std::move(o));
  }
  CommHandle reduce_scatter(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type,
                            ReduceOp op) override {
    int64_t total = check_counts("reduce_scatter", counts);
    check_buffer("reduce_scatter", "send", send, total);
    check_buffer("reduce_scatter", "recv", recv, counts[static_cast<size_t>(ctx_.rank)]);
    auto o = new_op(MpiOpKind::ReduceScatter, type);
    o->send = send, o->recv = recv, o->counts = counts, o->reduce = op;
    return enqueue(std::move(o));
  }
  CommHandle all_gather(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type) override {
    int64_t total = check_counts("all_gather", counts);
    check_buffer("all_gather", "send", send, counts[static_cast<size_t>(ctx_.rank)]);
    check_buffer("all_gather", "recv", recv, total);
    auto o = new_op(MpiOpKind::AllGather, type);
    o->send = send, o->recv = recv, o->counts = counts;
    return enqueue(std::move(o));
  }
  CommHandle broadcast(void* buf, int64_t count, CommType type, int root) override {
    check_count("broadcast", count);
    check_buffer("broadcast", "buf", buf, count);
    if (root < 0 || root >= ctx_.size)
      fail("comm", "broadcast: root " + std::to_string(root) + " is not a rank (ranks are 0.." +
                       std::to_string(ctx_.size - 1) + ")");
    auto o = new_op(MpiOpKind::Broadcast, type);
    o->recv = buf, o->count = count, o->root = root;
    return enqueue(std::move(o));
  }
  CommHandle barrier() override { return enqueue(new_op(MpiOpKind::Barrier, CommType::U8)); }
  CommHandle send(const void* buf, int64_t count, CommType type, int peer, int tag) override {
    check_message("send", buf, count, peer, tag);
    auto o = new_op(MpiOpKind::Send, type);
    o->send = buf, o->count = count, o->peer = peer, o->tag = tag;
    return enqueue(std::move(o));
  }
  CommHandle recv(void* buf, int64_t count, CommType type, int peer, int tag) override {
    check_message("recv", buf, count, peer, tag);
    auto o = new_op(MpiOpKind::Recv, type);
    o->recv = buf, o->count = count, o->peer = peer, o->tag = tag;
    return enqueue(std::move(o));
  }

  // Drains the queue (the watchdog still applies), joins the thread, frees the communicators.
  void stop() override {
    std::lock_guard<std::mutex> s(stop_mutex_);
    if (stopped_) return;
    stopped_ = true;
    {
      std::lock_guard<std::mutex> g(queue_mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> g(mpi_mutex());
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&ctx_.data);
    MPI_Comm_free(&ctx_.arrival);
  }

 private:
  static OpPtr new_op(MpiOpKind kind, CommType type) {
    auto op = std::make_shared<MpiOp>();
    op->kind = kind;
    op->type = type;
    comm_type_size(type);  // rejects an invalid type here rather than on the thread
    return op;
  }

  CommHandle enqueue(OpPtr op) {
    {
      std::lock_guard<std::mutex> g(queue_mutex_);
      if (stopping_)
        fail("comm", std::string(comm_op_kind_name(op->kind)) + " issued on an MPI communicator that has shut down",
             "MPI is finalised at exit; issue every operation before the program ends");
      op->seq = op->collective() ? ++collectives_ : ++messages_;
      op->issued = Clock::now();
      op->set_spans(ctx_.rank);
      queue_.push_back(op);
    }
    queue_cv_.notify_one();
    return std::make_unique<MpiRequest>(std::move(op));
  }

  void run() {
    std::deque<OpPtr> pending;  // issued, not yet posted (FIFO)
    std::vector<OpPtr> active;  // posted, not finished, in issue order
    auto backoff = kMinBackoff;
    for (;;) {
      bool progress = false;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        if (active.empty() && pending.empty()) queue_cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
        progress = !queue_.empty();
        for (OpPtr& op : queue_) pending.push_back(std::move(op));
        queue_.clear();
        if (pending.empty() && active.empty() && stopping_) return;
      }
      std::vector<OpPtr> finished;
      {
        std::lock_guard<std::mutex> g(mpi_mutex());
        for (size_t i = 0; i < active.size();) {
          bool done = false;
          progress |= mpi_op_poll(*active[i], ctx_, &done);
          if (done) {
            finished.push_back(std::move(active[i]));
            active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
          } else {
            ++i;
          }
        }
        // Post from the head of the queue; stop at the first operation that must wait.
        while (!pending.empty() && !must_wait(*pending.front(), active)) {
          mpi_op_start(*pending.front(), ctx_);
          active.push_back(std::move(pending.front()));
          pending.pop_front();
          progress = true;
        }
      }
      for (OpPtr& op : finished) {
        {
          std::lock_guard<std::mutex> g(op->m);
          op->done = true;
        }
        op->cv.notify_all();
      }
      if (timeout_s_ > 0) {
        check_deadlines(active);
        check_deadlines(pending);
      }
      if (progress) {
        backoff = kMinBackoff;
        continue;
      }
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait_for(lock, backoff, [&] { return !queue_.empty(); });
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  static bool must_wait(const MpiOp& op, const std::vector<OpPtr>& active) {
    for (const OpPtr& earlier : active)
      if (mpi_ops_conflict(*earlier, op)) return true;
    return false;
  }

  template <class List>
  void check_deadlines(const List& ops) {
    const auto now = Clock::now();
    const std::chrono::duration<double> limit(timeout_s_);
    for (const OpPtr& op : ops)
      if (now - op->issued > limit) expire(*op);
  }

  [[noreturn]] void expire(const MpiOp& op) {
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.1f", timeout_s_);
    mpi_fatal_line("zaya: comm watchdog: " + op.describe() + " on rank " + std::to_string(ctx_.rank) + " of " +
                       std::to_string(ctx_.size) + " timed out after " + seconds +
                       " s; peers not heard from: " + mpi_op_silent_peers(op, ctx_),
                   kCommTimeoutExitCode);
  }

  static void check_count(const char* op, int64_t count) {
    if (count < 0) fail("comm", std::string(op) + ": negative count " + std::to_string(count));
  }
  static void check_buffer(const char* op, const char* which, const void* p, int64_t count) {
    if (p == nullptr && count > 0)
      fail("comm", std::string(op) + ": " + which + " is null but holds " + std::to_string(count) + " elements");
  }
  // Checks per-rank counts (one per rank, each >= 0, all of them addressable by one MPI call);
  // returns their sum.
  int64_t check_counts(const char* op, const std::vector<int64_t>& counts) const {
    if (counts.size() != static_cast<size_t>(ctx_.size))
      fail("comm", std::string(op) + ": counts has " + std::to_string(counts.size()) + " entries, expected " +
                       std::to_string(ctx_.size) + " (one per rank)");
    int64_t total = 0;
    for (int64_t c : counts) {
      check_count(op, c);
      total += c;
    }
    if (total > INT_MAX)
      fail("comm",
           std::string(op) + ": total count " + std::to_string(total) + " exceeds INT_MAX (" + std::to_string(INT_MAX) +
               "), the most one MPI call can address",
           "split the buffer into several smaller operations");
    return total;
  }
  void check_message(const char* op, const void* buf, int64_t count, int peer, int tag) const {
    check_count(op, count);
    check_buffer(op, "buf", buf, count);
    if (peer < 0 || peer >= ctx_.size || peer == ctx_.rank)
      fail("comm", std::string(op) + ": peer " + std::to_string(peer) + " is not another rank (this is rank " +
                       std::to_string(ctx_.rank) + " of " + std::to_string(ctx_.size) + ")");
    if (tag < 0 || tag > tag_ub_)
      fail("comm", std::string(op) + ": tag " + std::to_string(tag) + " is outside 0.." + std::to_string(tag_ub_));
  }

  MpiContext ctx_;
  double timeout_s_;
  int local_rank_ = 0, local_size_ = 1, tag_ub_ = 32767;

  std::mutex queue_mutex_;  // guards queue_, stopping_, collectives_, messages_
  std::condition_variable queue_cv_;
  std::vector<OpPtr> queue_;
  bool stopping_ = false;
  int64_t collectives_ = 0, messages_ = 0;

  std::mutex stop_mutex_;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(const CommOptions& options, int64_t max_chunk_elements) {
  mpi_init_once();
  return std::make_unique<MpiComm>(options, max_chunk_elements);
}

}  // namespace zaya
