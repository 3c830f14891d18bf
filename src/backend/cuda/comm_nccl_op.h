// The NCCL communicator's pieces below the communicator itself (comm_nccl.cu): the NCCL names
// of our types and reductions, the record of one operation (NcclOp: what it is, its state, its
// event, its arrival messages) and when it is done, error texts, and the device guard. Shared by
// the communicator, its arrival channel (comm_nccl_arrival.h) and its watchdog
// (comm_nccl_watchdog.h); included by comm_nccl*.cu only (they need NCCL or RCCL).
#pragma once
#ifndef ZAYA_GPU_WANT_COLLECTIVES
#define ZAYA_GPU_WANT_COLLECTIVES 1
#endif
#include "backend/cuda/gpu_runtime.h"

#if !defined(ZAYA_GPU_COLLECTIVES)
#error "comm_nccl_op.h needs NCCL (CUDA) or RCCL (HIP with ZAYA_HAVE_RCCL)"
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/comm_op.h"

namespace zaya::nccl_detail {

using Clock = std::chrono::steady_clock;

using OpKind = CommOpKind;

inline ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::F32: return ncclFloat32;
    case CommType::F64: return ncclFloat64;
    case CommType::I32: return ncclInt32;
    case CommType::I64: return ncclInt64;
    case CommType::U8: return ncclUint8;
  }
  fail("comm", "unknown CommType " + std::to_string(static_cast<int>(t)));
}

inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  fail("comm", "unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

// "all_reduce #17 (4096 bytes, f32 sum)", the MPI communicator's wording; NCCL messages have no
// tag, so `detail` stands in for it.
inline std::string describe_parts(OpKind kind, int64_t seq, int64_t bytes, CommType type, int64_t detail, int peer) {
  return describe_comm_op(kind, seq, bytes, type, detail, peer, detail);
}

// What a rank tells a peer when it reaches an operation (on the arrival channel, 5 x int64).
struct Arrival {
  int64_t seq = -1;
  int64_t kind = -1;    // OpKind
  int64_t type = -1;    // CommType
  int64_t detail = -1;  // ReduceOp, broadcast root, or message tag
  int64_t bytes = -1;
};
static_assert(sizeof(Arrival) == 5 * sizeof(int64_t), "Arrival is sent as 5 int64");

enum OpState : int {
  kQueued,     // a send/recv waiting for the next flush
  kLaunching,  // being launched (may block on the host inside NCCL)
  kLaunched,   // on the stream; its event tells when it is done
  kDone,       // complete (or failed: error is set)
};

struct NcclOp {
  // Set by the issuing thread before the operation is published; read-only afterwards.
  OpKind kind = OpKind::Barrier;
  CommType type = CommType::U8;
  int64_t seq = 0;     // collective number, or message number, on this communicator
  int64_t detail = 0;  // ReduceOp, root or tag
  int peer = -1;
  int64_t bytes = 0;
  const void* send = nullptr;  // sends and receives: launched at the next flush
  void* recv = nullptr;
  int64_t count = 0;
  Clock::time_point issued;
  gpuEvent_t event = nullptr;  // recorded on the communication stream after the operation

  std::atomic<int> state{kQueued};
  std::mutex m;
  std::string error;  // guarded by m; set before state becomes kDone

  // Arrival channel: filled in before publication, then touched by the watchdog thread only.
  Arrival out;
  std::vector<Arrival> in;          // one per posted receive (stable storage: sized before posting)
  std::vector<int> in_from;         // rank of in[i]
  std::vector<CommHandle> in_handles, out_handles;  // reset when complete
  std::vector<char> heard;          // by rank
  std::string arrival_error;

  NcclOp() = default;
  NcclOp(const NcclOp&) = delete;
  NcclOp& operator=(const NcclOp&) = delete;
  ~NcclOp() {
    if (event) (void)gpuEventDestroy(event);
  }

  bool collective() const { return kind != OpKind::Send && kind != OpKind::Recv; }
  std::string describe() const { return describe_parts(kind, seq, bytes, type, detail, peer); }
  void set_error(const std::string& e) {
    std::lock_guard<std::mutex> g(m);
    if (error.empty()) error = e;
  }
  std::string get_error() {
    std::lock_guard<std::mutex> g(m);
    return error;
  }
};
using OpPtr = std::shared_ptr<NcclOp>;

// Whether op is complete; asks its event when it is on the stream. Any thread may call it.
inline bool op_done(NcclOp& op) {
  const int s = op.state.load(std::memory_order_acquire);
  if (s == kDone) return true;
  if (s != kLaunched) return false;
  const gpuError_t e = gpuEventQuery(op.event);
  if (e == gpuErrorNotReady) {
    (void)gpuGetLastError();  // HIP keeps "not ready" as the last error, which a launch check would report
    return false;
  }
  if (e != gpuSuccess) {
    (void)gpuGetLastError();
    op.set_error(std::string("the GPU reported an error: ") + gpuGetErrorString(e));
  }
  op.state.store(kDone, std::memory_order_release);
  return true;
}

inline std::string nccl_text(ncclResult_t rc, const char* call) {
  if (rc == ncclSuccess) return "";
  return std::string(call) + " failed: " + ncclGetErrorString(rc);
}

inline std::string gpu_text(gpuError_t e, const char* call) {
  if (e == gpuSuccess) return "";
  (void)gpuGetLastError();
  return std::string(call) + " failed: " + gpuGetErrorString(e);
}

inline char* at(const void* base, int64_t elements, int64_t element_size) {
  return static_cast<char*>(const_cast<void*>(base)) + elements * element_size;
}

// Makes `device` current for the calling thread, and restores the previous one. Errors are
// cleared, not kept: a stale error would surface at the backend's next launch check.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (gpuGetDevice(&prev_) != gpuSuccess) {
      (void)gpuGetLastError();
      prev_ = -1;
    }
    if (prev_ != device_ && gpuSetDevice(device_) != gpuSuccess) (void)gpuGetLastError();
  }
  ~DeviceGuard() {
    if (prev_ >= 0 && prev_ != device_ && gpuSetDevice(prev_) != gpuSuccess) (void)gpuGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_, prev_ = -1;
};

// Equal counts for every rank (and not forced onto the uneven path): NCCL's own collective.
// Sets *largest to the largest count.
inline bool equal_counts(const std::vector<int64_t>& counts, bool uneven_always, int64_t* largest) {
  *largest = *std::max_element(counts.begin(), counts.end());
  const int64_t l = *largest;
  return !uneven_always && std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == l; });
}

}  // namespace zaya::nccl_detail
