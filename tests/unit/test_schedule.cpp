// LR schedules (warm-up, constant, cosine, WSD), the batch-size ramp and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "test_helpers.h"
#include "train/schedule.h"

namespace zaya {
namespace {

TEST(LrSchedule, WarmupThenConstant) {
  LrSchedule s;
  s.shape = LrShape::Constant;
  s.peak = 1e-3;
  s.warmup_steps = 10;
  s.validate();
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(1000000), 1e-3);
  for (int64_t i = 1; i < 10; ++i) EXPECT_GT(s.at(i), s.at(i - 1));
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(s.at(0), 1e-3);
}

TEST(LrSchedule, Cosine) {
  LrSchedule s;
  s.shape = LrShape::Cosine;
  s.peak = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_lr_ratio = 0.1;
  s.validate();
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  // p = (step - 9) / 100: half-way at step 59, minimum exactly at the last step.
  EXPECT_NEAR(s.at(59), 0.55, 1e-12);
  EXPECT_NEAR(s.at(34), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_NEAR(s.at(109), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
  EXPECT_LT(s.at(10), 1.0);
  for (int64_t i = 10; i < 110; ++i) EXPECT_LT(s.at(i), s.at(i - 1)) << i;
}

TEST(LrSchedule, WarmupStableDecay) {
  LrSchedule s;
  s.shape = LrShape::Wsd;
  s.peak = 2e-3;
  s.warmup_steps = 100;
  s.total_steps = 1000;
  s.decay_fraction = 0.2;
  s.min_lr_ratio = 0.1;
  s.validate();
  EXPECT_EQ(s.decay_start(), 800);
  EXPECT_DOUBLE_EQ(s.at(0), 2e-5);
  EXPECT_DOUBLE_EQ(s.at(99), 2e-3);
  EXPECT_DOUBLE_EQ(s.at(100), 2e-3);
  EXPECT_DOUBLE_EQ(s.at(799), 2e-3);
  EXPECT_NEAR(s.at(800), 2e-3 - 1.8e-3 / 200, 1e-15);
  EXPECT_NEAR(s.at(899), 2e-3 - 1.8e-3 * 0.5, 1e-15);
  EXPECT_NEAR(s.at(999), 2e-4, 1e-15);
  EXPECT_NEAR(s.at(5000), 2e-4, 1e-15);
  // Decay fraction that does not divide evenly rounds the decay length up.
  s.decay_fraction = 0.0015;  // 1.5 steps -> 2
  EXPECT_EQ(s.decay_start(), 998);
  EXPECT_NEAR(s.at(999), 2e-4, 1e-15);
  s.decay_fraction = 0.0;
  EXPECT_DOUBLE_EQ(s.at(999), 2e-3);
}

TEST(LrSchedule, Validation) {
  LrSchedule s;
  s.shape = LrShape::Cosine;
  s.warmup_steps = 10;
  s.total_steps = 10;
  EXPECT_THROW(s.validate(), Error);
  s.shape = LrShape::Wsd;
  s.total_steps = 50;
  s.decay_fraction = 0.9;  // decay would start inside the warm-up
  EXPECT_THROW(s.validate(), Error);
  s.decay_fraction = 0.1;
  s.min_lr_ratio = 1.5;
  EXPECT_THROW(s.validate(), Error);
  EXPECT_EQ(parse_lr_shape("cosine"), LrShape::Cosine);
  EXPECT_STREQ(lr_shape_name(parse_lr_shape("wsd")), "wsd");
  EXPECT_THROW(parse_lr_shape("linear"), Error);
}

TEST(BatchRamp, LinearRampRoundedToMicroBatches) {
  BatchRamp r;
  r.start_sequences = 64;
  r.full_sequences = 256;
  r.ramp_steps = 4;
  r.granularity = 16;
  r.validate();
  EXPECT_EQ(r.at(0), 64);
  EXPECT_EQ(r.at(1), 112);
  EXPECT_EQ(r.at(2), 160);
  EXPECT_EQ(r.at(3), 208);
  EXPECT_EQ(r.at(4), 256);
  EXPECT_EQ(r.at(100), 256);
  EXPECT_EQ(r.micro_batches(0), 4);
  EXPECT_EQ(r.sequences_before(0), 0);
  EXPECT_EQ(r.sequences_before(4), 64 + 112 + 160 + 208);
  EXPECT_EQ(r.sequences_before(6), 64 + 112 + 160 + 208 + 2 * 256);
  // Rounding to the nearest multiple, never below one granule.
  r.start_sequences = 5;
  r.full_sequences = 96;
  r.ramp_steps = 10;
  r.granularity = 32;
  EXPECT_EQ(r.at(0), 32);
  EXPECT_EQ(r.at(5), 64);  // 50.5 -> 64
  EXPECT_EQ(r.at(3), 32);  // 32.3 -> 32
  for (int64_t s = 0; s < 12; ++s) {
    EXPECT_EQ(r.at(s) % 32, 0);
    if (s) {
      EXPECT_GE(r.at(s), r.at(s - 1));
    }
  }
  BatchRamp none;
  none.full_sequences = 48;
  none.granularity = 8;
  EXPECT_EQ(none.at(0), 48);
  BatchRamp bad = none;
  bad.full_sequences = 50;
  EXPECT_THROW(bad.validate(), Error);
  bad = none;
  bad.start_sequences = 64;
  EXPECT_THROW(bad.validate(), Error);
}

TEST(GradClip, NormAndClipping) {
  std::vector<float> g = {3, 4, 0, 0};
  EXPECT_DOUBLE_EQ(grad_norm(g.data(), 4), 5.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 4, 10.0), 5.0);
  EXPECT_EQ(g[0], 3.0f);  // below the limit: untouched
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 4, 1.0), 5.0);
  EXPECT_FLOAT_EQ(g[0], 0.6f);
  EXPECT_FLOAT_EQ(g[1], 0.8f);
  EXPECT_NEAR(grad_norm(g.data(), 4), 1.0, 1e-7);
  // Disabled clipping and non-finite norms leave the gradient alone.
  std::vector<float> h = {30, 40};
  EXPECT_DOUBLE_EQ(clip_grad_norm(h.data(), 2, 0.0), 50.0);
  EXPECT_EQ(h[0], 30.0f);
  h[1] = INFINITY;
  EXPECT_TRUE(std::isinf(clip_grad_norm(h.data(), 2, 1.0)));
  EXPECT_EQ(h[0], 30.0f);
  EXPECT_DOUBLE_EQ(clip_scale(4.0, 1.0), 0.25);
  EXPECT_DOUBLE_EQ(clip_scale(0.5, 1.0), 1.0);
  // Large arena: double accumulation and the backend path agree with a serial sum.
  const size_t n = 1 << 20;
  auto big = test::random_vector(n, 5, 1e-3);
  double ref = 0;
  for (float v : big) ref += double(v) * double(v);
  ref = std::sqrt(ref);
  auto be = make_cpu_backend();
  std::vector<float> big2 = big;
  EXPECT_NEAR(clip_grad_norm(big.data(), int64_t(n), 0.5), ref, 1e-12 * ref);
  EXPECT_NEAR(clip_grad_norm(*be, big2.data(), int64_t(n), 0.5), ref, 1e-12 * ref);
  EXPECT_NEAR(grad_norm(big.data(), int64_t(n)), 0.5, 1e-6);
  EXPECT_EQ(big, big2);
}

}  // namespace
}  // namespace zaya

namespace zaya {
namespace {

// A step's gradients (of the loss sum / positions) become those of the mean over the counted
// targets, then are clipped: the factor and the reported norm.
TEST(GradClip, StepScaleMakesTheMeanOverTargetsThenClips) {
  // Every position counted: the factor is exactly 1 (plain data trains as before).
  StepGradScale s = step_grad_scale(0.5, 4096, 4096, 1.0);
  EXPECT_EQ(s.scale, 1.0);
  EXPECT_EQ(s.norm, 0.5);
  s = step_grad_scale(3.0, 4096, 4096, 1.0);
  EXPECT_DOUBLE_EQ(s.scale, 1.0 / 3.0);
  EXPECT_EQ(s.norm, 3.0);
  // A quarter of the positions are targets: the mean over them is 4x the sum / positions.
  s = step_grad_scale(0.1, 1024, 4096, 1.0);
  EXPECT_DOUBLE_EQ(s.scale, 4.0);
  EXPECT_DOUBLE_EQ(s.norm, 0.4);
  // ... clipped when that norm is over the limit: the result has the limit's norm.
  s = step_grad_scale(0.5, 1024, 4096, 1.0);
  EXPECT_DOUBLE_EQ(s.norm, 2.0);
  EXPECT_DOUBLE_EQ(s.scale, 4.0 * 0.5);
  EXPECT_DOUBLE_EQ(0.5 * s.scale, 1.0);
  // No clipping.
  s = step_grad_scale(0.5, 1024, 4096, 0.0);
  EXPECT_DOUBLE_EQ(s.scale, 4.0);
  // No target at all (the trainer skips such a step): nothing to rescale.
  s = step_grad_scale(0.0, 0, 4096, 1.0);
  EXPECT_EQ(s.scale, 1.0);
  EXPECT_EQ(s.norm, 0.0);
}

}  // namespace
}  // namespace zaya
