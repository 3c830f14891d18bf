// The trainer's checkpoints (format version 2, ckpt/dist_checkpoint.h): what each rank owns
// and saves (its ZeRO-1 tensors and their optimizer state; rank 0 also the replicated balancer
// state and the run's JSON), and restoring it on any number of ranks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/dist_checkpoint.h"
#include "model/model.h"
#include "train/balancer.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"

namespace zaya {

struct TrainState {
  Model& model;
  Optimizer& optim;
  BiasBalancer& balancer;
  DataParallel& dp;
};

// This rank's pieces: owned parameters and optimizer state; on rank 0 the balancer state.
std::vector<DistPiece> owned_pieces(TrainState& s);
// Every routed tensor's optimizer step count ("optimizer.step.NAME") and the balancer's
// counters ("balancer.NAME"), gathered over ranks (collective).
nlohmann::json all_counters(TrainState& s);
// The checkpoint writer's copy from piece memory to host staging: backend memory (parameters,
// optimizer state) through be.to_host, the balancer's host state by memcpy.
DistCopyFn state_copy_fn(TrainState& s, Backend& be);
// Restores parameters (all), this rank's optimizer state and counters, and the balancer.
// Collective over `comm` (the job's): the disk reads run in short rounds (read_dist_tensors), so
// a rank with slower storage never holds the others inside one collective, and a failed read
// raises the same error on every rank.
void restore_state(TrainState& s, const DistCheckpoint& ck, Comm& comm);

}  // namespace zaya
