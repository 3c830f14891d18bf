// Context parallelism for long sequences (spec D.2, "CP-CCA"): the R ranks of a context group
// train the same sequences, and each holds 2 of every sequence's 2R equal chunks, zig-zag
// (rank c holds chunks c and 2R-1-c, so every rank does the same causal-attention work). Only
// CCA mixes tokens, and per layer the group exchanges:
//   forward   the conv's P raw q‖k rows and the last delayed value (Wv_del x) of each chunk go to
//             the owner of the next chunk (point-to-point), and K and V are gathered so that
//             each chunk's queries attend over the whole sequence (one copy per sequence);
//   backward  the gathered K/V gradients go back to the owners summed over the group (a
//             reduce-scatter of point-to-point messages, summed in rank order: deterministic),
//             and the gradients of the received boundary rows return to the previous chunk.
// Every other op is per token. The loss is scaled by the global token count, so the data-
// parallel gradient sum over all ranks (DataParallel) is the exact full-batch gradient.
//
// Groups are consecutive ranks of the job's communicator: ranks [g*R, g*R + R) form group g,
// which is data-parallel rank g of size/R. Buffers are backend memory; with a host
// communicator (MPI) they are staged through host memory.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "dist/comm.h"

namespace zaya {

class ContextParallel {
 public:
  // comm: the job's communicator; group_size R >= 1 must divide comm.size().
  ContextParallel(Comm& comm, int group_size, Backend& be);

  int size() const { return size_; }    // R
  int index() const { return index_; }  // this rank's index c in its group
  int group() const { return group_; }  // data-parallel rank of this group
  int groups() const { return groups_; }

  // Chunk length of sequences of length T (T must be a multiple of 2R; fails naming both).
  int64_t chunk_len(int64_t T) const;
  // This rank's chunks: slot 0 holds chunk c, slot 1 chunk 2R-1-c. Local rows are slot-major:
  // row i of 2B is sequence i % B in slot i / B, so each slot's rows are contiguous [B, Tc].
  int chunk_of_slot(int slot) const { return chunk_of(index_, slot, size_); }
  // The chunk that group index c holds in `slot` (groups of R).
  static int chunk_of(int c, int slot, int R) { return slot == 0 ? c : 2 * R - 1 - c; }
  int chunk_of_row(int64_t row, int64_t B) const { return chunk_of_slot(int(row / B)); }
  // Owner (group index) and slot of chunk j.
  int owner_of(int chunk) const { return chunk < size_ ? chunk : 2 * size_ - 1 - chunk; }
  static int slot_of(int chunk, int R) { return chunk < R ? 0 : 1; }
  // This rank's rows of full host sequences [B, T] as [2B, T/(2R)] (ids, targets).
  std::vector<int32_t> split(const int32_t* full, int64_t B, int64_t T) const;

  // Forward boundary: tails [2B, W] (row i: what its chunk passes on) become, on the owner of
  // the next chunk, heads [2B, W] (row i: what the previous chunk passed; zeros for chunk 0).
  void pass_forward(const float* tails, float* heads, int64_t B, int64_t W);
  // Backward boundary: head_grads [2B, W] (row i: gradient of the rows received from the
  // previous chunk) are added into tail_grads [2B, W] of the previous chunk's owner (the last
  // chunk's tail_grads are left as they are).
  void pass_backward(const float* head_grads, float* tail_grads, int64_t B, int64_t W);
  // local [2B, Tc, W] -> full [B, 2R*Tc, W]: every sequence whole (both slots read it).
  void gather(const float* local, float* full, int64_t B, int64_t Tc, int64_t W);
  // full [2, B, 2R*Tc, W] (per slot, the whole sequence's partial gradients from that slot's
  // queries) -> local [2B, Tc, W]: each chunk's gradient summed over both slots of every rank
  // of the group (overwritten).
  void reduce_scatter(const float* full, float* local, int64_t B, int64_t Tc, int64_t W);

  // Messages sent so far (a test counts them).
  int64_t messages() const { return messages_; }

 private:
  int world_rank(int group_index) const { return group_ * size_ + group_index; }
  // Sends every (peer, buffer) of `out` and receives every (peer, buffer) of `in` at once, then
  // waits; a message to this rank itself is a copy.
  struct Msg {
    int peer;
    std::vector<float>* buf;
  };
  void exchange(const std::vector<Msg>& out, const std::vector<Msg>& in, int tag);
  // Host rows [2B, W]: row i goes to the owner of the chunk after row i's (delta +1) or before
  // it (-1); returns, for each row i, the row of the chunk on the other side (zeros where there
  // is none).
  std::vector<float> shift_rows(const std::vector<float>& rows, int64_t B, int64_t W, int delta, int tag);

  Comm& comm_;
  Backend& be_;
  int size_, index_, group_, groups_;
  int64_t messages_ = 0;
};

}  // namespace zaya
