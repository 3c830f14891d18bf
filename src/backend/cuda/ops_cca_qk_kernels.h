// The kernels of the CCA projection tail's forward (ops_cca.cu launches them): the RoPE
// cos/sin table per token, and one warp per (token, head) for the mean paths, QK-norm, key
// temperature and partial NeoX RoPE, its lanes striding over the head's dims for any warp size
// (32, or 64 on CDNA). A header so that the host emulation of the GPU (tests/simt, ZAYA_SIMT)
// compiles the very same kernels, with 32- and 64-lane warps, and checks them without a GPU.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "backend/cuda/gpu_device.h"

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(ZAYA_SIMT)

namespace zaya::cca_qk_fwd {

// cos and sin of position * theta^(-2k / rotary_dim), in double, rounded to float: an entry of
// k_rope_table, or one k_cca_qk computes in place.
__device__ inline void rope_cos_sin(int64_t position, int64_t k, int64_t rotary_dim, double theta, float& c,
                                    float& s) {
  const double inv_freq = pow(theta, -2.0 * double(k) / double(rotary_dim));
  const double ang = double(position) * inv_freq;
  c = float(cos(ang));
  s = float(sin(ang));
}

__global__ void k_rope_table(const int64_t* positions, int64_t N, int64_t half, int64_t rotary_dim, double theta,
                             float* cs, float* sn) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * half; i += int64_t(gridDim.x) * blockDim.x)
    rope_cos_sin(positions[i / half], i % half, rotary_dim, theta, cs[i], sn[i]);
}

// Where k_cca_qk finds each token's rotation: the table (cs, sn: [N, half], k_rope_table) or,
// when cs is null, computed in place from the device positions (a few tokens, as decode makes
// them, where building the table would be a launch of its own for a handful of entries).
struct RopeSource {
  const float* cs = nullptr;
  const float* sn = nullptr;
  const int64_t* positions = nullptr;
  int64_t rotary_dim = 0;
  double theta = 0;
};

// Pre-norm value of element i of head `head` (q heads first, then kv heads) for token row z/u.
__device__ inline float qk_value(const float* z, const float* u, int64_t head, int64_t i, int64_t Hq, int64_t dh,
                                 int64_t rep) {
  const int64_t Dq = Hq * dh;
  if (head < Hq) {
    const int64_t g = head / rep;
    const float res = 0.5f * (u[head * dh + i] + u[Dq + g * dh + i]);
    return z[head * dh + i] + res;
  }
  const int64_t g = head - Hq;
  float kg = 0.0f;
  for (int64_t r = 0; r < rep; ++r) kg += 0.5f * (u[(g * rep + r) * dh + i] + u[Dq + g * dh + i]);
  return z[Dq + g * dh + i] + kg / float(rep);
}

// One warp per (token, head): normalise (x temperature for keys), then rotate the first
// rotary_dim dims (NeoX rotate-half). The lanes stride over the head's dims (coalesced), and
// the sum of squares is a fixed butterfly. Recomputes the pre-norm value instead of storing it.
__global__ void k_cca_qk(const float* zz, const float* uu, const float* temp, RopeSource rope, float* q, float* k,
                         int64_t N, int64_t Hq, int64_t Hkv, int64_t dh, int64_t half) {
  const int64_t C = (Hq + Hkv) * dh, rep = Hq / Hkv, heads = Hq + Hkv;
  const float scale = sqrtf(float(dh));
  const int64_t lane = threadIdx.x % GPU_WARP_SIZE, warps = int64_t(gridDim.x) * (blockDim.x / GPU_WARP_SIZE);
  for (int64_t item = int64_t(blockIdx.x) * (blockDim.x / GPU_WARP_SIZE) + threadIdx.x / GPU_WARP_SIZE;
       item < N * heads; item += warps) {
    const int64_t n = item / heads, head = item % heads;
    const float* z = zz + n * C;
    const float* u = uu + n * C;
    const float mult = head < Hq ? 1.0f : temp[head - Hq];
    float* out = head < Hq ? q + (n * Hq + head) * dh : k + (n * Hkv + (head - Hq)) * dh;
    double ss = 0;
    for (int64_t i = lane; i < dh; i += GPU_WARP_SIZE) {
      const float v = qk_value(z, u, head, i, Hq, dh, rep);
      ss += double(v) * v;
    }
    ss = warp_sum(ss);
    const float f = scale / fmaxf(float(sqrt(ss)), FLT_EPSILON) * mult;
    for (int64_t i = lane; i < half; i += GPU_WARP_SIZE) {
      const float x1 = qk_value(z, u, head, i, Hq, dh, rep) * f;
      const float x2 = qk_value(z, u, head, i + half, Hq, dh, rep) * f;
      float c, s;
      if (rope.cs != nullptr) {
        c = rope.cs[n * half + i];
        s = rope.sn[n * half + i];
      } else {
        rope_cos_sin(rope.positions[n], i, rope.rotary_dim, rope.theta, c, s);
      }
      out[i] = x1 * c - x2 * s;
      out[i + half] = x2 * c + x1 * s;
    }
    for (int64_t i = 2 * half + lane; i < dh; i += GPU_WARP_SIZE) out[i] = qk_value(z, u, head, i, Hq, dh, rep) * f;
  }
}

}  // namespace zaya::cca_qk_fwd

#endif
