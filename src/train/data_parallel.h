// ZeRO-1 data parallelism over a Comm (spec D.2, D.3): every rank holds all parameters, and
// each whole tensor (its fp32 optimizer state, its update and, for Muon, its Newton-Schulz) is
// owned by exactly one rank.
//
//  * Ownership: whole tensors assigned by greedy LPT bin packing on their optimizer cost
//    (Muon: the Newton-Schulz FLOPs of each of its matrices; AdamW: a few FLOPs per element),
//    so Newton-Schulz runs exactly once per matrix per step, on its owner.
//  * Gradients: summed over ranks by bucketed reduce-scatters. A bucket is a run of tensors in
//    the order the backward finishes them (the last block first); its send buffer is packed
//    by owner, so the reduce-scatter delivers each tensor's summed gradient to its owner only.
//    A bucket starts as soon as the backward of its last block is done (block_done), so the
//    reduction overlaps the backward of the blocks below; finish_gradients() starts the rest
//    and waits. Bucket size: DataParallelOptions::bucket_bytes.
//  * Parameters: after the owners' optimizer steps, one all-gather (packed by owner) gives
//    every rank the updated parameters.
//  * Small reductions: the global loss, token count and grad-norm (double) and the balancer's
//    routing counts (int64) are all-reduced.
// Memory: gradients and parameters are backend memory (DataParallelOptions::backend; nullptr =
// host). With a host communicator (single-process, MPI) buckets are staged in host memory
// (backend to_host / from_host); with a device communicator (data_comm, NCCL) they are backend
// memory and the reductions run on the device. The small reductions always use the host comm.
// With one rank and no device communicator nothing is copied: the step equals the plain one.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/comm.h"
#include "model/params.h"
#include "train/optimizer.h"

namespace zaya {

class Backend;

struct DataParallelOptions {
  int64_t bucket_bytes = int64_t(32) << 20;  // gradient fusion buffer per reduce-scatter
  Backend* backend = nullptr;  // where gradients and parameters live (nullptr = host memory)
  // A communicator over device buffers of `backend` (NCCL) for the gradient reduce-scatters and
  // the parameter all-gather; nullptr = the host comm, staged through host memory. Same ranks.
  Comm* data_comm = nullptr;
};

// Optimizer cost of one tensor, the bin-packing weight: Muon ~ ns_steps x (2 m^2 n + 2 m^2 n
// + 2 m^3) per matrix (m = min(rows, cols)), AdamW ~ 10 FLOPs per element, buffers 0.
double optimizer_cost(const ParamSpec& p, int ns_steps);
// owner[i] of every tensor of the layout for `ranks` ranks (deterministic).
std::vector<int> assign_tensor_owners(const ParamLayout& layout, int ns_steps, int ranks);

class DataParallel {
 public:
  DataParallel(Comm& comm, const ParamLayout& layout, int ns_steps, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return comm_.rank(); }
  int ranks() const { return comm_.size(); }
  Comm& comm() { return comm_; }
  const std::vector<int>& owners() const { return owner_; }
  // This rank's tensors (the Optimizer's ownership mask).
  std::vector<bool> owned_mask() const;
  bool owns(size_t i) const { return owner_[i] == comm_.rank(); }

  // Gradient reduction of one step. begin_step() before the step's last micro-batch backward;
  // block_done(l) from the backward hook once block l's gradients are final (optional: it only
  // starts buckets early); finish_gradients() after the backward: starts what is left, waits,
  // and writes the summed gradient of every owned tensor into grads (others are left stale).
  void begin_step(float* grads);
  void block_done(int64_t block);
  void finish_gradients();

  // Sum of squares of the owned tensors' gradients, summed over ranks.
  double grad_sum_squares(Backend& be, const float* grads);
  // After the optimizer step: every rank receives every owned tensor's new values.
  void gather_parameters(float* params);
  // In-place sums over ranks.
  void sum(double* values, int64_t n);
  void sum(int64_t* values, int64_t n);

  int64_t buckets() const { return int64_t(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<size_t> tensors;  // layout indices, packed by owner then layout order
    std::vector<int64_t> counts;  // floats per rank
    int64_t last_block = -1;      // the bucket may start once this block is done (-1: at finish)
    std::vector<float> send, recv;  // host staging (host comm)
    float* dsend = nullptr;          // backend memory (device comm)
    float* drecv = nullptr;
    CommHandle pending;
    bool started = false;
  };
  void start(Bucket& b);
  bool device_collectives() const { return data_comm_ != nullptr; }
  // Copies between parameter/gradient memory and a bucket: host staging or device buffers.
  void pack(float* dst, const float* src, int64_t n);
  void unpack(float* dst, const float* src, int64_t n);
  float* bucket_alloc(int64_t n);

  Comm& comm_;
  Comm* data_comm_;
  Backend* be_;
  const ParamLayout& layout_;
  std::vector<int> owner_;
  std::vector<Bucket> buckets_;
  float* grads_ = nullptr;
  std::vector<float> gather_send_, gather_recv_;
  float* dgather_send_ = nullptr;
  float* dgather_recv_ = nullptr;
  std::vector<int64_t> gather_counts_;
  std::vector<size_t> gather_order_;
};

}  // namespace zaya
