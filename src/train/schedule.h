// Training schedules (spec C.2, C.5): the learning-rate schedule, the global-batch ramp and
// gradient-norm clipping.
//
// Step convention: `step` is the 0-based index of the optimizer step about to be applied.
#pragma once
#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace zaya {

enum class LrShape { Constant, Cosine, Wsd };
const char* lr_shape_name(LrShape s);                             // "constant", "cosine", "wsd"
LrShape parse_lr_shape(const std::string& s);                     // throws naming the value

// Linear warm-up then:
//   Constant: peak forever.
//   Cosine:   from peak to min_lr_ratio*peak over steps [warmup, total); the last step
//             (total-1) is exactly at the minimum.
//   Wsd:      warmup-stable-decay: peak until the final decay_fraction*total steps
//             (rounded up), which decay linearly to min_lr_ratio*peak, reached exactly at
//             the last step (total-1).
// Warm-up: lr(step) = peak * (step+1) / warmup_steps for step < warmup_steps, so step 0
// already trains and step warmup_steps-1 is at peak. Steps >= total stay at the final value.
struct LrSchedule {
  LrShape shape = LrShape::Wsd;
  double peak = 4e-4;
  int64_t warmup_steps = 2000;
  int64_t total_steps = 0;      // required by Cosine / Wsd
  double min_lr_ratio = 0.1;    // Cosine / Wsd floor as a fraction of peak
  double decay_fraction = 0.1;  // Wsd: fraction of total_steps spent decaying

  void validate() const;  // throws zaya::Error naming the field
  double at(int64_t step) const;
  int64_t decay_start() const;  // Wsd: first step below peak (Cosine: warmup_steps)
};

// Global batch in sequences, ramped linearly from start_sequences to full_sequences over the
// first ramp_steps steps (step >= ramp_steps: full), rounded to the nearest multiple of
// `granularity` (sequences per micro-batch x data-parallel ranks) and never below one
// granularity nor above full. full_sequences must be a multiple of granularity.
struct BatchRamp {
  int64_t start_sequences = 0;  // 0 or == full: no ramp
  int64_t full_sequences = 1;
  int64_t ramp_steps = 0;
  int64_t granularity = 1;

  void validate() const;
  int64_t at(int64_t step) const;                    // global batch (sequences) of this step
  int64_t micro_batches(int64_t step) const { return at(step) / granularity; }
  int64_t sequences_before(int64_t step) const;      // sum of at(s) for s < step
};

// Global L2 norm of a host arena, accumulated in double (OpenMP).
double grad_norm(const float* g, int64_t n);
// Clips a host arena in place: if norm > max_norm, scales it by max_norm / norm. Returns the
// pre-clip norm. A non-finite norm is returned without scaling (the caller skips the step).
// max_norm <= 0 disables clipping (the norm is still returned).
double clip_grad_norm(float* g, int64_t n, double max_norm);
// The same on backend memory through Backend::sum_squares / scale_inplace.
double clip_grad_norm(Backend& be, float* g, int64_t n, double max_norm);
// Scale factor clip_grad_norm applies for a given norm (1 when not clipping). For sharded
// gradients: all-reduce the sums of squares, take the sqrt, then scale each shard by this.
double clip_scale(double norm, double max_norm);

// The factor on a step's summed gradients, and their norm after it. The gradients summed over
// micro-batches and ranks are of (sum of token losses) / positions; the step trains on the mean
// over the `targets` counted (supervised fine-tuning data counts only its completions), so they
// are scaled by positions / targets (exactly 1 when every position counts), then clipped to
// max_norm (<= 0: no clipping). `raw_norm` is the norm of the summed gradients before either.
struct StepGradScale {
  double scale = 1;  // multiply the gradients by this (1: leave them)
  double norm = 0;   // the gradient norm the step reports: of the mean over the targets
};
StepGradScale step_grad_scale(double raw_norm, double targets, double positions, double max_norm);

}  // namespace zaya
