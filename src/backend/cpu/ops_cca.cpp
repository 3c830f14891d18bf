// CPU ops for Compressed Convolutional Attention (spec A.5–A.6): the two-stage causal conv
// over the raw q‖k stream with carried state, the mean paths + QK-norm + key temperature +
// partial NeoX RoPE, the current/delayed value heads, and KV-cache writes.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace zaya {

void CpuBackend::cca_conv(const CcaConvArgs& a) {
  if (a.seg_start) return cca_conv_segmented(a);
  const int64_t C = a.C, T = a.T, P = (a.t0 - 1) + (a.t1 - 1), G = a.group, heads = C / G;
  const int64_t Ly = T + a.t1 - 1;  // depthwise outputs needed by the grouped conv
  // Long chunks: repack the grouped weight [C, G, t1] into one [C, G] matrix per tap for GEMMs.
  // Short chunks (decode): direct dot products over the weight as stored, no repacking.
  const bool direct = T < 8;
  std::vector<float> wtap(direct ? 0 : static_cast<size_t>(a.t1 * C * G));
  if (!direct)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t ci = 0; ci < G; ++ci)
        for (int64_t j = 0; j < a.t1; ++j) wtap[size_t((j * C + c) * G + ci)] = a.w_grp[(c * G + ci) * a.t1 + j];
  std::vector<float> ext(static_cast<size_t>((P + T) * C)), y(static_cast<size_t>(Ly * C));
  for (int64_t b = 0; b < a.B; ++b) {
    float* state = a.state + b * P * C;
    const float* u = a.u + b * T * C;
    float* z = a.z + b * T * C;
    std::memcpy(ext.data(), state, size_t(P * C) * 4);
    std::memcpy(ext.data() + P * C, u, size_t(T * C) * 4);
    // Depthwise: y(s)[c] = b[c] + sum_i w[c,i] * ext(s+i)[c]
#pragma omp parallel for if (Ly * C > 65536)
    for (int64_t s = 0; s < Ly; ++s) {
      float* ys = y.data() + s * C;
      for (int64_t c = 0; c < C; ++c) ys[c] = a.b_dw[c];
      for (int64_t i = 0; i < a.t0; ++i) {
        const float* e = ext.data() + (s + i) * C;
        for (int64_t c = 0; c < C; ++c) ys[c] += a.w_dw[c * a.t0 + i] * e[c];
      }
    }
    // Grouped: z(t)[head g] = b + sum_j y(t+j)[g] . Wj[g]^T, one GEMM per head and tap.
    if (direct) {
#pragma omp parallel for if (T * C * G * a.t1 > 65536)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t t = 0; t < T; ++t) {
          const float* w = a.w_grp + c * G * a.t1;
          const float* yg = y.data() + t * C + (c / G) * G;
          float acc = a.b_grp[c];
          for (int64_t j = 0; j < a.t1; ++j) {
            const float* yj = yg + j * C;
#pragma omp simd reduction(+ : acc)
            for (int64_t ci = 0; ci < G; ++ci) acc += w[ci * a.t1 + j] * yj[ci];
          }
          z[t * C + c] = acc;
        }
    } else {
      for (int64_t t = 0; t < T; ++t) std::memcpy(z + t * C, a.b_grp, size_t(C) * 4);
      run_team(T * C * G > (int64_t(1) << 18), [&] {
#pragma omp for
        for (int64_t g = 0; g < heads; ++g)
          for (int64_t j = 0; j < a.t1; ++j)
            cpu_gemm(true, T, G, G, 1.0f, y.data() + j * C + g * G, C, wtap.data() + (j * C + g * G) * G, G,
                     1.0f, z + g * G, C);
      });
    }
    // New state: the last P raw rows.
    std::memcpy(state, ext.data() + T * C, size_t(P * C) * 4);
  }
}

void CpuBackend::cca_qk(const CcaQkArgs& a) {
  const int64_t Hq = a.Hq, Hkv = a.Hkv, dh = a.dh, rep = Hq / Hkv, C = (Hq + Hkv) * dh, Dq = Hq * dh;
  const int64_t half = a.rotary_dim / 2;
  rope_.cover(a.theta, a.rotary_dim, a.positions, a.N);
  const float scale = std::sqrt(float(dh));

  auto normalise_rotate = [&](float* x, float mult, const float* cs, const float* sn) {
    double ss = 0;
    for (int64_t i = 0; i < dh; ++i) ss += double(x[i]) * x[i];
    float f = scale / std::max(float(std::sqrt(ss)), FLT_EPSILON) * mult;
    for (int64_t i = 0; i < dh; ++i) x[i] *= f;
    for (int64_t i = 0; i < half; ++i) {
      float x1 = x[i], x2 = x[i + half];
      x[i] = x1 * cs[i] - x2 * sn[i];
      x[i + half] = x2 * cs[i] + x1 * sn[i];
    }
  };

#pragma omp parallel if (a.N * (Hq + Hkv) * dh > 32768)
  {
    std::vector<float> cs_scratch(static_cast<size_t>(half)), sn_scratch(static_cast<size_t>(half));
#pragma omp for
    for (int64_t n = 0; n < a.N; ++n) {
      const float* z = a.z + n * C;
      const float* u = a.u + n * C;
      float* q = a.q + n * Dq;
      float* k = a.k + n * Hkv * dh;
      const float *cs = nullptr, *sn = nullptr;
      rope_.row(a.positions[n], cs_scratch.data(), sn_scratch.data(), &cs, &sn);
      for (int64_t g = 0; g < Hkv; ++g) {
        const float* ug = u + Dq + g * dh;
        float* kg = k + g * dh;
        for (int64_t i = 0; i < dh; ++i) kg[i] = 0.0f;
        for (int64_t r = 0; r < rep; ++r) {
          int64_t h = g * rep + r;
          const float* uh = u + h * dh;
          float* qh = q + h * dh;
          for (int64_t i = 0; i < dh; ++i) {
            float res = 0.5f * (uh[i] + ug[i]);
            qh[i] = z[h * dh + i] + res;
            kg[i] += res;
          }
        }
        for (int64_t i = 0; i < dh; ++i) kg[i] = z[Dq + g * dh + i] + kg[i] / float(rep);
        normalise_rotate(kg, a.temp[g], cs, sn);
      }
      for (int64_t h = 0; h < Hq; ++h) normalise_rotate(q + h * dh, 1.0f, cs, sn);
    }
  }
}

void CpuBackend::cca_values(const CcaValueArgs& a) {
  const int64_t h = a.half, W = 2 * h;
  for (int64_t b = 0; b < a.B; ++b) {
    float* state = a.v_state + b * h;
    for (int64_t t = 0; t < a.T; ++t) {
      float* v = a.v + (b * a.T + t) * W;
      std::memcpy(v, a.v_cur + (b * a.T + t) * h, size_t(h) * 4);
      if (a.seg_start && t > 0 && a.seg_start[b * a.T + t] == t) {  // a document starts here
        std::memset(v + h, 0, size_t(h) * 4);
        continue;
      }
      const float* prev = t == 0 ? state : a.v_del + (b * a.T + t - 1) * h;
      std::memcpy(v + h, prev, size_t(h) * 4);
    }
    if (a.T > 0) std::memcpy(state, a.v_del + (b * a.T + a.T - 1) * h, size_t(h) * 4);
  }
}

void CpuBackend::cache_write(const float* src, float* cache, const int64_t* pos0, int64_t B, int64_t T, int64_t S,
                             int64_t W) {
  if (src == cache) return;  // training: the chunk is the whole cache (S == T, pos0 == 0)
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(cache + (b * S + pos0[b]) * W, src + b * T * W, size_t(T * W) * 4);
}

}  // namespace zaya
