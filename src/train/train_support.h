// Small pieces the training loop needs: throughput accounting (measured sgemm peak, FLOPs per
// trained token), evaluation loss, the running median of the spike policy, per-step balancer
// metrics as JSON, a weights hash for exact-resume checks, and reloading a metrics file.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "train/balancer.h"
#include "train/metrics.h"

namespace zaya {

// Best GFLOP/s of a few 2048^3 sgemms on all threads (a fraction of a second). The best, not
// the median: other work on the machine only ever slows a run down, so the fastest run is the
// closest to what the machine can do.
double measure_sgemm_gflops();

// The matmul peak (GFLOP/s per process) that MFU is quoted against: the backend's own figure,
// or a measured sgemm. A peak measured while the machine was busy reads low and would report
// MFU above 100%; the first time that happens the peak is measured again, the higher figure is
// kept, and a warning says what changed.
class MatmulPeak {
 public:
  explicit MatmulPeak(std::function<double()> measure);
  double gflops() const { return gflops_; }
  // Model FLOP utilisation of one process running at flops_per_second. When the figure first
  // passes 1, re-measures and, if it still passes 1, says so once: then the FLOP count or the
  // peak is wrong, and the warning names both. *warning is set only when there is news.
  double utilisation(double flops_per_second, std::string* warning);

 private:
  std::function<double()> measure_;
  double gflops_ = 0;
  bool rechecked_ = false, warned_ = false;
};
// Matmul FLOPs to train one token (forward + backward = 3x forward): 6 x active matmul
// parameters (attention projections, router, one expert, LM head) + causal attention.
double training_flops_per_token(const ModelConfig& c, int64_t seq_len);
// Sum of next-token losses over targets >= 0 of a [B, T] batch; adds the count to *count.
// segment_start: per-token document starts (reset_at_document_boundary), or nullptr.
double eval_loss_sum(Model& m, const int32_t* inputs, const int32_t* targets, int64_t B, int64_t T, int64_t* count,
                     const int32_t* segment_start = nullptr);
double median_of(std::vector<double> v);
nlohmann::json balancer_record(const BiasBalancer& b);
// FNV-1a over the bytes of the arena, as a double-safe 52-bit integer.
double weights_hash(const float* p, int64_t n);
// Reads the curve back from metrics.jsonl and drops records past `up_to_step` (written after
// the checkpoint a resumed run restarts from), rewriting the file without them.
void reload_curve(const std::string& metrics_path, int64_t up_to_step, LossCurve* curve);

}  // namespace zaya
