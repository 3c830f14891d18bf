// Scalar dtype conversions (IEEE half, bfloat16) and bulk converters used by the loaders.
#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace zaya {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  static const struct { const char* name; DType t; } table[] = {
      {"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16},
      {"I32", DType::I32}, {"I64", DType::I64},   {"U8", DType::U8}};
  for (const auto& e : table)
    if (s == e.name) { *out = e.t; return true; }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { mant <<= 1; ++e; } while ((mant & 0x400) == 0);
      mant &= 0x3ff;
      bits = sign | uint32_t(127 - 15 - e) << 23 | mant << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // overflow to inf
  if (a < 6.103515625e-05f) {               // subnormal or zero: scale to integer ulps
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  uint32_t abits = bits & 0x7fffffffu;
  uint32_t rounding = 0xfffu + ((abits >> 13) & 1u);
  abits += rounding;
  return sign | uint16_t(((abits >> 23) - 112) << 10 | ((abits >> 13) & 0x3ff));
}

void convert_to_f32(const void* src, DType t, size_t n, float* dst) {
  const unsigned char* p = static_cast<const unsigned char*>(src);
  switch (t) {
    case DType::F32:
      std::memcpy(dst, p, n * 4);
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    default:
      fail("dtype", std::string("cannot convert ") + dtype_name(t) + " to F32",
           "weights must be stored as F32, BF16 or F16");
  }
}

void convert_from_f32(const float* src, size_t n, DType t, void* dst) {
  unsigned char* p = static_cast<unsigned char*>(dst);
  switch (t) {
    case DType::F32:
      std::memcpy(p, src, n * 4);
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_f16(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
    default:
      fail("dtype", std::string("cannot convert F32 to ") + dtype_name(t));
  }
}

}  // namespace zaya
