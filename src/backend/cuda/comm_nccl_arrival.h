// The NCCL communicator's arrival channel (comm_nccl.h, "Peers heard from"): a private MPI
// communicator on which each rank tells every peer which collective it has reached (and a send
// tells its receiver what it sends), so that the watchdog (comm_nccl_watchdog.h) can name the
// peers not heard from and spot a peer that issued another operation. It is on only when the
// communicator has peers, every rank runs the watchdog and the bootstrap is the MPI communicator;
// otherwise silent_peers() gives the reason. Defined in comm_nccl_arrival.cu.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "backend/cuda/comm_nccl_op.h"
#include "dist/comm.h"

namespace zaya::nccl_detail {

class NcclArrivals {
 public:
  NcclArrivals(int rank, int size) : rank_(rank), size_(size) {}
  NcclArrivals(const NcclArrivals&) = delete;
  NcclArrivals& operator=(const NcclArrivals&) = delete;

  // Collective over bootstrap, before NCCL is initialised: decides whether tracking is on.
  void agree(Comm& bootstrap, double timeout_s);
  // After NCCL is initialised: opens the private MPI communicator when tracking is on (collective
  // over MPI_COMM_WORLD, which is what the MPI bootstrap spans).
  void open(double timeout_s);
  // Frees the private communicator (teardown, once the watchdog has stopped).
  void close() { channel_.reset(); }

  // Issuing thread, before op is published to the watchdog: posts op's arrival messages (a
  // failure is kept in op.arrival_error). No-op while the channel is closed.
  void post_collective(NcclOp& op);
  void post_message(NcclOp& op);

  // Watchdog thread only. Tests op's outstanding arrival messages; true when none is left. A
  // received message describing another operation stops the poll with *mismatch set to the line
  // to report (the caller exits with kCommMismatchExitCode).
  bool poll(NcclOp& op, std::string* mismatch) const;
  // The peers whose arrival message for op has not come: "1, 3", or a sentence saying why none or
  // unknown.
  std::string silent_peers(const NcclOp& op) const;

 private:
  // "" when op.in[i] matches op, else the mismatch line.
  std::string mismatch_line(const NcclOp& op, size_t i) const;

  const int rank_, size_;
  std::unique_ptr<Comm> channel_;  // the private MPI communicator; null when tracking is off
  std::string off_;                // why tracking is off ("" when on)
};

}  // namespace zaya::nccl_detail
