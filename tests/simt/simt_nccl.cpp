// The emulated NCCL (simt_nccl.h): each communicator holds zaya's MPI communicator over
// MPI_COMM_WORLD (none for one rank); a call becomes one or two operations on it, issued at once
// or, between ncclGroupStart and ncclGroupEnd, together at the end, and waited for before the
// call (or ncclGroupEnd) returns.
#include "simt_nccl.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/comm_mpi.h"

struct ncclComm {
  int rank = 0, size = 1;
  std::unique_ptr<zaya::Comm> host;  // null for one rank
  std::atomic<long> calls{0};        // data calls so far (for the async-error hook)
  long fail_async_after = 0;         // 0: never
  std::atomic<bool> async_failed{false};
  std::mutex detail_mutex;
  std::string detail;  // the last error's explanation (ncclGetLastError)
};

namespace {

constexpr char kIdMagic[] = "zaya-simt-nccl";
std::atomic<long> g_fail_async_after{-1};  // -1: read the environment once

struct Range {
  const void* p;
  size_t bytes;
};

// One deferred call: issue() starts its operations on the host communicator (or does the whole
// call for one rank) and returns their handles; finish() runs once they are complete.
struct Pending {
  ncclComm_t comm;
  std::function<std::vector<zaya::CommHandle>()> issue;
  std::function<void()> finish;
  std::vector<Range> reads, writes;  // device memory the call reads and writes
  const char* name = "";
};

thread_local int t_group_depth = 0;
thread_local std::vector<Pending> t_group;
thread_local std::string t_last_error;  // for ncclGetLastError(nullptr) and calls without a comm

ncclResult_t invalid(ncclComm_t comm, ncclResult_t rc, const std::string& why) {
  if (comm != nullptr) {
    std::lock_guard<std::mutex> g(comm->detail_mutex);
    comm->detail = why;
  }
  t_last_error = why;
  return rc;
}

bool comm_type(ncclDataType_t t, zaya::CommType* out) {
  switch (t) {
    case ncclUint8: *out = zaya::CommType::U8; return true;
    case ncclInt32: *out = zaya::CommType::I32; return true;
    case ncclInt64: *out = zaya::CommType::I64; return true;
    case ncclFloat32: *out = zaya::CommType::F32; return true;
    case ncclFloat64: *out = zaya::CommType::F64; return true;
    default: return false;
  }
}

// Bytes per element of the emulated types (others are refused by check_call).
size_t element_bytes(ncclDataType_t t) {
  if (t == ncclFloat64 || t == ncclInt64 || t == ncclUint64) return 8;
  if (t == ncclUint8 || t == ncclInt8) return 1;
  return t == ncclFloat16 ? 2 : 4;
}

bool reduce_op(ncclRedOp_t op, zaya::ReduceOp* out) {
  switch (op) {
    case ncclSum: *out = zaya::ReduceOp::Sum; return true;
    case ncclMax: *out = zaya::ReduceOp::Max; return true;
    case ncclMin: *out = zaya::ReduceOp::Min; return true;
    default: return false;
  }
}

// The checks every data call makes: a live communicator, a type the emulation knows, and
// buffers that lie in emulated device memory over their whole extent.
ncclResult_t check_call(ncclComm_t comm, const char* call, ncclDataType_t type, zaya::CommType* ct,
                        std::initializer_list<std::pair<const void*, size_t>> buffers) {
  if (comm == nullptr) return invalid(nullptr, ncclInvalidArgument, std::string(call) + ": null communicator");
  if (!comm_type(type, ct))
    return invalid(comm, ncclInvalidArgument,
                   std::string(call) + ": data type " + std::to_string(int(type)) + " is not emulated");
  for (const auto& [p, bytes] : buffers)
    if (bytes > 0 && !zaya::simt::range_on_device(p, bytes))
      return invalid(comm, ncclInvalidArgument,
                     std::string(call) + ": a buffer of " + std::to_string(bytes) +
                         " bytes is not inside one emulated device allocation");
  return ncclSuccess;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

// NCCL runs the calls of one group concurrently, so two of them touching the same memory, one
// writing it, have no defined result there; the emulation, whose MPI communicator would run
// them in issue order, refuses them instead. "" or what conflicts.
std::string group_conflict(const std::vector<Pending>& calls) {
  for (size_t i = 0; i < calls.size(); ++i)
    for (size_t j = 0; j < calls.size(); ++j) {
      if (i == j) continue;
      for (const Range& w : calls[i].writes) {
        for (const Range& r : calls[j].reads)
          if (overlaps(w.p, w.bytes, r.p, r.bytes))
            return std::string(calls[i].name) + " (call " + std::to_string(i + 1) + " of the group) writes memory that " +
                   calls[j].name + " (call " + std::to_string(j + 1) + ") reads";
        for (const Range& r : calls[j].writes)
          if (j > i && overlaps(w.p, w.bytes, r.p, r.bytes))
            return std::string(calls[i].name) + " (call " + std::to_string(i + 1) + " of the group) and " +
                   calls[j].name + " (call " + std::to_string(j + 1) + ") write the same memory";
      }
    }
  return "";
}

// Runs the calls: issues every one's operations, waits for all of them, then finishes each.
ncclResult_t run(std::vector<Pending>& calls) {
  if (calls.size() > 1) {
    if (const std::string conflict = group_conflict(calls); !conflict.empty()) {
      ncclComm_t comm = calls.front().comm;
      calls.clear();
      return invalid(comm, ncclInvalidUsage, "ncclGroupEnd: " + conflict + " (undefined in NCCL, which runs a group's calls concurrently)");
    }
  }
  ncclResult_t rc = ncclSuccess;
  std::vector<zaya::CommHandle> handles;
  ncclComm_t failed = nullptr;
  std::string why;
  try {
    for (Pending& p : calls) {
      ++p.comm->calls;
      for (zaya::CommHandle& h : p.issue()) handles.push_back(std::move(h));
    }
    for (zaya::CommHandle& h : handles) h->wait();
    for (Pending& p : calls)
      if (p.finish) p.finish();
  } catch (const std::exception& e) {
    failed = calls.empty() ? nullptr : calls.front().comm;
    why = e.what();
    rc = ncclSystemError;
  }
  handles.clear();  // waits for whatever an exception left in flight
  calls.clear();
  if (rc != ncclSuccess) return invalid(failed, rc, "emulated NCCL over MPI: " + why);
  return rc;
}

// Issues a call now, or at ncclGroupEnd when inside a group.
ncclResult_t submit(Pending p) {
  if (t_group_depth > 0) {
    t_group.push_back(std::move(p));
    return ncclSuccess;
  }
  std::vector<Pending> one;
  one.push_back(std::move(p));
  return run(one);
}

std::vector<zaya::CommHandle> handles_of(zaya::CommHandle h) {
  std::vector<zaya::CommHandle> v;
  v.push_back(std::move(h));
  return v;
}

}  // namespace

namespace zaya::simt {
void nccl_fail_async_after(long after) { g_fail_async_after.store(after < 0 ? 0 : after); }
}  // namespace zaya::simt

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated NCCL)";
    case ncclSystemError: return "unhandled system error (emulated NCCL)";
    case ncclInternalError: return "internal error (emulated NCCL)";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
    case ncclRemoteError: return "remote process exited or there was a network error (emulated NCCL)";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code (emulated NCCL)";
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr) {
    std::lock_guard<std::mutex> g(comm->detail_mutex);
    t_last_error = comm->detail;
  }
  return t_last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return invalid(nullptr, ncclInvalidArgument, "ncclGetUniqueId: null id");
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, kIdMagic, sizeof(kIdMagic));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (out == nullptr) return invalid(nullptr, ncclInvalidArgument, "ncclCommInitRank: null communicator pointer");
  *out = nullptr;
  if (std::memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0)
    return invalid(nullptr, ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return invalid(nullptr, ncclInvalidArgument,
                   "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  auto comm = std::make_unique<ncclComm>();
  comm->rank = rank;
  comm->size = nranks;
  if (g_fail_async_after.load() < 0) {
    const char* env = std::getenv("ZAYA_SIMT_NCCL_ASYNC_ERROR_AFTER");
    long expected = -1;
    g_fail_async_after.compare_exchange_strong(expected, env != nullptr ? std::atol(env) : 0);
  }
  comm->fail_async_after = g_fail_async_after.load();
  if (nranks > 1) {
    if (!zaya::launched_by_mpi())
      return invalid(nullptr, ncclInvalidUsage, "ncclCommInitRank: several ranks need mpirun (emulated NCCL runs over MPI)");
    try {
      zaya::CommOptions options;
      options.timeout_s = 0;  // NCCL has no deadline of its own: the communicator's watchdog is the one
      comm->host = zaya::make_mpi_comm(options);
    } catch (const std::exception& e) {
      return invalid(nullptr, ncclSystemError, std::string("ncclCommInitRank: ") + e.what());
    }
    if (comm->host->size() != nranks || comm->host->rank() != rank)
      return invalid(nullptr, ncclInvalidUsage,
                     "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                         " is not MPI_COMM_WORLD's rank " + std::to_string(comm->host->rank()) + " of " +
                         std::to_string(comm->host->size()) + " (the emulation needs them equal)");
  }
  *out = comm.release();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;  // the host communicator drains its operations first
  return ncclSuccess;
}

// The communicator stays allocated (another thread may still be inside a call on it, blocked in
// MPI); its MPI communicator is abandoned: the process is expected to exit.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm->async_failed.store(true);
  if (comm->size == 1) delete comm;  // one rank never blocks: nothing else can hold it
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr)
    return invalid(comm, ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  const bool failed = comm->async_failed.load() ||
                      (comm->fail_async_after > 0 && comm->calls.load() >= comm->fail_async_after);
  if (failed) {
    std::lock_guard<std::mutex> g(comm->detail_mutex);
    if (comm->detail.empty()) comm->detail = "the test hook nccl_fail_async_after failed this communicator";
  }
  *async_error = failed ? ncclRemoteError : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return invalid(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Pending> calls;
  calls.swap(t_group);
  return run(calls);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, gpuStream_t) {
  zaya::CommType ct{};
  zaya::ReduceOp ro{};
  const size_t bytes = count * element_bytes(type);
  if (ncclResult_t rc = check_call(comm, "ncclAllReduce", type, &ct, {{send, bytes}, {recv, bytes}}); rc != ncclSuccess)
    return rc;
  if (!reduce_op(op, &ro)) return invalid(comm, ncclInvalidArgument, "ncclAllReduce: reduction not emulated");
  if (send != recv && overlaps(send, bytes, recv, bytes))
    return invalid(comm, ncclInvalidArgument, "ncclAllReduce: send and recv overlap without being equal");
  return submit({comm,
                 [=]() -> std::vector<zaya::CommHandle> {
                   if (comm->host) return handles_of(comm->host->all_reduce(send, recv, int64_t(count), ct, ro));
                   if (send != recv) std::memcpy(recv, send, bytes);
                   return {};
                 },
                 nullptr,
                 {{send, bytes}},
                 {{recv, bytes}},
                 "ncclAllReduce"});
}

// The root's result through a host temporary: every rank takes part in an all-reduce, and only
// the root keeps the result (NCCL moves less; the result is the same).
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, gpuStream_t) {
  zaya::CommType ct{};
  zaya::ReduceOp ro{};
  const size_t es = element_bytes(type);
  const bool is_root = comm != nullptr && comm->rank == root;
  if (ncclResult_t rc = check_call(comm, "ncclReduce", type, &ct, {{send, count * es}, {is_root ? recv : nullptr, is_root ? count * es : 0}});
      rc != ncclSuccess)
    return rc;
  if (!reduce_op(op, &ro)) return invalid(comm, ncclInvalidArgument, "ncclReduce: reduction not emulated");
  if (root < 0 || root >= comm->size) return invalid(comm, ncclInvalidArgument, "ncclReduce: root is not a rank");
  auto result = std::make_shared<std::vector<char>>(count * es);
  return submit({comm,
                 [=]() -> std::vector<zaya::CommHandle> {
                   if (comm->host) return handles_of(comm->host->all_reduce(send, result->data(), int64_t(count), ct, ro));
                   std::memcpy(result->data(), send, count * es);
                   return {};
                 },
                 [=]() {
                   if (is_root && count > 0) std::memcpy(recv, result->data(), count * es);
                 },
                 {{send, count * es}},
                 {{recv, is_root ? count * es : 0}},
                 "ncclReduce"});
}

// In place (recv at this rank's block of send) through a host temporary: zaya's reduce_scatter
// takes no such overlap.
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, gpuStream_t) {
  zaya::CommType ct{};
  zaya::ReduceOp ro{};
  const size_t es = element_bytes(type);
  const size_t ranks = comm != nullptr ? size_t(comm->size) : 1;
  if (ncclResult_t rc = check_call(comm, "ncclReduceScatter", type, &ct, {{send, recvcount * ranks * es}, {recv, recvcount * es}});
      rc != ncclSuccess)
    return rc;
  if (!reduce_op(op, &ro)) return invalid(comm, ncclInvalidArgument, "ncclReduceScatter: reduction not emulated");
  const char* in_place_at = static_cast<const char*>(send) + size_t(comm->rank) * recvcount * es;
  if (overlaps(send, recvcount * ranks * es, recv, recvcount * es) && recv != in_place_at)
    return invalid(comm, ncclInvalidArgument, "ncclReduceScatter: recv overlaps send but is not this rank's block");
  auto result = std::make_shared<std::vector<char>>(recvcount * es);
  return submit({comm,
                 [=]() -> std::vector<zaya::CommHandle> {
                   if (comm->host)
                     return handles_of(comm->host->reduce_scatter(
                         send, result->data(), std::vector<int64_t>(ranks, int64_t(recvcount)), ct, ro));
                   std::memcpy(result->data(), in_place_at, recvcount * es);
                   return {};
                 },
                 [=]() {
                   if (recvcount > 0) std::memcpy(recv, result->data(), recvcount * es);
                 },
                 {{send, recvcount * ranks * es}},
                 {{recv, recvcount * es}},
                 "ncclReduceScatter"});
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           gpuStream_t) {
  zaya::CommType ct{};
  const size_t es = element_bytes(type);
  const size_t ranks = comm != nullptr ? size_t(comm->size) : 1;
  if (ncclResult_t rc = check_call(comm, "ncclAllGather", type, &ct, {{send, sendcount * es}, {recv, sendcount * ranks * es}});
      rc != ncclSuccess)
    return rc;
  char* own = static_cast<char*>(recv) + size_t(comm->rank) * sendcount * es;
  if (overlaps(send, sendcount * es, recv, sendcount * ranks * es) && send != own)
    return invalid(comm, ncclInvalidArgument, "ncclAllGather: send overlaps recv but is not this rank's block");
  return submit({comm,
                 [=]() -> std::vector<zaya::CommHandle> {
                   if (comm->host)
                     return handles_of(comm->host->all_gather(send, recv, std::vector<int64_t>(ranks, int64_t(sendcount)), ct));
                   if (send != own) std::memcpy(own, send, sendcount * es);
                   return {};
                 },
                 nullptr,
                 {{send, sendcount * es}},
                 {{recv, sendcount * ranks * es}},
                 "ncclAllGather"});
}

// Only the root reads sendbuff; every rank's recvbuff receives the root's data.
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           gpuStream_t) {
  zaya::CommType ct{};
  const size_t es = element_bytes(type);
  const bool is_root = comm != nullptr && comm->rank == root;
  if (ncclResult_t rc = check_call(comm, "ncclBroadcast", type, &ct, {{is_root ? send : nullptr, is_root ? count * es : 0}, {recv, count * es}});
      rc != ncclSuccess)
    return rc;
  if (root < 0 || root >= comm->size) return invalid(comm, ncclInvalidArgument, "ncclBroadcast: root is not a rank");
  if (is_root && send != recv && overlaps(send, count * es, recv, count * es))
    return invalid(comm, ncclInvalidArgument, "ncclBroadcast: send and recv overlap without being equal");
  return submit({comm,
                 [=]() -> std::vector<zaya::CommHandle> {
                   if (is_root && send != recv && count > 0) std::memcpy(recv, send, count * es);
                   if (comm->host) return handles_of(comm->host->broadcast(recv, int64_t(count), ct, root));
                   return {};
                 },
                 nullptr,
                 {{send, is_root ? count * es : 0}},
                 {{recv, count * es}},
                 "ncclBroadcast"});
}

// Messages go with tag 0: MPI matches messages between two ranks in issue order, as NCCL does.
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, gpuStream_t) {
  zaya::CommType ct{};
  const size_t es = element_bytes(type);
  if (ncclResult_t rc = check_call(comm, "ncclSend", type, &ct, {{send, count * es}}); rc != ncclSuccess) return rc;
  if (peer < 0 || peer >= comm->size || !comm->host)
    return invalid(comm, ncclInvalidArgument, "ncclSend: peer " + std::to_string(peer) + " is not another rank");
  return submit({comm, [=]() { return handles_of(comm->host->send(send, int64_t(count), ct, peer, 0)); }, nullptr,
                 {{send, count * es}}, {}, "ncclSend"});
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, gpuStream_t) {
  zaya::CommType ct{};
  const size_t es = element_bytes(type);
  if (ncclResult_t rc = check_call(comm, "ncclRecv", type, &ct, {{recv, count * es}}); rc != ncclSuccess) return rc;
  if (peer < 0 || peer >= comm->size || !comm->host)
    return invalid(comm, ncclInvalidArgument, "ncclRecv: peer " + std::to_string(peer) + " is not another rank");
  return submit({comm, [=]() { return handles_of(comm->host->recv(recv, int64_t(count), ct, peer, 0)); }, nullptr,
                 {}, {{recv, count * es}}, "ncclRecv"});
}
