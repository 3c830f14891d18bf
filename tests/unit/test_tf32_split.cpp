// The TF32 split behind the GPU LM head's 3xTF32 GEMMs (src/backend/cuda/tf32_split.h), checked
// on the host: rounding to TF32 (nearest, ties to even, specials kept), the split's
// reconstruction error, and dot products formed as the tensor cores form them (TF32 inputs,
// exact products, fp32 accumulation) against double: the three-product form must be as accurate
// as plain fp32, and one TF32 product (what the split avoids) must not be.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/tf32_split.h"

namespace zaya {
namespace {

uint32_t bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  return u;
}

float from_bits(uint32_t u) {
  float x = 0;
  std::memcpy(&x, &u, 4);
  return x;
}

TEST(Tf32Split, RoundsToNearestTf32) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-40, 40);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(mant(rng), expo(rng)) * (i % 2 ? -1.0f : 1.0f);
    const float r = tf32_round(x);
    EXPECT_EQ(bits(r) & 0x1fffu, 0u) << x;
    // The two TF32 neighbours of x: truncation and the next value up in magnitude.
    const float lo = from_bits(bits(x) & ~0x1fffu), hi = from_bits((bits(x) & ~0x1fffu) + 0x2000u);
    const double dlo = std::fabs(double(x) - lo), dhi = std::fabs(double(x) - hi);
    ASSERT_TRUE(r == lo || r == hi) << x;
    EXPECT_LE(std::fabs(double(x) - r), std::min(dlo, dhi)) << x;
  }
}

TEST(Tf32Split, TiesGoToEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 (TF32 keeps 10 mantissa bits): to 1 (even).
  EXPECT_EQ(tf32_round(1.0f + std::ldexp(1.0f, -11)), 1.0f);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 (odd) and 1 + 2^-9: up to the even one.
  EXPECT_EQ(tf32_round(1.0f + 3.0f * std::ldexp(1.0f, -11)), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(tf32_round(-(1.0f + std::ldexp(1.0f, -11))), -1.0f);
}

TEST(Tf32Split, KeepsSpecialsAndStaysFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(tf32_round(inf), inf);
  EXPECT_EQ(tf32_round(-inf), -inf);
  EXPECT_TRUE(std::isnan(tf32_round(std::nanf(""))));
  EXPECT_EQ(tf32_round(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(tf32_round(-0.0f)));
  const float big = std::numeric_limits<float>::max();  // would round up to infinity
  float b = 0, s = 0;
  tf32_split(big, &b, &s);
  EXPECT_TRUE(std::isfinite(b));
  EXPECT_TRUE(std::isfinite(s));
  EXPECT_LE(std::fabs(double(b) + double(s) - double(big)), std::ldexp(double(big), -21));
  // Subnormals have fewer significant bits than TF32 keeps: the split is then only good to
  // half a TF32 step (2^12 of the smallest subnormal), far below any value that matters.
  const float denorm = std::numeric_limits<float>::denorm_min();
  tf32_split(denorm * 12345.0f, &b, &s);
  EXPECT_LE(std::fabs(double(b) + double(s) - double(denorm) * 12345.0), double(denorm) * 4096.0);
}

TEST(Tf32Split, SplitReconstructsToTwoToTheMinus22) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  double worst = 0;
  for (int i = 0; i < 100000; ++i) {
    const float x = nd(rng);
    if (x == 0.0f) continue;
    float b = 0, s = 0;
    tf32_split(x, &b, &s);
    EXPECT_EQ(bits(b) & 0x1fffu, 0u);
    EXPECT_EQ(bits(s) & 0x1fffu, 0u);
    worst = std::max(worst, std::fabs((double(b) + double(s) - x) / x));
  }
  EXPECT_LE(worst, std::ldexp(1.0, -21));
  EXPECT_GT(worst, 0.0);  // the split does drop bits: the bound is not vacuous
}

// Dot products of length K as a TF32 tensor core forms them, in fp32: products of TF32 values
// are exact, the accumulation rounds. Relative to sum |a_k b_k|, against double.
struct DotErrors {
  double fp32 = 0, tf32x3 = 0, tf32x1 = 0;
};

DotErrors dot_errors(int K, int trials, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  DotErrors worst;
  for (int t = 0; t < trials; ++t) {
    std::vector<float> a(static_cast<size_t>(K)), b(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) a[size_t(k)] = nd(rng), b[size_t(k)] = nd(rng);
    double exact = 0, mag = 0;
    float f32 = 0, x3 = 0, x1 = 0;
    for (int k = 0; k < K; ++k) {
      const float x = a[size_t(k)], y = b[size_t(k)];
      exact += double(x) * y;
      mag += std::fabs(double(x) * y);
      f32 += x * y;
      float xb = 0, xs = 0, yb = 0, ys = 0;
      tf32_split(x, &xb, &xs);
      tf32_split(y, &yb, &ys);
      x3 += xs * yb;  // the three GEMMs accumulate into one fp32 output, small terms first
      x3 += xb * ys;
      x3 += xb * yb;
      x1 += xb * yb;
    }
    worst.fp32 = std::max(worst.fp32, std::fabs(f32 - exact) / mag);
    worst.tf32x3 = std::max(worst.tf32x3, std::fabs(x3 - exact) / mag);
    worst.tf32x1 = std::max(worst.tf32x1, std::fabs(x1 - exact) / mag);
  }
  return worst;
}

TEST(Tf32Split, ThreeProductsMatchFp32Accuracy) {
  const DotErrors e = dot_errors(2048, 200, 17);
  std::printf("worst error relative to sum |a b|: fp32 %.3g, 3xTF32 %.3g, one TF32 product %.3g\n", e.fp32,
              e.tf32x3, e.tf32x1);
  // Sequential fp32 accumulation's error grows like K * 2^-24 in the worst case; the 3xTF32
  // form accumulates three times as many terms, so allow it three times plain fp32's error.
  EXPECT_LE(e.tf32x3, 3.0 * e.fp32 + std::ldexp(1.0, -22));
  EXPECT_LT(e.tf32x3, 1e-5);
  // One TF32 product per term (plain TF32 GEMMs) is far worse: what the split is for.
  EXPECT_GT(e.tf32x1, 20.0 * e.tf32x3);
}

}  // namespace
}  // namespace zaya
