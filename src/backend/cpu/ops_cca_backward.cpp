// CPU backward of the CCA ops: the two causal convolutions (as transposed GEMMs per head and
// tap), the mean paths + QK-norm + temperature + RoPE (recomputed per token), and the value
// shift. Training runs fresh sequences, so the carried conv/value state is zero.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace zaya {

void CpuBackend::cca_conv_backward(const CcaConvArgs& a, const float* dz, float* du, float* dw_dw, float* db_dw,
                                   float* dw_grp, float* db_grp) {
  if (a.seg_start) return cca_conv_backward_segmented(a, dz, du, dw_dw, db_dw, dw_grp, db_grp);
  const int64_t B = a.B, C = a.C, T = a.T, P = (a.t0 - 1) + (a.t1 - 1), G = a.group, heads = C / G, t0 = a.t0,
                t1 = a.t1;
  const int64_t Ly = T + t1 - 1;
  const int64_t taps = t1 * C * G;
  std::vector<float> wtap(static_cast<size_t>(taps));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t ci = 0; ci < G; ++ci)
      for (int64_t j = 0; j < t1; ++j) wtap[size_t((j * C + c) * G + ci)] = a.w_grp[(c * G + ci) * t1 + j];
  // The sequences run in parallel, each into its own partial weight gradients, which are then
  // summed in sequence order: the result does not depend on the number of threads.
  std::vector<float> dwtap(dw_grp ? static_cast<size_t>(B * taps) : 0, 0.0f);
  std::vector<double> ddw(static_cast<size_t>(B * t0 * C), 0.0), ddb(static_cast<size_t>(B * C), 0.0),
      dbg(db_grp ? static_cast<size_t>(B * C) : 0, 0.0);
  run_team(B > 1 && T * C * G * t1 * B > (int64_t(1) << 18), [&] {
    std::vector<float> ext(static_cast<size_t>((P + T) * C)), y(static_cast<size_t>(Ly * C)),
        dy(static_cast<size_t>(Ly * C));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      const float* ub = a.u + b * T * C;
      const float* dzb = dz + b * T * C;
      std::memset(ext.data(), 0, size_t(P * C) * 4);
      std::memcpy(ext.data() + P * C, ub, size_t(T * C) * 4);
      for (int64_t s = 0; s < Ly; ++s) {  // recompute the depthwise output
        float* ys = y.data() + s * C;
        for (int64_t c = 0; c < C; ++c) ys[c] = a.b_dw[c];
        for (int64_t i = 0; i < t0; ++i) {
          const float* e = ext.data() + (s + i) * C;
          for (int64_t c = 0; c < C; ++c) ys[c] += a.w_dw[c * t0 + i] * e[c];
        }
      }
      if (db_grp)
        for (int64_t t = 0; t < T; ++t) {
          double* d = dbg.data() + b * C;
          const float* g = dzb + t * C;
          for (int64_t c = 0; c < C; ++c) d[c] += g[c];
        }
      // Grouped conv: dY[j..j+T) += dZ_g Wj_g ; dWj_g += dZ_g^T Y_g[j..j+T).
      std::fill(dy.begin(), dy.end(), 0.0f);
      float* dwt = dw_grp ? dwtap.data() + b * taps : nullptr;
      for (int64_t j = 0; j < t1; ++j)
        for (int64_t g = 0; g < heads; ++g) {
          cpu_gemm(false, T, G, G, 1.0f, dzb + g * G, C, wtap.data() + (j * C + g * G) * G, G, 1.0f,
                   dy.data() + j * C + g * G, C);
          if (dwt)
            cpu_gemm_tn(G, G, T, 1.0f, dzb + g * G, C, y.data() + j * C + g * G, C, 1.0f,
                        dwt + (j * C + g * G) * G, G);
        }
      // Depthwise: dext(s+i) += w[c,i] dy(s); dw[c,i] += dy(s) ext(s+i); db += dy(s).
      float* dub = du + b * T * C;
      double* dwb = ddw.data() + b * t0 * C;  // [t0, C]: contiguous over channels
      double* dbb = ddb.data() + b * C;
      for (int64_t s = 0; s < Ly; ++s) {
        const float* g = dy.data() + s * C;
        for (int64_t c = 0; c < C; ++c) dbb[c] += g[c];
        for (int64_t i = 0; i < t0; ++i) {
          const int64_t row = s + i;
          const float* e = ext.data() + row * C;
          double* dwi = dwb + i * C;
          for (int64_t c = 0; c < C; ++c) dwi[c] += double(g[c]) * e[c];
          if (row >= P) {
            float* d = dub + (row - P) * C;
            for (int64_t c = 0; c < C; ++c) d[c] += a.w_dw[c * t0 + i] * g[c];
          }
        }
      }
    }
  });
  for (int64_t c = 0; c < C; ++c) {
    if (dw_dw)
      for (int64_t i = 0; i < t0; ++i) {
        double sum = 0;
        for (int64_t b = 0; b < B; ++b) sum += ddw[size_t((b * t0 + i) * C + c)];
        dw_dw[c * t0 + i] += float(sum);
      }
    if (db_dw) {
      double sum = 0;
      for (int64_t b = 0; b < B; ++b) sum += ddb[size_t(b * C + c)];
      db_dw[c] += float(sum);
    }
    if (db_grp) {
      double sum = 0;
      for (int64_t b = 0; b < B; ++b) sum += dbg[size_t(b * C + c)];
      db_grp[c] += float(sum);
    }
  }
  if (dw_grp)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t ci = 0; ci < G; ++ci)
          for (int64_t j = 0; j < t1; ++j)
            dw_grp[(c * G + ci) * t1 + j] += dwtap[size_t(b * taps + (j * C + c) * G + ci)];
}

void CpuBackend::cca_qk_backward(const CcaQkArgs& a, const float* dq, const float* dk, float* dz, float* du,
                                 float* dtemp) {
  const int64_t Hq = a.Hq, Hkv = a.Hkv, dh = a.dh, rep = Hq / Hkv, C = (Hq + Hkv) * dh, Dq = Hq * dh;
  const int64_t half = a.rotary_dim / 2;
  rope_.cover(a.theta, a.rotary_dim, a.positions, a.N);
  const double sdh = std::sqrt(double(dh));
  // Per-token dtemp contributions, summed in token order afterwards (reproducible).
  std::vector<double> dtemp_tok(static_cast<size_t>(a.N * Hkv), 0.0);

  // Back through rotation and normalisation: dv from d(out) for pre-norm vector v.
  // Returns d(mult) contribution.
  auto back = [&](const float* v, const float* dout, double mult, const float* cs, const float* sn, double* dv) {
    std::vector<double> da(static_cast<size_t>(dh));
    for (int64_t i = 0; i < dh; ++i) da[size_t(i)] = dout[i];
    for (int64_t i = 0; i < half; ++i) {
      const double d1 = dout[i], d2 = dout[i + half];
      da[size_t(i)] = d1 * cs[i] + d2 * sn[i];
      da[size_t(i + half)] = -d1 * sn[i] + d2 * cs[i];
    }
    double ss = 0, vda = 0;
    for (int64_t i = 0; i < dh; ++i) {
      ss += double(v[i]) * v[i];
      vda += double(v[i]) * da[size_t(i)];
    }
    const double nrm = std::sqrt(ss);
    double dmult = vda * sdh / std::max(nrm, double(FLT_EPSILON));
    if (nrm > FLT_EPSILON) {
      const double f = sdh * mult / nrm;
      for (int64_t i = 0; i < dh; ++i) dv[i] = f * (da[size_t(i)] - v[i] * vda / ss);
    } else {
      const double f = sdh * mult / double(FLT_EPSILON);
      for (int64_t i = 0; i < dh; ++i) dv[i] = f * da[size_t(i)];
    }
    return dmult;
  };

#pragma omp parallel if (a.N * C > 32768)
  {
    std::vector<float> cs_scratch(static_cast<size_t>(half)), sn_scratch(static_cast<size_t>(half)),
        v(static_cast<size_t>(dh));
    std::vector<double> dv(static_cast<size_t>(dh));
#pragma omp for
    for (int64_t n = 0; n < a.N; ++n) {
      const float* z = a.z + n * C;
      const float* u = a.u + n * C;
      float* dzn = dz + n * C;
      float* dun = du + n * C;
      const float *cs = nullptr, *sn = nullptr;
      rope_.row(a.positions[n], cs_scratch.data(), sn_scratch.data(), &cs, &sn);
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t g = h / rep;
        for (int64_t i = 0; i < dh; ++i) v[size_t(i)] = z[h * dh + i] + 0.5f * (u[h * dh + i] + u[Dq + g * dh + i]);
        back(v.data(), dq + (n * Hq + h) * dh, 1.0, cs, sn, dv.data());
        for (int64_t i = 0; i < dh; ++i) {
          dzn[h * dh + i] = float(dv[size_t(i)]);
          dun[h * dh + i] += float(0.5 * dv[size_t(i)]);
          dun[Dq + g * dh + i] += float(0.5 * dv[size_t(i)]);
        }
      }
      for (int64_t g = 0; g < Hkv; ++g) {
        for (int64_t i = 0; i < dh; ++i) {
          float mq = 0;
          for (int64_t r = 0; r < rep; ++r) mq += u[(g * rep + r) * dh + i];
          v[size_t(i)] = z[Dq + g * dh + i] + 0.5f * mq / float(rep) + 0.5f * u[Dq + g * dh + i];
        }
        dtemp_tok[size_t(n * Hkv + g)] =
            back(v.data(), dk + (n * Hkv + g) * dh, a.temp[g], cs, sn, dv.data());
        for (int64_t i = 0; i < dh; ++i) {
          dzn[Dq + g * dh + i] = float(dv[size_t(i)]);
          dun[Dq + g * dh + i] += float(0.5 * dv[size_t(i)]);
          for (int64_t r = 0; r < rep; ++r) dun[(g * rep + r) * dh + i] += float(0.5 * dv[size_t(i)] / double(rep));
        }
      }
    }
  }
  if (dtemp)
    for (int64_t g = 0; g < Hkv; ++g) {
      double sum = 0;
      for (int64_t n = 0; n < a.N; ++n) sum += dtemp_tok[size_t(n * Hkv + g)];
      dtemp[g] += float(sum);
    }
}

void CpuBackend::cca_values_backward(const float* dv, float* dv_cur, float* dv_del, int64_t B, int64_t T,
                                     int64_t half, const int32_t* seg_start) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* d = dv + (b * T + t) * 2 * half;
      std::memcpy(dv_cur + (b * T + t) * half, d, size_t(half) * 4);
      const bool doc_start = seg_start && seg_start[b * T + t] == t;
      if (t > 0 && doc_start) std::memset(dv_del + (b * T + t - 1) * half, 0, size_t(half) * 4);
      if (t > 0 && !doc_start) std::memcpy(dv_del + (b * T + t - 1) * half, d + half, size_t(half) * 4);
      if (t == T - 1) std::memset(dv_del + (b * T + t) * half, 0, size_t(half) * 4);
    }
}

}  // namespace zaya
