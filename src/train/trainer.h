// The training loop: recipe → model, data, optimizer (Muon + AdamW), bias balancer,
// schedules; gradient accumulation to the global batch, clipping, the loss-spike/NaN policy,
// periodic evaluation and atomic checkpoints; resumes bit-exactly from the latest valid
// checkpoint of the run. Writes metrics.jsonl, loss.svg and a final HF export into the run dir.
#pragma once
#include <limits>
#include <memory>
#include <string>

#include "train/recipe.h"

namespace zaya {

struct TrainSummary {
  std::string run_dir;
  int64_t steps = 0;
  int64_t tokens = 0;
  double final_train_loss = 0;
  double final_val_loss = 0;
  double unigram_baseline = 0;  // unigram cross-entropy of the validation set (nats/token)
  // eval.choices at the last step's evaluation: accuracy, and per byte; NaN when not measured.
  double final_choice_accuracy = std::numeric_limits<double>::quiet_NaN();
  double final_choice_accuracy_norm = std::numeric_limits<double>::quiet_NaN();
  double final_weights_hash = 0;
  std::string sample;
  // The communicator gradients and weights went over: "single" (one process), "mpi" (host
  // memory, staged from the device on GPUs) or "nccl" (device memory, --device-comm).
  std::string data_comm;
  // Steps this process trained with context parallelism (a group size above 1).
  int64_t context_parallel_steps = 0;
  // Whether this process's steps recomputed activations (batch.recompute_activations).
  bool activation_recompute = false;
};

class Comm;

struct TrainOptions {
  int64_t stop_after_steps = -1;  // stop (with a checkpoint) after this many steps of this process; -1 = run to the end
  bool quiet = false;             // no progress line (tests)
  // Data parallelism: the job's communicator (nullptr = one process). Every rank calls train()
  // with the same recipe; rank 0 logs and writes the run directory.
  Comm* comm = nullptr;
  int64_t bucket_bytes = int64_t(32) << 20;  // gradient reduce-scatter fusion buffer
  // Where the model, gradients and optimizer state live: "cpu", or "cuda" in a GPU build (each
  // rank uses GPU local_rank modulo the GPUs present).
  std::string backend = "cpu";
  // GPU data parallelism: true = gradient reduce-scatters and the parameter all-gather run on
  // the device over NCCL (RCCL); false = staged through host memory over the job's comm (MPI).
  bool device_comm = false;
  double comm_timeout_s = 600;  // watchdog of the device communicator (ZAYA_COMM_TIMEOUT overrides)
  // Where each rank records its heartbeat for a supervisor (supervise/heartbeat.h); "" = none.
  // `zaya train` takes it from ZAYA_HEARTBEAT_DIR, which `zaya launch` sets.
  std::string heartbeat_dir;
};

TrainSummary train(const Recipe& recipe, const TrainOptions& opt = {});

}  // namespace zaya
