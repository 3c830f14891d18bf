// Vendor-neutral device helpers shared by the GPU kernels: bf16 storage and conversions,
// launch-size helpers, and block/warp reductions that work for any warp size (32 or 64).
// Block reductions go through shared memory in a fixed tree order, so they are deterministic.
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#if defined(ZAYA_SIMT)
#include "core/dtype.h"  // bf16_to_f32 / f32_to_bf16 for the host emulation of the kernels (tests/simt)
#endif

namespace zaya {

// bf16 as raw storage: the upper 16 bits of an IEEE float.
using bf16_t = uint16_t;

// Threads per block for element-wise and row kernels: a multiple of 32 and of 64.
constexpr int kGpuThreads = 256;

// Whether p is `bytes`-aligned: vector loads (float4, 16-byte cp.async) need 16.
inline bool gpu_aligned(const void* p, uintptr_t bytes = 16) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline unsigned gpu_blocks(int64_t n, int threads = kGpuThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 16) b = 65535LL * 16;  // grid-stride loops cover the rest
  return unsigned(b);
}

// A kernel's dynamic shared memory (the launch's third parameter), 128-byte aligned. The host
// emulation of the GPU (tests/simt) defines its own.
#if !defined(ZAYA_DYNAMIC_SHARED)
#define ZAYA_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(ZAYA_SIMT)

#if !defined(ZAYA_SIMT)  // the host emulation has core/dtype.h's (the same rounding)
// Round-to-nearest-even float -> bf16 (NaN stays NaN), identical to __float2bfloat16_rn.
__device__ inline bf16_t f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t(u >> 16);
}

__device__ inline float bf16_to_f32(bf16_t h) { return __uint_as_float(uint32_t(h) << 16); }
#endif

// Sum over the block; `sh` holds blockDim.x entries; blockDim.x must be a power of two.
// Every thread gets the result.
__device__ inline double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

__device__ inline float block_sum(float v, float* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const float r = sh[0];
  __syncthreads();
  return r;
}

__device__ inline float block_max(float v, float* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  const float r = sh[0];
  __syncthreads();
  return r;
}

// Sum over one warp (GPU_WARP_SIZE lanes, 32 or 64); every lane gets the result.
__device__ inline float warp_sum(float v) {
  for (int m = GPU_WARP_SIZE / 2; m > 0; m /= 2) v += gpu_shfl_xor(v, m);
  return v;
}

// The same in double (a fixed butterfly, so the result does not depend on timing).
__device__ inline double warp_sum(double v) {
  for (int m = GPU_WARP_SIZE / 2; m > 0; m /= 2) v += gpu_shfl_xor(v, m);
  return v;
}

// The exact (erf) GELU, as the CPU's: 0.5 v (1 + erf(v / sqrt 2)).
__device__ inline float gelu_erf(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f)); }

// An activation element as fp32, whether stored as bf16 or as fp32 (the GEMV kernels take both).
__device__ inline float as_f32(bf16_t v) { return bf16_to_f32(v); }
__device__ inline float as_f32(float v) { return v; }

// sum_i a[i] w[i] over eight elements: w eight bf16 already loaded (one 16-byte load), a read
// here from a 16-byte-aligned address, bf16 (one 16-byte load) or fp32 (two).
__device__ inline float dot8(const float* a, uint4 w) {
  const float4 lo = *reinterpret_cast<const float4*>(a), hi = *reinterpret_cast<const float4*>(a + 4);
  const uint32_t p[4] = {w.x, w.y, w.z, w.w};
  return lo.x * bf16_to_f32(bf16_t(p[0] & 0xffffu)) + lo.y * bf16_to_f32(bf16_t(p[0] >> 16)) +
         lo.z * bf16_to_f32(bf16_t(p[1] & 0xffffu)) + lo.w * bf16_to_f32(bf16_t(p[1] >> 16)) +
         hi.x * bf16_to_f32(bf16_t(p[2] & 0xffffu)) + hi.y * bf16_to_f32(bf16_t(p[2] >> 16)) +
         hi.z * bf16_to_f32(bf16_t(p[3] & 0xffffu)) + hi.w * bf16_to_f32(bf16_t(p[3] >> 16));
}

__device__ inline float dot8(const bf16_t* a, uint4 w) {
  const uint4 v = *reinterpret_cast<const uint4*>(a);
  const uint32_t av[4] = {v.x, v.y, v.z, v.w}, wv[4] = {w.x, w.y, w.z, w.w};
  float sum = 0.0f;
  for (int p = 0; p < 4; ++p)  // four pairs: unrolled by the compiler
    sum += bf16_to_f32(bf16_t(av[p] & 0xffffu)) * bf16_to_f32(bf16_t(wv[p] & 0xffffu)) +
           bf16_to_f32(bf16_t(av[p] >> 16)) * bf16_to_f32(bf16_t(wv[p] >> 16));
  return sum;
}

// Eight fp32 weights from a 16-byte-aligned address, loaded at once (two 16-byte loads), and
// their sum of products with eight fp32 activations in the order dot8 takes bf16 weights.
struct F32x8 {
  float4 lo, hi;
};
__device__ inline uint4 load8(const bf16_t* w) { return *reinterpret_cast<const uint4*>(w); }
__device__ inline F32x8 load8(const float* w) {
  return {*reinterpret_cast<const float4*>(w), *reinterpret_cast<const float4*>(w + 4)};
}
__device__ inline float dot8(const float* a, const F32x8& w) {
  const float4 lo = *reinterpret_cast<const float4*>(a), hi = *reinterpret_cast<const float4*>(a + 4);
  return lo.x * w.lo.x + lo.y * w.lo.y + lo.z * w.lo.z + lo.w * w.lo.w + hi.x * w.hi.x + hi.y * w.hi.y +
         hi.z * w.hi.z + hi.w * w.hi.w;
}

// Launch size for kernels with one warp per item (kGpuThreads per block).
inline unsigned gpu_warp_blocks(int64_t items, int warp_size) {
  return gpu_blocks(items * warp_size);
}

#endif

}  // namespace zaya
