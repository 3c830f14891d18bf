// Element types zaya stores (f32, bf16, f16 for weights; i32/i64 for indices) and the
// scalar conversions between them. Compute on CPU is fp32; bf16/f16 are storage formats.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace zaya {

enum class DType { F32, BF16, F16, I32, I64, U8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses a safetensors dtype string; returns false for an unknown one.
bool parse_dtype(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of src (dtype t, any alignment) to fp32.
void convert_to_f32(const void* src, DType t, size_t n, float* dst);
// Converts n fp32 values to dtype t (F32, BF16 or F16).
void convert_from_f32(const float* src, size_t n, DType t, void* dst);

}  // namespace zaya
