// Scalar and bulk dtype conversions: IEEE half (normals, subnormals, inf, NaN, rounding) and
// bfloat16 (round-to-nearest-even, NaN preservation).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

}  // namespace

TEST(DType, SizesNamesAndParsing) {
  using zaya::DType;
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8}) {
    DType back;
    ASSERT_TRUE(zaya::parse_dtype(zaya::dtype_name(t), &back)) << zaya::dtype_name(t);
    EXPECT_EQ(back, t);
  }
  EXPECT_EQ(zaya::dtype_size(DType::F32), 4u);
  EXPECT_EQ(zaya::dtype_size(DType::BF16), 2u);
  EXPECT_EQ(zaya::dtype_size(DType::F16), 2u);
  EXPECT_EQ(zaya::dtype_size(DType::I64), 8u);
  EXPECT_EQ(zaya::dtype_size(DType::U8), 1u);
  DType t;
  EXPECT_FALSE(zaya::parse_dtype("F64", &t));
  EXPECT_FALSE(zaya::parse_dtype("f32", &t));
  EXPECT_FALSE(zaya::parse_dtype("", &t));
}

TEST(DType, F16ToF32Specials) {
  EXPECT_EQ(zaya::f16_to_f32(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(zaya::f16_to_f32(0x8000)));
  EXPECT_EQ(zaya::f16_to_f32(0x8000), 0.0f);
  EXPECT_EQ(zaya::f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(zaya::f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(zaya::f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(zaya::f16_to_f32(0x7bff), 65504.0f);               // largest finite
  EXPECT_EQ(zaya::f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(zaya::f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(zaya::f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(zaya::f16_to_f32(0x8201), -std::ldexp(513.0f, -24));
  EXPECT_EQ(zaya::f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(zaya::f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(zaya::f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(zaya::f16_to_f32(0x7c01)));
  EXPECT_TRUE(std::isnan(zaya::f16_to_f32(0xfe00)));
}

TEST(DType, F16ToF32MatchesDefinitionForAllValues) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 31) continue;
    double v = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, int(e) - 15);
    if (h & 0x8000) v = -v;
    ASSERT_EQ(zaya::f16_to_f32(uint16_t(h)), float(v)) << std::hex << h;
  }
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = zaya::f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(zaya::f16_to_f32(zaya::f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(zaya::f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(DType, F32ToF16Rounding) {
  // Ties go to the even significand.
  EXPECT_EQ(zaya::f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // halfway 1.0 | 1+2^-10
  EXPECT_EQ(zaya::f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // halfway, rounds up to even
  EXPECT_EQ(zaya::f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);  // above half
  // Overflow: 65519 rounds to 65504, 65520 (halfway to 2^16) rounds to infinity.
  EXPECT_EQ(zaya::f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(zaya::f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(zaya::f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(zaya::f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(zaya::f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(zaya::f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  // Subnormals: half the smallest subnormal ties to zero, 1.5x rounds to 2 ulps.
  EXPECT_EQ(zaya::f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(zaya::f32_to_f16(std::ldexp(1.0001f, -25)), 0x0001);
  EXPECT_EQ(zaya::f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(zaya::f32_to_f16(-std::ldexp(3.0f, -25)), 0x8002);
  EXPECT_EQ(zaya::f32_to_f16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(zaya::f32_to_f16(-std::ldexp(1.0f, -30)), 0x8000);  // keeps the sign
  // The largest subnormal plus half an ulp rounds (to even) into the smallest normal.
  EXPECT_EQ(zaya::f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);
  EXPECT_EQ(zaya::f32_to_f16(std::ldexp(1022.5f, -24)), 0x03fe);
  // Just below the smallest normal.
  EXPECT_EQ(zaya::f32_to_f16(std::nextafter(std::ldexp(1.0f, -14), 0.0f)), 0x0400);
  // NaN stays NaN (sign kept).
  uint16_t n = zaya::f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(n & 0x7c00, 0x7c00);
  EXPECT_NE(n & 0x03ff, 0);
  EXPECT_EQ(zaya::f32_to_f16(-std::numeric_limits<float>::quiet_NaN()) & 0x8000, 0x8000);
}

TEST(DType, F32ToF16IsNearestForManyValues) {
  // Compare against a brute-force nearest search over the f16 neighbours.
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    uint32_t exp = 97 + (state >> 24) % 47;  // magnitudes 2^-30 .. 2^16: f16 subnormals to overflow
    uint32_t sign = state & 0x80000000u;
    state = state * 1664525u + 1013904223u;
    float f = from_bits(sign | exp << 23 | (state & 0x7fffffu));
    if (!std::isfinite(f) || std::fabs(f) >= 65520.0f) continue;
    uint16_t h = zaya::f32_to_f16(f);
    double got = zaya::f16_to_f32(h);
    double err = std::fabs(got - double(f));
    uint16_t mag = h & 0x7fff;
    for (int d : {-1, 1}) {
      int nb = int(mag) + d;
      if (nb < 0 || nb > 0x7bff) continue;
      double alt = zaya::f16_to_f32(uint16_t((h & 0x8000) | nb));
      double alt_err = std::fabs(alt - double(f));
      ASSERT_TRUE(err < alt_err || (err == alt_err && (mag & 1) == 0))
          << f << " -> " << std::hex << h << " but neighbour " << nb << " is closer";
    }
  }
}

TEST(DType, BF16RoundToNearestEven) {
  EXPECT_EQ(zaya::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(zaya::f32_to_bf16(-1.0f), 0xbf80);
  EXPECT_EQ(zaya::f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(zaya::f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(zaya::f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(zaya::f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(zaya::f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // above half
  EXPECT_EQ(zaya::f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);  // below half
  EXPECT_EQ(zaya::f32_to_bf16(from_bits(0x3fffffffu)), 0x4000);  // carries into the exponent
  EXPECT_EQ(zaya::f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_EQ(zaya::f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(zaya::f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(zaya::f32_to_bf16(from_bits(0x00000001u)), 0x0000);  // tiny subnormal
  EXPECT_EQ(zaya::f32_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormal tie to even
  // NaN stays NaN, even one whose payload is only in the low bits.
  for (uint32_t b : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    uint16_t h = zaya::f32_to_bf16(from_bits(b));
    EXPECT_TRUE(std::isnan(zaya::bf16_to_f32(h))) << std::hex << b;
    EXPECT_EQ(h & 0x8000, (b >> 16) & 0x8000);
  }
  // bf16 -> f32 is exact, and every non-NaN bf16 round-trips.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = zaya::bf16_to_f32(uint16_t(h));
    ASSERT_EQ(bits_of(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(zaya::f32_to_bf16(f), h) << std::hex << h;
    }
  }
}

TEST(DType, BulkConversions) {
  std::vector<float> src = {0.0f, 1.0f, -2.5f, 3.14159f, 1e-6f, 60000.0f, -0.0f};
  const size_t n = src.size();
  // Deliberately misaligned buffers.
  std::vector<unsigned char> buf(4 * n + 1);
  for (zaya::DType t : {zaya::DType::F32, zaya::DType::BF16, zaya::DType::F16}) {
    zaya::convert_from_f32(src.data(), n, t, buf.data() + 1);
    std::vector<float> back(n);
    zaya::convert_to_f32(buf.data() + 1, t, n, back.data());
    for (size_t i = 0; i < n; ++i) {
      float expect = src[i];
      if (t == zaya::DType::BF16) expect = zaya::bf16_to_f32(zaya::f32_to_bf16(src[i]));
      if (t == zaya::DType::F16) expect = zaya::f16_to_f32(zaya::f32_to_f16(src[i]));
      EXPECT_EQ(bits_of(back[i]), bits_of(expect)) << zaya::dtype_name(t) << " " << i;
    }
  }
  float dst[1];
  int32_t i32 = 1;
  EXPECT_THROW(zaya::convert_to_f32(&i32, zaya::DType::I32, 1, dst), zaya::Error);
  EXPECT_THROW(zaya::convert_from_f32(dst, 1, zaya::DType::I64, buf.data()), zaya::Error);
}
