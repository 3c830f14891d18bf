// The NCCL communicator (RCCL on HIP); the contract is in comm_nccl.h, the operation record and
// helpers in comm_nccl_op.h, the watchdog in comm_nccl_watchdog.h and the arrival channel in
// comm_nccl_arrival.h. Run on one GPU with one rank (tests/gpu/test_gpu_comm.cpp), and with 1 to 3
// ranks on the host emulation's NCCL (tests/simt/simt_nccl.h; CTest emulated_nccl_*).
//
// Structure: every call checks its arguments (device memory of our GPU, counts, peers), builds
// an NcclOp and publishes it to the watchdog's list before launching anything, so a launch that
// blocks on the host (NCCL connects to peers lazily, inside the first operation that needs them)
// is under the deadline too. Collectives are launched at once on the communication stream,
// after the producer fence; sends and receives are queued and launched as one group at the next
// flush (a collective, or wait()/test() on any request). Each launched operation records its own
// event on the stream. Requests poll that event (wait() yields, then sleeps 20 us growing to
// 500 us; it does not block in gpuEventSynchronize, so that a failure found by the watchdog
// thread, which marks the operation done with an error, can wake it).
//
// The watchdog thread (comm_nccl_watchdog.cu) polls every published operation: its event, its
// arrival messages (when the arrival channel is on), its deadline; and ncclCommGetAsyncError. An
// operation leaves the list when its data and its arrival messages have completed. This file
// posts each operation's arrival messages (comm_nccl_arrival.cu) before publishing it.
#define ZAYA_GPU_WANT_COLLECTIVES 1
#include "backend/cuda/gpu_runtime.h"

#if !defined(ZAYA_GPU_COLLECTIVES)
#error "comm_nccl.cu needs NCCL (CUDA) or RCCL (HIP with ZAYA_HAVE_RCCL); cmake/cuda.cmake leaves it out otherwise"
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/comm_nccl.h"
#include "backend/cuda/cuda_factory.h"
#include "backend/cuda/comm_nccl_arrival.h"
#include "backend/cuda/comm_nccl_op.h"
#include "backend/cuda/comm_nccl_watchdog.h"
#include "ckpt/dist_agree.h"
#include "core/error.h"
#include "dist/comm_op.h"

namespace zaya {
namespace {

using namespace nccl_detail;


class NcclComm;

class NcclRequest final : public CommRequest {
 public:
  NcclRequest(OpPtr op, NcclComm* comm) : op_(std::move(op)), comm_(comm) {}
  ~NcclRequest() override { block(); }
  void wait() override {
    block();
    check();
  }
  bool test() override;

 private:
  void block();
  void check() {
    const std::string e = op_->get_error();
    if (!e.empty())
      fail("comm", op_->describe() + " failed: " + e,
           "every rank must issue the same operations with the same counts, types and peers");
  }
  OpPtr op_;
  NcclComm* comm_;  // used only while op_ is queued (the communicator launches every queued op before it goes)
};

class NcclComm final : public Comm {
 public:
  NcclComm(Comm& bootstrap, int device, const CommOptions& options, void* producer, bool uneven_paths_always)
      : device_(device),
        timeout_s_(options.timeout_s),
        rank_(bootstrap.rank()),
        size_(bootstrap.size()),
        local_rank_(bootstrap.local_rank()),
        local_size_(bootstrap.local_size()),
        producer_(producer != nullptr ? static_cast<gpuStream_t>(producer) : gpuStreamLegacy),
        uneven_always_(uneven_paths_always),
        arrivals_(rank_, size_),
        watchdog_(device_, timeout_s_, rank_, size_, local_rank_, comm_, arrivals_, issue_mutex_) {
    try {
      init(bootstrap);
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclComm() override {
    {
      std::lock_guard<std::timed_mutex> g(issue_mutex_);
      closed_ = true;
      DeviceGuard d(device_);
      flush_locked();
    }
    release();
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  CommHandle all_reduce(const void* send, void* recv, int64_t count, CommType type, ReduceOp op) override {
    const int64_t es = comm_type_size(type);
    check_count("all_reduce", count);
    check_buffer("all_reduce", "send", send, count * es);
    check_buffer("all_reduce", "recv", recv, count * es);
    auto o = new_op(OpKind::AllReduce, type, count * es, static_cast<int64_t>(op));
    return issue_collective(std::move(o), [=, this]() -> std::string {
      if (count == 0) return "";
      return nccl_text(ncclAllReduce(send, recv, size_t(count), nccl_type(type), nccl_op(op), comm(), stream_),
                       "ncclAllReduce");
    });
  }

  CommHandle reduce_scatter(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type,
                            ReduceOp op) override {
    const int64_t es = comm_type_size(type);
    const int64_t total = check_counts("reduce_scatter", counts);
    const int64_t mine = counts[size_t(rank_)];
    check_buffer("reduce_scatter", "send", send, total * es);
    check_buffer("reduce_scatter", "recv", recv, mine * es);
    auto o = new_op(OpKind::ReduceScatter, type, total * es, static_cast<int64_t>(op));
    return issue_collective(std::move(o), [=, this]() { return launch_reduce_scatter(send, recv, counts, type, op); });
  }

  CommHandle all_gather(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type) override {
    const int64_t es = comm_type_size(type);
    const int64_t total = check_counts("all_gather", counts);
    check_buffer("all_gather", "send", send, counts[size_t(rank_)] * es);
    check_buffer("all_gather", "recv", recv, total * es);
    auto o = new_op(OpKind::AllGather, type, total * es, 0);
    return issue_collective(std::move(o), [=, this]() { return launch_all_gather(send, recv, counts, type); });
  }

  CommHandle broadcast(void* buf, int64_t count, CommType type, int root) override {
    const int64_t es = comm_type_size(type);
    check_count("broadcast", count);
    check_buffer("broadcast", "buf", buf, count * es);
    if (root < 0 || root >= size_)
      fail("comm", "broadcast: root " + std::to_string(root) + " is not a rank (ranks are 0.." +
                       std::to_string(size_ - 1) + ")");
    auto o = new_op(OpKind::Broadcast, type, count * es, root);
    return issue_collective(std::move(o), [=, this]() -> std::string {
      if (count == 0) return "";
      return nccl_text(ncclBroadcast(buf, buf, size_t(count), nccl_type(type), root, comm(), stream_), "ncclBroadcast");
    });
  }

  // An all_reduce of one int32 in a device scratch word: it completes once every rank reached it.
  CommHandle barrier() override {
    auto o = new_op(OpKind::Barrier, CommType::U8, 0, 0);
    return issue_collective(std::move(o), [this]() {
      return nccl_text(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm(), stream_), "ncclAllReduce");
    });
  }

  CommHandle send(const void* buf, int64_t count, CommType type, int peer, int tag) override {
    const int64_t es = comm_type_size(type);
    check_message("send", buf, count * es, count, peer, tag);
    auto o = new_op(OpKind::Send, type, count * es, tag);
    o->send = buf, o->count = count, o->peer = peer;
    return issue_message(std::move(o));
  }

  CommHandle recv(void* buf, int64_t count, CommType type, int peer, int tag) override {
    const int64_t es = comm_type_size(type);
    check_message("recv", buf, count * es, count, peer, tag);
    auto o = new_op(OpKind::Recv, type, count * es, tag);
    o->recv = buf, o->count = count, o->peer = peer;
    return issue_message(std::move(o));
  }

  // Launches the queued sends and receives (requests call it when theirs is still queued).
  void flush() {
    std::lock_guard<std::timed_mutex> g(issue_mutex_);
    DeviceGuard d(device_);
    flush_locked();
  }

 private:
  ncclComm_t comm() const { return comm_.load(std::memory_order_acquire); }

  // ---- construction and teardown ----

  void init(Comm& bootstrap) {
    // The calling thread's current device is restored on the way out.
    struct Restore {
      int device = -1;
      ~Restore() {
        if (device >= 0 && gpuSetDevice(device) != gpuSuccess) (void)gpuGetLastError();
      }
    } restore;
    if (gpuGetDevice(&restore.device) != gpuSuccess) {
      (void)gpuGetLastError();
      restore.device = -1;
    }
    // 1. The device, then the stream, the fence event and the barrier's scratch word; every
    // rank's failures are agreed over the bootstrap so that no rank is left waiting in a
    // collective for one that failed.
    std::string local;
    const int count = cuda_device_count();
    if (count == 0)
      local = "no GPU device is available";
    else if (device_ < 0 || device_ >= count)
      local = "device " + std::to_string(device_) + " does not exist (" + std::to_string(count) + " found)";
    else
      local = gpu_text(gpuSetDevice(device_), "gpuSetDevice");
    if (local.empty()) local = create_stream_objects();
    const char* hint =
        "each rank needs a GPU of its own: pass the rank's local_rank() as the device and launch at most as many "
        "ranks per node as it has GPUs";
    std::string agreed = dist_agree::first_error(bootstrap, local);
    if (!agreed.empty()) fail("comm", "cannot create the NCCL communicator: " + agreed, hint);
    // 2. One GPU per rank (the same verdict on every rank).
    const std::string shared = nccl_shared_gpus(bootstrap, device_);
    if (!shared.empty()) fail("comm", "cannot create the NCCL communicator: " + shared, hint);
    // 3. The unique id, made by rank 0 and broadcast once every rank is known to be ready.
    ncclUniqueId id{};
    agreed = dist_agree::first_error(bootstrap, rank_ == 0 ? nccl_text(ncclGetUniqueId(&id), "ncclGetUniqueId") : "");
    if (!agreed.empty()) fail("comm", "cannot create the NCCL communicator: " + agreed);
    bootstrap.broadcast(&id, int64_t(sizeof(id)), CommType::U8, 0)->wait();
    // 4. Whether the arrival channel is on, agreed over the bootstrap.
    arrivals_.agree(bootstrap, timeout_s_);

    // 5. NCCL, under the watchdog's deadline (ncclCommInitRank blocks until every rank has called it).
    watchdog_.start_init();
    ncclComm_t c = nullptr;
    const ncclResult_t rc = ncclCommInitRank(&c, size_, id, rank_);
    watchdog_.init_done();
    if (rc != ncclSuccess)
      fail("comm", "ncclCommInitRank on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                       " (device " + std::to_string(device_) + ") failed: " + ncclGetErrorString(rc),
           "NCCL_DEBUG=INFO shows why; every rank needs its own GPU");
    comm_.store(c, std::memory_order_release);

    // 6. The arrival channel (when on): a private MPI communicator.
    arrivals_.open(timeout_s_);
  }

  // The communication stream, the fence event and the barrier's scratch word (zeroed): "" or
  // what failed.
  std::string create_stream_objects() {
    std::string e = gpu_text(gpuStreamCreateWithFlags(&stream_, gpuStreamNonBlocking), "gpuStreamCreateWithFlags");
    if (e.empty()) e = gpu_text(gpuEventCreateWithFlags(&fence_, gpuEventDisableTiming), "gpuEventCreateWithFlags");
    void* scratch = nullptr;
    if (e.empty()) e = gpu_text(gpuMalloc(&scratch, 256), "gpuMalloc");
    scratch_ = scratch;
    if (e.empty()) e = gpu_text(gpuMemsetAsync(scratch_, 0, 256, stream_), "gpuMemsetAsync");
    if (e.empty()) e = gpu_text(gpuStreamSynchronize(stream_), "gpuStreamSynchronize");
    return e;
  }

  // Everything the constructor may have made, in reverse; also the destructor's second half.
  // Waits for every published operation (the watchdog still applies), then stops the watchdog.
  void release() {
    watchdog_.stop();
    DeviceGuard d(device_);
    ncclComm_t c = comm_.exchange(nullptr);
    if (c != nullptr && !watchdog_.aborted()) watchdog_.destroy(c);
    arrivals_.close();
    if (stream_) (void)gpuStreamSynchronize(stream_);
    for (void* p : retired_) (void)gpuFree(p);
    retired_.clear();
    if (staging_) (void)gpuFree(staging_);
    staging_ = nullptr;
    if (scratch_) (void)gpuFree(scratch_);
    scratch_ = nullptr;
    if (fence_) (void)gpuEventDestroy(fence_);
    fence_ = nullptr;
    if (stream_) (void)gpuStreamDestroy(stream_);
    stream_ = nullptr;
  }

  // ---- issuing ----

  static OpPtr new_op(OpKind kind, CommType type, int64_t bytes, int64_t detail) {
    auto op = std::make_shared<NcclOp>();
    op->kind = kind;
    op->type = type;
    op->bytes = bytes;
    op->detail = detail;
    return op;
  }

  void check_usable(const OpPtr& op) {
    if (closed_)
      fail("comm", std::string(comm_op_kind_name(op->kind)) + " issued on an NCCL communicator that is being destroyed");
    if (watchdog_.failed())
      fail("comm", std::string(comm_op_kind_name(op->kind)) + " issued on an NCCL communicator that has failed: " +
                       watchdog_.failure(),
           "the communicator was aborted; restart the job");
  }

  template <class Launch>
  CommHandle issue_collective(OpPtr op, Launch&& launch) {
    std::lock_guard<std::timed_mutex> g(issue_mutex_);
    check_usable(op);
    DeviceGuard d(device_);
    flush_locked();  // queued messages go first: the stream runs operations in issue order
    op->seq = ++collectives_;
    op->issued = Clock::now();
    op->state.store(kLaunching);
    arrivals_.post_collective(*op);
    watchdog_.publish(op);
    std::string err = fence_locked();
    if (err.empty()) err = launch();
    finish_launch(*op, err);
    return std::make_unique<NcclRequest>(std::move(op), this);
  }

  CommHandle issue_message(OpPtr op) {
    std::lock_guard<std::timed_mutex> g(issue_mutex_);
    check_usable(op);
    op->seq = ++messages_;
    op->issued = Clock::now();
    arrivals_.post_message(*op);
    watchdog_.publish(op);
    queued_.push_back(op);
    return std::make_unique<NcclRequest>(std::move(op), this);
  }

  // The communication stream waits for everything already enqueued on the producer stream.
  std::string fence_locked() {
    std::string e = gpu_text(gpuEventRecord(fence_, producer_), "gpuEventRecord (producer fence)");
    if (e.empty()) e = gpu_text(gpuStreamWaitEvent(stream_, fence_, 0), "gpuStreamWaitEvent (producer fence)");
    return e;
  }

  // After a launch: the op's event, or its error.
  void finish_launch(NcclOp& op, std::string err) {
    // The watchdog records its reason before it flags the failure, so the reason is there to name.
    if (err.empty() && watchdog_.failed()) err = "the communicator failed during the launch: " + watchdog_.failure();
    if (err.empty()) err = gpu_text(gpuEventCreateWithFlags(&op.event, gpuEventDisableTiming), "gpuEventCreateWithFlags");
    if (err.empty()) err = gpu_text(gpuEventRecord(op.event, stream_), "gpuEventRecord");
    if (!err.empty()) {
      op.set_error(err);
      op.state.store(kDone, std::memory_order_release);
      return;
    }
    op.state.store(kLaunched, std::memory_order_release);
  }

  // Launches every queued send and receive: consecutive ones in one group (so that a ring of sends
  // and receives cannot deadlock), except that a message touching memory that an earlier one of
  // the same group writes (or reads, when it writes) starts a new group: the two then take effect
  // in issue order, as with the MPI communicator (receiving into a buffer and forwarding it
  // works). Caller holds issue_mutex_ and the device.
  void flush_locked() {
    if (queued_.empty()) return;
    std::vector<OpPtr> batch;
    batch.swap(queued_);
    for (const OpPtr& op : batch) op->state.store(kLaunching);
    std::string err;
    if (watchdog_.failed()) err = "the communicator failed before this message was launched";
    if (err.empty()) err = fence_locked();
    for (size_t begin = 0; begin < batch.size();) {
      size_t end = begin + 1;
      while (end < batch.size() && !conflicts_with_group(batch, begin, end)) ++end;
      if (err.empty()) err = launch_group(batch, begin, end);
      for (size_t i = begin; i < end; ++i) finish_launch(*batch[i], err);
      begin = end;
    }
  }

  // Whether batch[next] touches memory of batch[begin, next) with a write on either side.
  static bool conflicts_with_group(const std::vector<OpPtr>& batch, size_t begin, size_t next) {
    const NcclOp& b = *batch[next];
    const char* pb = static_cast<const char*>(b.kind == OpKind::Send ? b.send : b.recv);
    for (size_t i = begin; i < next; ++i) {
      const NcclOp& a = *batch[i];
      const char* pa = static_cast<const char*>(a.kind == OpKind::Send ? a.send : a.recv);
      const bool write = a.kind == OpKind::Recv || b.kind == OpKind::Recv;
      if (write && a.bytes > 0 && b.bytes > 0 && pa < pb + b.bytes && pb < pa + a.bytes) return true;
    }
    return false;
  }

  // One ncclGroupStart/End around batch[begin, end); "" or the first error.
  std::string launch_group(const std::vector<OpPtr>& batch, size_t begin, size_t end) {
    std::string e = nccl_text(ncclGroupStart(), "ncclGroupStart");
    if (!e.empty()) return e;
    std::string first;
    for (size_t i = begin; i < end; ++i) {
      const NcclOp& op = *batch[i];
      if (op.count == 0) continue;  // both sides skip it: the counts of a matched pair agree
      const ncclResult_t rc = op.kind == OpKind::Send
                                  ? ncclSend(op.send, size_t(op.count), nccl_type(op.type), op.peer, comm(), stream_)
                                  : ncclRecv(op.recv, size_t(op.count), nccl_type(op.type), op.peer, comm(), stream_);
      if (first.empty()) first = nccl_text(rc, op.kind == OpKind::Send ? "ncclSend" : "ncclRecv");
    }
    const std::string done = nccl_text(ncclGroupEnd(), "ncclGroupEnd");
    return first.empty() ? done : first;
  }

  // Equal counts: ncclReduceScatter (in place at NCCL's offset when send == recv, then the block
  // is moved to the start). Uneven: one group of ncclReduce, one rooted at each rank with a
  // block, so every rank receives its own block reduced and the traffic is that of the blocks
  // themselves (no padding to the largest). In place, this rank's block is reduced where it lies
  // and then moved to the start (through the staging buffer when the two ranges overlap).
  std::string launch_reduce_scatter(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type,
                                    ReduceOp op) {
    const int64_t es = comm_type_size(type);
    const int64_t mine = counts[size_t(rank_)];
    int64_t largest = 0;
    const bool equal = equal_counts(counts, uneven_always_, &largest);
    if (largest == 0) return "";
    std::string e;
    if (equal) {
      if (send != recv)
        return nccl_text(ncclReduceScatter(send, recv, size_t(mine), nccl_type(type), nccl_op(op), comm(), stream_),
                         "ncclReduceScatter");
      char* block = at(send, int64_t(rank_) * mine, es);  // NCCL's in-place position
      e = nccl_text(ncclReduceScatter(send, block, size_t(mine), nccl_type(type), nccl_op(op), comm(), stream_),
                    "ncclReduceScatter");
      if (e.empty() && rank_ != 0)  // [rank*n, rank*n + n) and [0, n) do not overlap for rank >= 1
        e = gpu_text(gpuMemcpyAsync(recv, block, size_t(mine * es), gpuMemcpyDeviceToDevice, stream_),
                     "gpuMemcpyAsync");
      return e;
    }
    const std::vector<int64_t> off = block_offsets(counts);
    const bool in_place = send == recv;
    char* own = at(send, off[size_t(rank_)], es);  // this rank's block of the input
    e = nccl_text(ncclGroupStart(), "ncclGroupStart");
    if (!e.empty()) return e;
    std::string first;
    for (int r = 0; r < size_; ++r) {
      const int64_t c = counts[size_t(r)];
      if (c == 0) continue;
      char* input = at(send, off[size_t(r)], es);
      // The root writes its result (in place: over its own block); the others only send.
      void* output = r == rank_ ? (in_place ? static_cast<void*>(own) : recv) : static_cast<void*>(input);
      const ncclResult_t rc = ncclReduce(input, output, size_t(c), nccl_type(type), nccl_op(op), r, comm(), stream_);
      if (first.empty()) first = nccl_text(rc, "ncclReduce");
    }
    const std::string end = nccl_text(ncclGroupEnd(), "ncclGroupEnd");
    e = first.empty() ? end : first;
    if (!e.empty() || !in_place || mine == 0 || own == recv) return e;
    const int64_t shift = off[size_t(rank_)];
    if (shift >= mine)  // [shift, shift + mine) and [0, mine) do not overlap
      return gpu_text(gpuMemcpyAsync(recv, own, size_t(mine * es), gpuMemcpyDeviceToDevice, stream_),
                      "gpuMemcpyAsync");
    char* tmp = static_cast<char*>(staging(mine * es, &e));
    if (tmp == nullptr) return e;
    e = gpu_text(gpuMemcpyAsync(tmp, own, size_t(mine * es), gpuMemcpyDeviceToDevice, stream_), "gpuMemcpyAsync");
    if (e.empty())
      e = gpu_text(gpuMemcpyAsync(recv, tmp, size_t(mine * es), gpuMemcpyDeviceToDevice, stream_), "gpuMemcpyAsync");
    return e;
  }

  // Equal counts: ncclAllGather (in place when send is this rank's block of recv). Uneven: one
  // group of ncclBroadcast, one rooted at each rank with a block, each landing at the block's
  // offset of recv on every rank (the root's own block in place when it is already there).
  std::string launch_all_gather(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type) {
    const int64_t es = comm_type_size(type);
    const int64_t mine = counts[size_t(rank_)];  // the equal count
    int64_t largest = 0;
    const bool equal = equal_counts(counts, uneven_always_, &largest);
    if (largest == 0) return "";
    if (equal)
      return nccl_text(ncclAllGather(send, recv, size_t(mine), nccl_type(type), comm(), stream_), "ncclAllGather");
    const std::vector<int64_t> off = block_offsets(counts);
    std::string e = nccl_text(ncclGroupStart(), "ncclGroupStart");
    if (!e.empty()) return e;
    std::string first;
    for (int r = 0; r < size_; ++r) {
      const int64_t c = counts[size_t(r)];
      if (c == 0) continue;
      char* dst = at(recv, off[size_t(r)], es);
      const void* src = r == rank_ ? send : dst;  // only the root's send buffer is read
      const ncclResult_t rc = ncclBroadcast(src, dst, size_t(c), nccl_type(type), r, comm(), stream_);
      if (first.empty()) first = nccl_text(rc, "ncclBroadcast");
    }
    const std::string end = nccl_text(ncclGroupEnd(), "ncclGroupEnd");
    return first.empty() ? end : first;
  }

  // off[r] = the first element of rank r's block; off[size] = the total.
  static std::vector<int64_t> block_offsets(const std::vector<int64_t>& counts) {
    std::vector<int64_t> off(counts.size() + 1, 0);
    for (size_t r = 0; r < counts.size(); ++r) off[r + 1] = off[r] + counts[r];
    return off;
  }

  // The staging buffer, at least `bytes` long; null (and *err) when it cannot be allocated. A
  // buffer it outgrows is kept until the communicator is destroyed: an operation already on the
  // stream may still use it, and freeing memory synchronises the device. Caller holds issue_mutex_.
  void* staging(int64_t bytes, std::string* err) {
    if (bytes <= staging_bytes_) return staging_;
    const int64_t want = (std::max(bytes, 2 * staging_bytes_) + 255) / 256 * 256;
    void* p = nullptr;
    *err = gpu_text(gpuMalloc(&p, size_t(want)), "gpuMalloc (reduce_scatter staging)");
    if (!err->empty()) return nullptr;
    if (staging_) retired_.push_back(staging_);
    staging_ = p;
    staging_bytes_ = want;
    return staging_;
  }

  // ---- argument checks (thrown from the call itself) ----

  static void check_count(const char* op, int64_t count) {
    if (count < 0) fail("comm", std::string(op) + ": negative count " + std::to_string(count));
  }
  void check_buffer(const char* op, const char* which, const void* p, int64_t bytes) const {
    if (bytes <= 0) return;
    if (p == nullptr)
      fail("comm", std::string(op) + ": " + which + " is null but holds " + std::to_string(bytes) + " bytes");
    int device = -1;
    if (!gpu_pointer_on_device(p, &device))
      fail("comm", std::string(op) + ": " + which + " is not device memory",
           "the NCCL communicator works on GPU buffers; host buffers need the MPI or single-process communicator");
    if (device != device_)
      fail("comm", std::string(op) + ": " + which + " is memory of GPU " + std::to_string(device) +
                       " but this communicator runs on GPU " + std::to_string(device_));
  }
  int64_t check_counts(const char* op, const std::vector<int64_t>& counts) const {
    if (counts.size() != size_t(size_))
      fail("comm", std::string(op) + ": counts has " + std::to_string(counts.size()) + " entries, expected " +
                       std::to_string(size_) + " (one per rank)");
    int64_t total = 0;
    for (int64_t c : counts) {
      check_count(op, c);
      total += c;
    }
    return total;
  }
  void check_message(const char* op, const void* buf, int64_t bytes, int64_t count, int peer, int tag) const {
    check_count(op, count);
    if (peer < 0 || peer >= size_ || peer == rank_)
      fail("comm", std::string(op) + ": peer " + std::to_string(peer) + " is not another rank (this is rank " +
                       std::to_string(rank_) + " of " + std::to_string(size_) + ")");
    if (tag < 0) fail("comm", std::string(op) + ": negative tag " + std::to_string(tag));
    check_buffer(op, "buf", buf, bytes);
  }

  const int device_;
  const double timeout_s_;
  const int rank_, size_, local_rank_, local_size_;
  const gpuStream_t producer_;
  const bool uneven_always_;  // tests: the uneven-count paths even for equal counts

  gpuStream_t stream_ = nullptr;  // the communication stream (non-blocking)
  gpuEvent_t fence_ = nullptr;    // recorded on the producer stream before each launch
  void* scratch_ = nullptr;       // the barrier's int32
  std::atomic<ncclComm_t> comm_{nullptr};
  NcclArrivals arrivals_;  // the arrival channel (its messages; why it is off)
  NcclWatchdog watchdog_;  // the watchdog thread, its list and the failure state (reads comm_, arrivals_)

  std::timed_mutex issue_mutex_;  // guards everything below; the watchdog takes it before aborting
  bool closed_ = false;
  int64_t collectives_ = 0, messages_ = 0;
  std::vector<OpPtr> queued_;  // sends and receives waiting for the next flush
  void* staging_ = nullptr;
  int64_t staging_bytes_ = 0;
  std::vector<void*> retired_;  // outgrown staging buffers
};

void NcclRequest::block() {
  if (op_->state.load(std::memory_order_acquire) == kQueued) comm_->flush();
  for (int polls = 0; !op_done(*op_); ++polls) {
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      const int shift = std::min((polls - 64) / 16, 5);  // 20 us doubling every 16 polls, up to 640 us
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(20 << shift, 500)));
    }
  }
}

bool NcclRequest::test() {
  if (op_->state.load(std::memory_order_acquire) == kQueued) comm_->flush();
  if (!op_done(*op_)) return false;
  check();
  return true;
}

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device, const CommOptions& options, void* producer_stream,
                                     bool uneven_paths_always) {
  return std::make_unique<NcclComm>(bootstrap, nccl_device_for(device), apply_comm_env(options), producer_stream,
                                    uneven_paths_always);
}

}  // namespace zaya
