// Internal: one operation of the MPI communicator, from the call that issues it to completion.
// The issuing thread fills in what to do and queues it; the communication thread posts it
// (mpi_op_start: non-blocking MPI calls, split into chunks where counts exceed the chunk size)
// and polls it (mpi_op_poll: MPI_Test on each request) until every request has completed; the
// issuing thread's handle then sees done.
//
// Ordering: operations are posted strictly in the order they were issued (so collectives reach
// MPI in the same order on every rank), and an operation is posted only once no earlier
// operation still running touches the same memory with a write on either side
// (mpi_ops_conflict); operations on separate buffers run concurrently.
//
// Arrival protocol (while the watchdog is on): for collective #k every rank sends each peer a
// small ArrivalMsg describing #k on a separate communicator and receives one from each peer; the
// peers whose message has arrived are "heard from" (the watchdog names the others), and a
// message describing a different collective is a mismatch (the process reports it and exits with
// kCommMismatchExitCode). A collective completes only when its data and its arrival messages have.
#pragma once
// The C API only: skip the deprecated MPI C++ bindings (and their warnings).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/comm_op.h"

namespace zaya {

using MpiOpKind = CommOpKind;

// What a rank tells its peers when it reaches a collective.
struct ArrivalMsg {
  int64_t seq = -1;    // collective number
  int64_t kind = 0;    // MpiOpKind
  int64_t type = 0;    // CommType
  int64_t detail = 0;  // ReduceOp (reductions) or root (broadcast)
  int64_t bytes = 0;   // total bytes of the collective
};

// The communicator an operation runs on.
struct MpiContext {
  MPI_Comm data = MPI_COMM_NULL;     // the operations' messages
  MPI_Comm arrival = MPI_COMM_NULL;  // arrival messages only
  int rank = 0, size = 1;
  bool arrivals = false;             // arrival protocol on (every rank runs the watchdog)
  int64_t max_chunk = 0;             // most elements per MPI call
};

struct MpiOp {
  // Set by the issuing thread before queueing; read-only afterwards.
  MpiOpKind kind = MpiOpKind::Barrier;
  int64_t seq = 0;                // collective number, or point-to-point number, on this communicator
  const void* send = nullptr;
  void* recv = nullptr;           // also the broadcast buffer
  int64_t count = 0;              // all_reduce, broadcast, send, recv
  std::vector<int64_t> counts;    // reduce_scatter, all_gather
  CommType type = CommType::U8;
  ReduceOp reduce = ReduceOp::Sum;
  int root = 0, peer = -1, tag = 0;
  std::chrono::steady_clock::time_point issued;
  struct Span {
    const char* begin;
    const char* end;
    bool write;
  };
  std::vector<Span> spans;        // memory read or written (set_spans)

  // Communication thread only.
  std::vector<MPI_Request> data;
  std::vector<int> data_counts;             // elements of each data request (checked for recv)
  std::vector<int> counts_int, displs_int;  // must outlive the reduce_scatter / all_gather call
  ArrivalMsg arrival_out;
  std::vector<ArrivalMsg> arrival_in;       // by rank
  std::vector<MPI_Request> arrival_sends, arrival_recvs;
  std::vector<int> arrival_from;            // rank of arrival_recvs[i]
  std::vector<char> heard;                  // by rank: arrival received
  std::string error;                        // first MPI failure (readable once done)
  bool started = false;

  // Completion, shared with the handle.
  std::mutex m;
  std::condition_variable cv;
  bool done = false;

  bool collective() const { return kind != MpiOpKind::Send && kind != MpiOpKind::Recv; }
  int64_t bytes() const;
  // Fills spans from the buffers and counts (rank: this rank).
  void set_spans(int rank);
  // "all_reduce #17 (4096 bytes, f32 sum)"
  std::string describe() const;
};

// Whether b (issued after a) must wait for a: they touch overlapping memory and one writes it.
bool mpi_ops_conflict(const MpiOp& a, const MpiOp& b);
// Posts op's non-blocking MPI calls (and its arrival messages). Failures are recorded in op.error.
void mpi_op_start(MpiOp& op, const MpiContext& ctx);
// Tests op's outstanding requests; returns whether any completed. *finished: none outstanding.
bool mpi_op_poll(MpiOp& op, const MpiContext& ctx, bool* finished);
// Writes line to stderr in one write (after flushing stdout if nobody holds it) and _Exits with code.
[[noreturn]] void mpi_fatal_line(const std::string& line, int code);
// "1, 2", or a sentence when every peer has been heard from or arrivals are off.
std::string mpi_op_silent_peers(const MpiOp& op, const MpiContext& ctx);

}  // namespace zaya
