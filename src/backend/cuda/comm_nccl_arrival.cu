// The NCCL communicator's arrival channel (see comm_nccl_arrival.h): what is posted on the
// private MPI communicator for each operation, how the watchdog thread polls it, and the
// watchdog's "peers not heard from" text. Plain host code on the MPI communicator (dist/).
#include "backend/cuda/comm_nccl_arrival.h"

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/comm_mpi.h"

namespace zaya::nccl_detail {
namespace {

constexpr int64_t kArrivalInts = sizeof(Arrival) / sizeof(int64_t);  // an Arrival goes as 5 x int64
constexpr int kCollectiveArrivalTag = 1;  // tags on the private arrival channel
constexpr int kMessageArrivalTag = 2;

}  // namespace

void NcclArrivals::agree(Comm& bootstrap, double timeout_s) {
  // Arrival tracking needs every rank to take part: on only when every rank runs the watchdog.
  int32_t mine = timeout_s > 0 ? 1 : 0, all = 0;
  bootstrap.all_reduce(&mine, &all, 1, CommType::I32, ReduceOp::Min)->wait();
  if (size_ == 1)
    off_ = "none (this communicator has no peers)";
  else if (all != 1)
    off_ = "unknown (arrival tracking is off: some rank runs with the watchdog disabled)";
  else if (bootstrap.name() != "mpi")
    off_ = "unknown (arrival tracking needs the MPI bootstrap communicator; this one is '" + bootstrap.name() +
           "')";
}

void NcclArrivals::open(double timeout_s) {
  // Its own watchdog is a backstop only (2 x timeout + 10 s), so that the NCCL communicator's
  // watchdog reports a missing peer first, naming the operation.
  if (!off_.empty()) return;
  CommOptions channel_options;
  channel_options.timeout_s = 2 * timeout_s + 10;
  channel_ = make_mpi_comm(channel_options);
  if (channel_->rank() != rank_ || channel_->size() != size_)
    fail("comm", "the MPI arrival channel's ranks differ from the bootstrap's",
         "the MPI bootstrap communicator must span MPI_COMM_WORLD");
}

void NcclArrivals::post_collective(NcclOp& op) {
  if (!channel_) return;
  op.out = Arrival{op.seq, static_cast<int64_t>(op.kind), static_cast<int64_t>(op.type), op.detail, op.bytes};
  op.heard.assign(size_t(size_), 0);
  op.heard[size_t(rank_)] = 1;
  op.in.assign(size_t(size_ - 1), Arrival{});
  size_t i = 0;
  try {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      op.in_from.push_back(p);
      op.in_handles.push_back(channel_->recv(&op.in[i++], kArrivalInts, CommType::I64, p, kCollectiveArrivalTag));
    }
    for (int p = 0; p < size_; ++p)
      if (p != rank_) op.out_handles.push_back(channel_->send(&op.out, kArrivalInts, CommType::I64, p, kCollectiveArrivalTag));
  } catch (const Error& e) {
    op.arrival_error = e.message();
  }
}

// A send tells its receiver what it sends; a receive listens for that.
void NcclArrivals::post_message(NcclOp& op) {
  if (!channel_) return;
  op.heard.assign(size_t(size_), 0);
  op.heard[size_t(rank_)] = 1;
  try {
    if (op.kind == OpKind::Send) {
      op.out = Arrival{op.seq, static_cast<int64_t>(op.kind), static_cast<int64_t>(op.type), op.detail, op.bytes};
      op.out_handles.push_back(channel_->send(&op.out, kArrivalInts, CommType::I64, op.peer, kMessageArrivalTag));
    } else {
      op.in.assign(1, Arrival{});
      op.in_from.push_back(op.peer);
      op.in_handles.push_back(channel_->recv(&op.in[0], kArrivalInts, CommType::I64, op.peer, kMessageArrivalTag));
    }
  } catch (const Error& e) {
    op.arrival_error = e.message();
  }
}

// A peer's arrival message that describes another operation is a program bug.
std::string NcclArrivals::mismatch_line(const NcclOp& op, size_t i) const {
  const Arrival& in = op.in[i];
  const int peer = op.in_from[i];
  std::string theirs = "an unknown operation";
  const bool valid = in.kind >= 0 && in.kind <= static_cast<int64_t>(OpKind::Recv) && in.type >= 0 &&
                     in.type <= static_cast<int64_t>(CommType::U8);
  if (valid)
    theirs = describe_parts(static_cast<OpKind>(in.kind), in.seq, in.bytes, static_cast<CommType>(in.type), in.detail,
                            in.kind == static_cast<int64_t>(OpKind::Send) ? rank_ : -1);
  if (op.collective()) {
    const Arrival& out = op.out;
    if (in.seq == out.seq && in.kind == out.kind && in.type == out.type && in.detail == out.detail &&
        in.bytes == out.bytes)
      return "";
    return "zaya: comm: collective mismatch on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
           ": this rank issued " + op.describe() + " but rank " + std::to_string(peer) + " issued " + theirs +
           " at the same position; every rank must issue the same collectives in the same order";
  }
  if (in.kind == static_cast<int64_t>(OpKind::Send) && in.type == static_cast<int64_t>(op.type) &&
      in.detail == op.detail && in.bytes == op.bytes)
    return "";
  return "zaya: comm: message mismatch on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
         ": this rank issued " + op.describe() + " but the matching message from rank " + std::to_string(peer) +
         " is " + theirs + "; NCCL has no tags: messages between two ranks match in the order they were issued";
}

bool NcclArrivals::poll(NcclOp& op, std::string* mismatch) const {
  bool all = true;
  for (size_t i = 0; i < op.in_handles.size(); ++i) {
    if (!op.in_handles[i]) continue;
    bool done = false;
    try {
      done = op.in_handles[i]->test();
      if (done) {
        op.heard[size_t(op.in_from[i])] = 1;
        if (op.arrival_error.empty()) {
          *mismatch = mismatch_line(op, i);
          if (!mismatch->empty()) return false;
        }
      }
    } catch (const Error& e) {
      done = true;
      if (op.arrival_error.empty()) op.arrival_error = e.message();
    }
    if (done)
      op.in_handles[i].reset();
    else
      all = false;
  }
  for (CommHandle& h : op.out_handles) {
    if (!h) continue;
    bool done = false;
    try {
      done = h->test();
    } catch (const Error& e) {
      done = true;
      if (op.arrival_error.empty()) op.arrival_error = e.message();
    }
    if (done)
      h.reset();
    else
      all = false;
  }
  return all;
}

std::string NcclArrivals::silent_peers(const NcclOp& op) const {
  const bool tracked = off_.empty() && op.arrival_error.empty() && !op.heard.empty();
  if (!op.collective()) {
    if (op.kind == OpKind::Recv && tracked && op.heard[size_t(op.peer)])
      return "none (rank " + std::to_string(op.peer) +
             " has issued the matching send; the transfer is stuck inside NCCL or on the GPU)";
    return std::to_string(op.peer);
  }
  if (!off_.empty()) return off_;
  if (!op.arrival_error.empty()) return "unknown (the arrival channel failed: " + op.arrival_error + ")";
  std::string list;
  for (int p = 0; p < size_; ++p) {
    if (op.heard[size_t(p)]) continue;
    if (!list.empty()) list += ", ";
    list += std::to_string(p);
  }
  if (list.empty()) return "none (every peer has reached this operation; it is stuck inside NCCL or on the GPU)";
  return list;
}

}  // namespace zaya::nccl_detail
