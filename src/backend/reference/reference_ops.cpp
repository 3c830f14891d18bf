// Reference ops: the readable definition of each op (see reference_ops.h).
#include "backend/reference/reference_ops.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

namespace zaya::reference {

void linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = bias ? bias[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * w[n * K + k];
      y[m * N + n] = float(acc);
    }
}

void rmsnorm(const float* x, const float* w, float eps, float* y, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = float(w[i] * (x[r * dim + i] * inv));
  }
}

void residual_scale(float* r, const float* h, const float* hs, const float* hb, const float* rs, const float* rb,
                    int64_t rows, int64_t dim) {
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t i = 0; i < dim; ++i) {
      float& ri = r[n * dim + i];
      ri = (h[n * dim + i] + hb[i]) * hs[i] + (ri + rb[i]) * rs[i];
    }
}

void gelu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = float(0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0))));
}

void softmax(float* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * cols;
    double mx = xr[0], sum = 0;
    for (int64_t i = 0; i < cols; ++i) mx = std::max(mx, double(xr[i]));
    for (int64_t i = 0; i < cols; ++i) sum += std::exp(xr[i] - mx);
    for (int64_t i = 0; i < cols; ++i) xr[i] = float(std::exp(xr[i] - mx) / sum);
  }
}

void route_select(const float* probs, const float* bias, int32_t* expert, float* weight, int64_t N, int64_t classes) {
  for (int64_t n = 0; n < N; ++n) {
    int64_t best = 0;
    for (int64_t e = 1; e < classes; ++e)
      if (probs[n * classes + e] + bias[e] > probs[n * classes + best] + bias[best]) best = e;
    expert[n] = int32_t(best);
    weight[n] = probs[n * classes + best];
  }
}

// Two causal convolutions over the raw stream left-padded with the carried state rows.
void cca_conv(const CcaConvArgs& a) {
  const int64_t C = a.C, T = a.T, P = (a.t0 - 1) + (a.t1 - 1), G = a.group;
  for (int64_t b = 0; b < a.B; ++b) {
    auto raw = [&](int64_t j, int64_t c) {  // row j of [state ; u]
      return j < P ? a.state[(b * P + j) * C + c] : a.u[(b * T + j - P) * C + c];
    };
    int64_t first = 0;  // raw rows of earlier documents count as zeros (seg_start)
    auto depthwise = [&](int64_t s, int64_t c) {  // output s covers raw rows s .. s+t0-1
      double acc = a.b_dw[c];
      for (int64_t i = 0; i < a.t0; ++i)
        if (s + i - P >= first) acc += double(a.w_dw[c * a.t0 + i]) * raw(s + i, c);
      return acc;
    };
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        first = a.seg_start ? a.seg_start[b * T + t] : -P;
        const int64_t g0 = (c / G) * G;
        double acc = a.b_grp[c];
        for (int64_t j = 0; j < a.t1; ++j)
          for (int64_t ci = 0; ci < G; ++ci) acc += double(a.w_grp[(c * G + ci) * a.t1 + j]) * depthwise(t + j, g0 + ci);
        a.z[(b * T + t) * C + c] = float(acc);
      }
    std::vector<float> tail(static_cast<size_t>(P * C));
    for (int64_t j = 0; j < P; ++j)
      for (int64_t c = 0; c < C; ++c) tail[size_t(j * C + c)] = raw(T + j, c);
    std::memcpy(a.state + b * P * C, tail.data(), tail.size() * 4);
  }
}

void cca_qk(const CcaQkArgs& a) {
  const int64_t Hq = a.Hq, Hkv = a.Hkv, dh = a.dh, rep = Hq / Hkv, Dq = Hq * dh, C = Dq + Hkv * dh;
  const int64_t half = a.rotary_dim / 2;
  auto finish = [&](std::vector<double>& v, double mult, int64_t pos, float* out) {
    double norm = 0;
    for (double x : v) norm += x * x;
    norm = std::max(std::sqrt(norm), double(FLT_EPSILON));
    for (auto& x : v) x = x * std::sqrt(double(dh)) / norm * mult;
    for (int64_t i = 0; i < half; ++i) {
      double ang = double(pos) * std::pow(a.theta, -2.0 * double(i) / double(a.rotary_dim));
      double x1 = v[size_t(i)], x2 = v[size_t(i + half)];
      v[size_t(i)] = x1 * std::cos(ang) - x2 * std::sin(ang);
      v[size_t(i + half)] = x2 * std::cos(ang) + x1 * std::sin(ang);
    }
    for (int64_t i = 0; i < dh; ++i) out[i] = float(v[size_t(i)]);
  };
  for (int64_t n = 0; n < a.N; ++n) {
    const float* z = a.z + n * C;
    const float* u = a.u + n * C;
    for (int64_t h = 0; h < Hq; ++h) {  // Q[h] = z_q[h] + 0.5 (q[h] + k[g(h)])
      std::vector<double> v(static_cast<size_t>(dh));
      for (int64_t i = 0; i < dh; ++i) v[size_t(i)] = z[h * dh + i] + 0.5 * (u[h * dh + i] + u[Dq + (h / rep) * dh + i]);
      finish(v, 1.0, a.positions[n], a.q + (n * Hq + h) * dh);
    }
    for (int64_t g = 0; g < Hkv; ++g) {  // K[g] = z_k[g] + 0.5 mean(q[group g]) + 0.5 k[g]
      std::vector<double> v(static_cast<size_t>(dh));
      for (int64_t i = 0; i < dh; ++i) {
        double mq = 0;
        for (int64_t r = 0; r < rep; ++r) mq += u[(g * rep + r) * dh + i];
        v[size_t(i)] = z[Dq + g * dh + i] + 0.5 * mq / double(rep) + 0.5 * u[Dq + g * dh + i];
      }
      finish(v, a.temp[g], a.positions[n], a.k + (n * Hkv + g) * dh);
    }
  }
}

void cca_values(const CcaValueArgs& a) {
  for (int64_t b = 0; b < a.B; ++b) {
    for (int64_t t = 0; t < a.T; ++t)
      for (int64_t i = 0; i < a.half; ++i) {
        a.v[(b * a.T + t) * 2 * a.half + i] = a.v_cur[(b * a.T + t) * a.half + i];
        const bool doc_start = a.seg_start && t > 0 && a.seg_start[b * a.T + t] == t;
        a.v[(b * a.T + t) * 2 * a.half + a.half + i] =
            doc_start ? 0.0f : t == 0 ? a.v_state[b * a.half + i] : a.v_del[(b * a.T + t - 1) * a.half + i];
      }
    for (int64_t i = 0; i < a.half; ++i) a.v_state[b * a.half + i] = a.v_del[(b * a.T + a.T - 1) * a.half + i];
  }
}

// Full softmax over every visible key, one query at a time.
void attention(const AttentionArgs& a) {
  const int64_t rep = a.Hq / a.Hkv, dh = a.dh;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t t = 0; t < a.T; ++t)
      for (int64_t h = 0; h < a.Hq; ++h) {
        const int64_t p = a.pos0[b] + t, g = h / rep;
        const float* q = a.q + ((b * a.T + t) * a.Hq + h) * dh;
        std::vector<double> score(static_cast<size_t>(p + 1), -INFINITY);
        double mx = -INFINITY;
        for (int64_t s = 0; s <= p; ++s) {
          if (a.window > 0 && p - s >= a.window) continue;
          if (a.seg_start && s < a.seg_start[b * a.T + t]) continue;
          const float* k = a.k_cache + ((b * a.S + s) * a.Hkv + g) * dh;
          double d = 0;
          for (int64_t i = 0; i < dh; ++i) d += double(q[i]) * k[i];
          score[size_t(s)] = d * a.scale;
          mx = std::max(mx, score[size_t(s)]);
        }
        double sum = 0;
        for (auto& s : score) sum += (s = std::exp(s - mx));
        float* o = a.out + ((b * a.T + t) * a.Hq + h) * dh;
        for (int64_t i = 0; i < dh; ++i) {
          double acc = 0;
          for (int64_t s = 0; s <= p; ++s) acc += score[size_t(s)] * a.v_cache[((b * a.S + s) * a.Hkv + g) * dh + i];
          o[i] = float(acc / sum);
        }
      }
}

// One token at a time: out = w * down(SiLU(gate x) * up x), or the skip output.
void moe(const MoeArgs& a) {
  std::vector<double> act(static_cast<size_t>(a.I));
  for (int64_t n = 0; n < a.N; ++n) {
    const float* x = a.x + n * a.D;
    float* out = a.out + n * a.D;
    const int64_t e = a.expert[n];
    if (e == a.E) {
      for (int64_t d = 0; d < a.D; ++d) out[d] = a.skip_identity ? a.weight[n] * x[d] : 0.0f;
      continue;
    }
    const float* gu = a.gate_up + e * 2 * a.I * a.D;
    const float* dn = a.down + e * a.D * a.I;
    for (int64_t j = 0; j < a.I; ++j) {
      double g = 0, u = 0;
      for (int64_t d = 0; d < a.D; ++d) {
        g += double(gu[j * a.D + d]) * x[d];
        u += double(gu[(a.I + j) * a.D + d]) * x[d];
      }
      act[size_t(j)] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int64_t d = 0; d < a.D; ++d) {
      double acc = 0;
      for (int64_t j = 0; j < a.I; ++j) acc += act[size_t(j)] * dn[d * a.I + j];
      out[d] = float(a.weight[n] * acc);
    }
  }
}

}  // namespace zaya::reference
