// CPU backward of causal GQA attention, flash-style: per query
// block, recompute scores and the row log-sum-exp, then dP = dO V^T, dS = P (dP - rowsum(dO O)),
// dQ = dS K scale, dK += dS^T Q scale, dV += P^T dO. One job per (sequence, KV head) so the
// shared dK/dV rows of a query-head group are owned by one thread. Queries sit at positions
// pos0[b] + t over S cache rows (a context-parallel chunk sees the whole gathered sequence);
// dK/dV cover all S rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vector_math.h"

namespace zaya {

namespace {
constexpr int64_t kQB = 64;
constexpr int64_t kKB = 128;
}  // namespace

void CpuBackend::attention_backward(const AttentionArgs& a, const float* dout, float* dq, float* dk, float* dv) {
  check_attention_rows(a, "cpu", "attention_backward");
  const int64_t dh = a.dh, rep = a.Hq / a.Hkv, T = a.T, qs = a.Hq * dh, kvs = a.Hkv * dh;
  std::memset(dk, 0, size_t(a.B * a.S * kvs) * 4);
  std::memset(dv, 0, size_t(a.B * a.S * kvs) * 4);
  run_team(a.B * T * a.S * a.Hq * dh > (int64_t(1) << 20), [&] {
    std::vector<float> S(static_cast<size_t>(kQB * kKB)), dP(static_cast<size_t>(kQB * kKB));
    std::vector<float> lse(static_cast<size_t>(kQB)), Drow(static_cast<size_t>(kQB));
    std::vector<float> row_max(static_cast<size_t>(kQB)), row_sum(static_cast<size_t>(kQB));
#pragma omp for schedule(dynamic)
    for (int64_t job = 0; job < a.B * a.Hkv; ++job) {
      const int64_t b = job / a.Hkv, g = job % a.Hkv;
      const float* K = a.k_cache + b * a.S * kvs + g * dh;
      const float* V = a.v_cache + b * a.S * kvs + g * dh;
      float* dK = dk + b * a.S * kvs + g * dh;
      float* dV = dv + b * a.S * kvs + g * dh;
      for (int64_t h = g * rep; h < (g + 1) * rep; ++h)
        for (int64_t t0 = 0; t0 < T; t0 += kQB) {
          const int64_t nq = std::min(kQB, T - t0);
          const float* Q = a.q + (b * T + t0) * qs + h * dh;
          const float* O = a.out + (b * T + t0) * qs + h * dh;
          const float* dO = dout + (b * T + t0) * qs + h * dh;
          float* dQ = dq + (b * T + t0) * qs + h * dh;
          const int64_t p0 = a.pos0[b] + t0;  // position of the block's first query
          int64_t s_begin = a.window > 0 ? std::max<int64_t>(0, p0 - a.window + 1) : 0;
          const int32_t* seg = a.seg_start ? a.seg_start + b * T : nullptr;  // by query row; key positions
          if (seg) s_begin = std::max<int64_t>(s_begin, seg[t0]);
          const int64_t s_end = p0 + nq;
          // Row i sees keys [first(i), p0 + i]: columns [lo, hi) of the block at s0.
          auto visible_columns = [&](int64_t i, int64_t s0, int64_t nk) {
            const int64_t p = p0 + i;
            int64_t first = a.window > 0 ? p - a.window + 1 : 0;
            if (seg) first = std::max<int64_t>(first, seg[t0 + i]);
            const int64_t lo = std::clamp<int64_t>(first - s0, 0, nk);
            return std::pair<int64_t, int64_t>(lo, std::clamp<int64_t>(p + 1 - s0, lo, nk));
          };
          // Pass 1: row log-sum-exp over all visible keys (online, as the forward); D = rowsum(dO * O).
          std::fill(row_max.begin(), row_max.begin() + nq, -INFINITY);
          std::fill(row_sum.begin(), row_sum.begin() + nq, 0.0f);
          for (int64_t s0 = s_begin; s0 < s_end; s0 += kKB) {
            const int64_t nk = std::min(kKB, s_end - s0);
            cpu_gemm(true, nq, nk, dh, a.scale, Q, qs, K + s0 * kvs, kvs, 0.0f, S.data(), nk);
            for (int64_t i = 0; i < nq; ++i) {
              const auto [lo, hi] = visible_columns(i, s0, nk);
              if (lo == hi) continue;
              float* srow = S.data() + i * nk;
              const float mx = max_of(srow + lo, hi - lo, row_max[size_t(i)]);
              exp_shifted_inplace(srow + lo, hi - lo, mx);
              row_sum[size_t(i)] = row_sum[size_t(i)] * exp_vectorisable(row_max[size_t(i)] - mx) +
                                   float(sum_of(srow + lo, hi - lo));
              row_max[size_t(i)] = mx;
            }
          }
          for (int64_t i = 0; i < nq; ++i) {
            lse[size_t(i)] = row_max[size_t(i)] + std::log(row_sum[size_t(i)]);
            double d = 0;
            for (int64_t e = 0; e < dh; ++e) d += double(dO[i * qs + e]) * O[i * qs + e];
            Drow[size_t(i)] = float(d);
            std::memset(dQ + i * qs, 0, size_t(dh) * 4);
          }
          // Pass 2: gradients block by block.
          for (int64_t s0 = s_begin; s0 < s_end; s0 += kKB) {
            const int64_t nk = std::min(kKB, s_end - s0);
            cpu_gemm(true, nq, nk, dh, a.scale, Q, qs, K + s0 * kvs, kvs, 0.0f, S.data(), nk);
            for (int64_t i = 0; i < nq; ++i) {
              const auto [lo, hi] = visible_columns(i, s0, nk);
              float* srow = S.data() + i * nk;
              std::fill(srow, srow + lo, 0.0f);
              std::fill(srow + hi, srow + nk, 0.0f);
              exp_shifted_inplace(srow + lo, hi - lo, lse[size_t(i)]);
            }
            cpu_gemm(true, nq, nk, dh, 1.0f, dO, qs, V + s0 * kvs, kvs, 0.0f, dP.data(), nk);
            for (int64_t i = 0; i < nq; ++i)
              for (int64_t j = 0; j < nk; ++j)
                dP[size_t(i * nk + j)] = S[size_t(i * nk + j)] * (dP[size_t(i * nk + j)] - Drow[size_t(i)]) * a.scale;
            cpu_gemm_tn(nk, dh, nq, 1.0f, S.data(), nk, dO, qs, 1.0f, dV + s0 * kvs, kvs);
            cpu_gemm(false, nq, dh, nk, 1.0f, dP.data(), nk, K + s0 * kvs, kvs, 1.0f, dQ, qs);
            cpu_gemm_tn(nk, dh, nq, 1.0f, dP.data(), nk, Q, qs, 1.0f, dK + s0 * kvs, kvs);
          }
        }
    }
  });
}

}  // namespace zaya
