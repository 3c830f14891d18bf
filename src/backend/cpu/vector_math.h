// Loops over float rows that GCC vectorises: exp, max and sum. The C library's expf is a call
// per element, which no loop around it can vectorise without -ffast-math, and a plain max or
// sum loop is one long dependency chain (no reassociation without -ffast-math either).
//
// exp_vectorisable: Range reduction x = n ln2 + r with ln2 split in two parts (Cody-Waite), a
// degree-6 polynomial for e^r on |r| <= ln2/2 (the Cephes expf coefficients), then 2^n set in the
// exponent bits. Within 2 ulp of the exact value over the normal range (tested against
// std::exp in double; measured within 1 ulp); exp(-inf) and anything below ln(FLT_MIN) give 0
// (no subnormal results but exp(kMin) itself), above ln(FLT_MAX) +inf, NaN stays NaN. Element for element the
// same bits whether a loop ran vectorised or not: it is plain arithmetic, no lookup tables.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace zaya {

inline float exp_vectorisable(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kMax = 88.7228391f;   // ln(FLT_MAX)
  constexpr float kMin = -87.3365448f;  // ln(FLT_MIN): below it the result would be subnormal
  // A NaN takes kMin here (every comparison with it is false), so the conversion to int below
  // stays defined; the last line returns the NaN itself.
  float xc = x > kMin ? x : kMin;
  xc = xc < kMax ? xc : kMax;
  // Round to the nearest integer by adding and subtracting 1.5 * 2^23 (|xc log2e| < 2^22), which
  // vectorises where std::nearbyint and std::floor calls would not.
  constexpr float kRound = 12582912.0f;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n for n in [-126, 128] as two factors, each a normal float (n = 128 only near kMax, where
  // the product rounds to the correctly rounded result, FLT_MAX or +inf).
  const int32_t ni = int32_t(n);
  const float half1 = std::bit_cast<float>(int32_t(((ni >> 1) + 127) << 23));
  const float half2 = std::bit_cast<float>(int32_t((ni - (ni >> 1) + 127) << 23));
  float y = p * half1 * half2;
  y = x < kMin ? 0.0f : y;
  y = x > kMax ? INFINITY : y;
  return x != x ? x : y;
}

// x[i] = exp(x[i] - shift) for i < n.
inline void exp_shifted_inplace(float* x, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) x[i] = exp_vectorisable(x[i] - shift);
}

// The reductions keep kLanes partial results, element i in lane i % kLanes, combined in lane
// order at the end: a fixed order, so the result depends only on the values and n.
inline constexpr int64_t kLanes = 8;

// max(init, x[0..n)); NaNs are not propagated (a comparison with one is false).
inline float max_of(const float* x, int64_t n, float init) {
  float lane[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lane[l] = init;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  for (; i < n; ++i) lane[i % kLanes] = x[i] > lane[i % kLanes] ? x[i] : lane[i % kLanes];
  float m = lane[0];
  for (int64_t l = 1; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  return m;
}

// sum of x[0..n), accumulated in double.
inline double sum_of(const float* x, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += double(x[i + l]);
  for (; i < n; ++i) lane[i % kLanes] += double(x[i]);
  double s = 0;
  for (int64_t l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}

// sum of x[i] * y[i] over [0, n), products and sum in double.
inline double dot_of(const float* x, const float* y, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += double(x[i + l]) * double(y[i + l]);
  for (; i < n; ++i) lane[i % kLanes] += double(x[i]) * double(y[i]);
  double s = 0;
  for (int64_t l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}

}  // namespace zaya
