// LR schedule, batch-size ramp and gradient clipping.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace zaya {

namespace {

std::string format_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

constexpr double kPi = 3.14159265358979323846;

}  // namespace

const char* lr_shape_name(LrShape s) {
  switch (s) {
    case LrShape::Constant: return "constant";
    case LrShape::Cosine: return "cosine";
    case LrShape::Wsd: return "wsd";
  }
  return "?";
}

LrShape parse_lr_shape(const std::string& s) {
  if (s == "constant") return LrShape::Constant;
  if (s == "cosine") return LrShape::Cosine;
  if (s == "wsd") return LrShape::Wsd;
  fail("schedule", "unknown LR schedule '" + s + "'", "use one of: constant, cosine, wsd");
}

void LrSchedule::validate() const {
  if (!(std::isfinite(peak) && peak >= 0))
    fail("schedule", "LR 'peak' = " + format_g(peak) + " must be finite and >= 0");
  if (warmup_steps < 0) fail("schedule", "'warmup_steps' = " + std::to_string(warmup_steps) + " must be >= 0");
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
    fail("schedule", "'min_lr_ratio' = " + format_g(min_lr_ratio) + " must be in [0, 1]");
  if (!(decay_fraction >= 0 && decay_fraction <= 1))
    fail("schedule", "'decay_fraction' = " + format_g(decay_fraction) + " must be in [0, 1]");
  if (shape != LrShape::Constant && total_steps <= warmup_steps)
    fail("schedule", std::string("the ") + lr_shape_name(shape) + " schedule needs 'total_steps' (" +
                         std::to_string(total_steps) + ") > 'warmup_steps' (" + std::to_string(warmup_steps) + ")");
  if (shape == LrShape::Wsd && decay_start() < warmup_steps)
    fail("schedule",
         "the WSD decay (last " + format_g(decay_fraction) + " of " + std::to_string(total_steps) +
             " steps) overlaps the " + std::to_string(warmup_steps) + " warm-up steps",
         "lower 'decay_fraction' or 'warmup_steps'");
}

int64_t LrSchedule::decay_start() const {
  switch (shape) {
    case LrShape::Constant: return -1;
    case LrShape::Cosine: return warmup_steps;
    case LrShape::Wsd: {
      int64_t n = int64_t(std::ceil(decay_fraction * double(total_steps) - 1e-9));
      return total_steps - std::clamp<int64_t>(n, 0, total_steps);
    }
  }
  return -1;
}

double LrSchedule::at(int64_t step) const {
  if (step < 0) step = 0;
  if (step < warmup_steps) return peak * double(step + 1) / double(warmup_steps);
  const double floor_lr = min_lr_ratio * peak;
  switch (shape) {
    case LrShape::Constant: return peak;
    case LrShape::Cosine: {
      double p = std::min(1.0, double(step - warmup_steps + 1) / double(total_steps - warmup_steps));
      return floor_lr + (peak - floor_lr) * 0.5 * (1.0 + std::cos(kPi * p));
    }
    case LrShape::Wsd: {
      const int64_t s = decay_start(), n = total_steps - s;
      if (step < s || n == 0) return peak;
      double p = std::min(1.0, double(step - s + 1) / double(n));
      return peak - (peak - floor_lr) * p;
    }
  }
  return peak;
}

void BatchRamp::validate() const {
  if (granularity < 1) fail("schedule", "batch ramp 'granularity' = " + std::to_string(granularity) + " must be >= 1");
  if (full_sequences < granularity || full_sequences % granularity != 0)
    fail("schedule", "global batch " + std::to_string(full_sequences) + " sequences is not a positive multiple of " +
                         std::to_string(granularity) + " (micro-batch x data-parallel ranks)");
  if (start_sequences < 0 || start_sequences > full_sequences)
    fail("schedule", "batch ramp 'start_sequences' = " + std::to_string(start_sequences) + " must be in [0, " +
                         std::to_string(full_sequences) + "]");
  if (ramp_steps < 0) fail("schedule", "batch ramp 'ramp_steps' = " + std::to_string(ramp_steps) + " must be >= 0");
}

int64_t BatchRamp::at(int64_t step) const {
  if (step < 0) step = 0;
  if (ramp_steps == 0 || start_sequences == 0 || start_sequences == full_sequences || step >= ramp_steps)
    return full_sequences;
  double raw = double(start_sequences) + double(full_sequences - start_sequences) * double(step) / double(ramp_steps);
  int64_t n = int64_t(std::llround(raw / double(granularity))) * granularity;
  return std::clamp(n, granularity, full_sequences);
}

int64_t BatchRamp::sequences_before(int64_t step) const {
  int64_t total = 0;
  const int64_t ramped = std::min(step, ramp_steps);
  for (int64_t s = 0; s < ramped; ++s) total += at(s);
  if (step > ramped) total += (step - ramped) * full_sequences;
  return total;
}

double grad_norm(const float* g, int64_t n) {
  double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return std::sqrt(s);
}

double clip_scale(double norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm) || norm <= max_norm) return 1.0;
  return max_norm / norm;
}

StepGradScale step_grad_scale(double raw_norm, double targets, double positions, double max_norm) {
  StepGradScale s;
  const double to_mean = targets > 0 && targets != positions ? positions / targets : 1.0;
  s.norm = raw_norm * to_mean;
  s.scale = to_mean * clip_scale(s.norm, max_norm);
  return s;
}

double clip_grad_norm(float* g, int64_t n, double max_norm) {
  const double norm = grad_norm(g, n);
  const double s = clip_scale(norm, max_norm);
  if (s != 1.0) {
    const float fs = float(s);
#pragma omp parallel for if (n > 32768)
    for (int64_t i = 0; i < n; ++i) g[i] *= fs;
  }
  return norm;
}

double clip_grad_norm(Backend& be, float* g, int64_t n, double max_norm) {
  const double norm = std::sqrt(be.sum_squares(g, n));
  const double s = clip_scale(norm, max_norm);
  if (s != 1.0) be.scale_inplace(g, float(s), n);
  return norm;
}

}  // namespace zaya
