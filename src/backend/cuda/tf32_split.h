// fp32 products on TF32 tensor cores at fp32 accuracy ("3xTF32"): a float x is split into
// big = x rounded to TF32 (10 stored mantissa bits) and small = (x - big) rounded to TF32, so
// that x = big + small to about 2^-22 relative. A product a * b is then taken as
//   a_small * b_big + a_big * b_small + a_big * b_big
// (the a_small * b_small term, about 2^-22 relative, is dropped). Each operand is exactly
// representable in TF32, so the tensor cores' input conversion (rounding or truncation) leaves
// it unchanged, and each product of two TF32 values (11 x 11 significant bits) is exact in
// fp32; only the fp32 accumulation rounds. Tensor cores may truncate rather than round inside
// one MMA's sum and the three products land in C by three GEMMs, so the error is a small
// multiple of an fp32 GEMM's (tests/unit/test_tf32_split.cpp models the sums with rounding).
// Plain C++ usable on the host (the CPU unit tests) and in GPU kernels; no vendor header.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cuda/host_device.h"

namespace zaya {

// x rounded to the nearest TF32 value (ties to even): the 13 low mantissa bits become zero.
// Infinities and NaNs are returned unchanged; a finite x that would round past the largest
// finite value is truncated instead, so that big stays finite and x - big exact.
ZAYA_HOST_DEVICE inline float tf32_round(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  constexpr uint32_t kDropped = 0x1fffu;  // the 13 mantissa bits TF32 does not keep
  uint32_t r = u + 0x0fffu + ((u >> 13) & 1u);
  if ((r & 0x7f800000u) == 0x7f800000u) r = u;  // rounding would overflow to infinity
  r &= ~kDropped;
  float y = 0;
  std::memcpy(&y, &r, 4);
  return y;
}

// big + small = x to about 2^-22 relative; both exactly representable in TF32.
ZAYA_HOST_DEVICE inline void tf32_split(float x, float* big, float* small) {
  const float b = tf32_round(x);
  *big = b;
  *small = tf32_round(x - b);  // x - b is exact in fp32
}

}  // namespace zaya
