// Posting and polling one MPI communicator operation, the arrival protocol, and operation
// descriptions for the watchdog (see mpi_op.h).
#include "dist/mpi_op.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "dist/mpi_runtime.h"

namespace zaya {
namespace {

constexpr int kArrivalTag = 1;
constexpr int kArrivalInts = sizeof(ArrivalMsg) / sizeof(int64_t);

MPI_Datatype mpi_type(CommType t) {
  switch (t) {
    case CommType::F32: return MPI_FLOAT;
    case CommType::F64: return MPI_DOUBLE;
    case CommType::I32: return MPI_INT32_T;
    case CommType::I64: return MPI_INT64_T;
    case CommType::U8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_reduce(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

int64_t detail_of(const MpiOp& op) {
  if (op.kind == MpiOpKind::AllReduce || op.kind == MpiOpKind::ReduceScatter) return static_cast<int64_t>(op.reduce);
  if (op.kind == MpiOpKind::Broadcast) return op.root;
  return 0;
}

void record(MpiOp& op, const char* call, int rc) {
  if (rc != MPI_SUCCESS && op.error.empty()) op.error = std::string(call) + " failed: " + mpi_error_text(rc);
}

char* at(const void* base, int64_t elements, int64_t element_size) {
  return static_cast<char*>(const_cast<void*>(base)) + elements * element_size;
}

void post_arrivals(MpiOp& op, const MpiContext& ctx) {
  op.arrival_out = ArrivalMsg{op.seq, static_cast<int64_t>(op.kind), static_cast<int64_t>(op.type), detail_of(op),
                              op.bytes()};
  op.arrival_in.assign(static_cast<size_t>(ctx.size), ArrivalMsg{});
  op.heard.assign(static_cast<size_t>(ctx.size), 0);
  op.heard[static_cast<size_t>(ctx.rank)] = 1;
  for (int p = 0; p < ctx.size; ++p) {
    if (p == ctx.rank) continue;
    MPI_Request q = MPI_REQUEST_NULL;
    int rc = MPI_Irecv(&op.arrival_in[static_cast<size_t>(p)], kArrivalInts, MPI_INT64_T, p, kArrivalTag,
                       ctx.arrival, &q);
    record(op, "MPI_Irecv (arrival)", rc);
    if (rc != MPI_SUCCESS) continue;
    op.arrival_recvs.push_back(q);
    op.arrival_from.push_back(p);
  }
  for (int p = 0; p < ctx.size; ++p) {
    if (p == ctx.rank) continue;
    MPI_Request q = MPI_REQUEST_NULL;
    int rc = MPI_Isend(&op.arrival_out, kArrivalInts, MPI_INT64_T, p, kArrivalTag, ctx.arrival, &q);
    record(op, "MPI_Isend (arrival)", rc);
    if (rc == MPI_SUCCESS) op.arrival_sends.push_back(q);
  }
}

// A peer reached a different collective at the same position: a program bug, reported and fatal.
void check_arrival(const MpiOp& op, const MpiContext& ctx, int peer) {
  const ArrivalMsg& in = op.arrival_in[static_cast<size_t>(peer)];
  const ArrivalMsg& out = op.arrival_out;
  if (in.seq == out.seq && in.kind == out.kind && in.type == out.type && in.detail == out.detail &&
      in.bytes == out.bytes)
    return;
  std::string theirs = "an unknown operation";
  if (in.kind >= 0 && in.kind <= static_cast<int64_t>(MpiOpKind::Recv) && in.type >= 0 &&
      in.type <= static_cast<int64_t>(CommType::U8))
    theirs = describe_comm_op(static_cast<MpiOpKind>(in.kind), in.seq, in.bytes, static_cast<CommType>(in.type),
                            in.detail, -1, 0);
  std::string line = "zaya: comm: collective mismatch on rank " + std::to_string(ctx.rank) + " of " +
                     std::to_string(ctx.size) + ": this rank issued " + op.describe() + " but rank " +
                     std::to_string(peer) + " issued " + theirs +
                     " at the same position; every rank must issue the same collectives in the same order";
  mpi_fatal_line(line, kCommMismatchExitCode);
}

// Tests each outstanding request of list; returns whether any completed.
bool test_all(MpiOp& op, std::vector<MPI_Request>& list, const char* what) {
  bool progress = false;
  for (MPI_Request& q : list) {
    if (q == MPI_REQUEST_NULL) continue;
    int flag = 0;
    int rc = MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      record(op, what, rc);
      q = MPI_REQUEST_NULL;
      flag = 1;
    }
    if (flag) progress = true;
  }
  return progress;
}

// Tests the chunks of a recv and checks each received as many elements as it expected.
bool test_recvs(MpiOp& op) {
  bool progress = false;
  for (size_t i = 0; i < op.data.size(); ++i) {
    MPI_Request& q = op.data[i];
    if (q == MPI_REQUEST_NULL) continue;
    int flag = 0;
    MPI_Status status;
    int rc = MPI_Test(&q, &flag, &status);
    if (rc != MPI_SUCCESS) {
      record(op, "MPI_Test", rc);
      q = MPI_REQUEST_NULL;
      progress = true;
      continue;
    }
    if (!flag) continue;
    progress = true;
    int got = 0;
    MPI_Get_count(&status, mpi_type(op.type), &got);
    if (got != op.data_counts[i] && op.error.empty())
      op.error = "received " + std::to_string(got) + " elements where " + std::to_string(op.data_counts[i]) +
                 " were expected (the sender's count differs)";
  }
  return progress;
}

bool outstanding(const std::vector<MPI_Request>& list) {
  return std::any_of(list.begin(), list.end(), [](MPI_Request q) { return q != MPI_REQUEST_NULL; });
}

}  // namespace

void mpi_fatal_line(const std::string& line, int code) {
  // Never block here: another thread may hold stdout (and stay blocked writing to a full pipe).
  if (ftrylockfile(stdout) == 0) {
    fflush_unlocked(stdout);
    funlockfile(stdout);
  }
  std::string text = line + "\n";
  ssize_t written = ::write(2, text.data(), text.size());
  (void)written;
  std::_Exit(code);
}


int64_t MpiOp::bytes() const {
  int64_t elements = count;
  if (kind == MpiOpKind::ReduceScatter || kind == MpiOpKind::AllGather) {
    elements = 0;
    for (int64_t c : counts) elements += c;
  }
  if (kind == MpiOpKind::Barrier) elements = 0;
  return elements * comm_type_size(type);
}

std::string MpiOp::describe() const { return describe_comm_op(kind, seq, bytes(), type, detail_of(*this), peer, tag); }

void MpiOp::set_spans(int rank) {
  const int64_t es = comm_type_size(type);
  auto add = [&](const void* p, int64_t elements, bool write) {
    if (p == nullptr || elements <= 0) return;
    const char* b = static_cast<const char*>(p);
    spans.push_back(Span{b, b + elements * es, write});
  };
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const int64_t mine = counts.empty() ? 0 : counts[static_cast<size_t>(rank)];
  switch (kind) {
    case MpiOpKind::AllReduce: add(send, count, false), add(recv, count, true); break;
    case MpiOpKind::ReduceScatter: add(send, total, false), add(recv, mine, true); break;
    case MpiOpKind::AllGather: add(send, mine, false), add(recv, total, true); break;
    case MpiOpKind::Broadcast: add(recv, count, rank != root); break;
    case MpiOpKind::Barrier: break;
    case MpiOpKind::Send: add(send, count, false); break;
    case MpiOpKind::Recv: add(recv, count, true); break;
  }
}

bool mpi_ops_conflict(const MpiOp& a, const MpiOp& b) {
  for (const MpiOp::Span& x : a.spans)
    for (const MpiOp::Span& y : b.spans)
      if ((x.write || y.write) && x.begin < y.end && y.begin < x.end) return true;
  return false;
}

void mpi_op_start(MpiOp& op, const MpiContext& ctx) {
  op.started = true;
  if (op.collective() && ctx.arrivals && ctx.size > 1) post_arrivals(op, ctx);
  const int64_t es = comm_type_size(op.type);
  const MPI_Datatype dt = mpi_type(op.type);
  const int64_t chunk = ctx.max_chunk;
  int64_t n = 0;  // elements of the request being posted
  auto post = [&](const char* call, int rc, MPI_Request q) {
    record(op, call, rc);
    if (rc != MPI_SUCCESS) return false;
    op.data.push_back(q);
    op.data_counts.push_back(static_cast<int>(n));
    return true;
  };
  MPI_Request q = MPI_REQUEST_NULL;
  switch (op.kind) {
    case MpiOpKind::AllReduce:
      for (int64_t off = 0;;) {
        n = std::min(chunk, op.count - off);
        const void* s = op.send == op.recv ? MPI_IN_PLACE : at(op.send, off, es);
        int rc = MPI_Iallreduce(s, at(op.recv, off, es), static_cast<int>(n), dt, mpi_reduce(op.reduce), ctx.data, &q);
        if (!post("MPI_Iallreduce", rc, q)) break;
        off += n;
        if (off >= op.count) break;
      }
      break;
    case MpiOpKind::Broadcast:
      for (int64_t off = 0;;) {
        n = std::min(chunk, op.count - off);
        int rc = MPI_Ibcast(at(op.recv, off, es), static_cast<int>(n), dt, op.root, ctx.data, &q);
        if (!post("MPI_Ibcast", rc, q)) break;
        off += n;
        if (off >= op.count) break;
      }
      break;
    case MpiOpKind::Send:
    case MpiOpKind::Recv:
      for (int64_t off = 0;;) {
        n = std::min(chunk, op.count - off);
        int rc = op.kind == MpiOpKind::Send
                     ? MPI_Isend(at(op.send, off, es), static_cast<int>(n), dt, op.peer, op.tag, ctx.data, &q)
                     : MPI_Irecv(at(op.recv, off, es), static_cast<int>(n), dt, op.peer, op.tag, ctx.data, &q);
        if (!post(op.kind == MpiOpKind::Send ? "MPI_Isend" : "MPI_Irecv", rc, q)) break;
        off += n;
        if (off >= op.count) break;
      }
      break;
    case MpiOpKind::ReduceScatter: {
      op.counts_int.assign(op.counts.begin(), op.counts.end());
      const void* s = op.send == op.recv ? MPI_IN_PLACE : op.send;
      int rc = MPI_Ireduce_scatter(s, op.recv, op.counts_int.data(), dt, mpi_reduce(op.reduce), ctx.data, &q);
      post("MPI_Ireduce_scatter", rc, q);
      break;
    }
    case MpiOpKind::AllGather: {
      op.counts_int.assign(op.counts.begin(), op.counts.end());
      op.displs_int.assign(op.counts.size(), 0);
      for (size_t r = 1; r < op.counts.size(); ++r) op.displs_int[r] = op.displs_int[r - 1] + op.counts_int[r - 1];
      const int mine = op.counts_int[static_cast<size_t>(ctx.rank)];
      const void* own = at(op.recv, op.displs_int[static_cast<size_t>(ctx.rank)], es);
      const void* s = op.send == own ? MPI_IN_PLACE : op.send;
      int rc = MPI_Iallgatherv(s, mine, dt, op.recv, op.counts_int.data(), op.displs_int.data(), dt, ctx.data, &q);
      post("MPI_Iallgatherv", rc, q);
      break;
    }
    case MpiOpKind::Barrier: {
      int rc = MPI_Ibarrier(ctx.data, &q);
      post("MPI_Ibarrier", rc, q);
      break;
    }
  }
}

bool mpi_op_poll(MpiOp& op, const MpiContext& ctx, bool* finished) {
  bool progress = false;
  for (size_t i = 0; i < op.arrival_recvs.size(); ++i) {
    MPI_Request& q = op.arrival_recvs[i];
    if (q == MPI_REQUEST_NULL) continue;
    int flag = 0;
    int rc = MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      record(op, "MPI_Test (arrival)", rc);
      q = MPI_REQUEST_NULL;
      progress = true;
      continue;
    }
    if (!flag) continue;
    progress = true;
    check_arrival(op, ctx, op.arrival_from[i]);
    op.heard[static_cast<size_t>(op.arrival_from[i])] = 1;
  }
  progress |= test_all(op, op.arrival_sends, "MPI_Test (arrival send)");
  progress |= op.kind == MpiOpKind::Recv ? test_recvs(op) : test_all(op, op.data, "MPI_Test");
  *finished = !outstanding(op.data) && !outstanding(op.arrival_sends) && !outstanding(op.arrival_recvs);
  return progress;
}

std::string mpi_op_silent_peers(const MpiOp& op, const MpiContext& ctx) {
  if (!op.started) return "unknown (not started: it waits for an earlier operation on the same memory)";
  if (!op.collective()) return std::to_string(op.peer);
  if (!ctx.arrivals) return "unknown (arrival tracking is off: some rank runs with the watchdog disabled)";
  std::string list;
  for (size_t i = 0; i < op.arrival_from.size(); ++i) {
    int p = op.arrival_from[i];
    if (op.heard[static_cast<size_t>(p)]) continue;
    if (!list.empty()) list += ", ";
    list += std::to_string(p);
  }
  if (list.empty()) return "none (every peer has reached this operation; it is stuck inside MPI)";
  return list;
}

}  // namespace zaya
