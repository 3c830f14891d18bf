// CPU causal GQA attention over a KV cache, blocked with an online softmax so memory stays
// O(block) rather than O(T^2). Supports per-sequence start positions (chunked prefill and
// decode) and sliding windows. Scores and P·V run as small GEMMs over cache rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vector_math.h"

namespace zaya {

namespace {
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;
}  // namespace

void CpuBackend::attention(const AttentionArgs& a) {
  check_attention_rows(a, "cpu", "attention");
  const int64_t dh = a.dh, rep = a.Hq / a.Hkv;
  const int64_t qblocks = (a.T + kQueryBlock - 1) / kQueryBlock;
  const int64_t q_stride = a.Hq * dh, kv_stride = a.Hkv * dh;
  const int64_t jobs = a.B * a.Hq * qblocks;
  // Threads only pay off once there is real work (decode steps on short contexts are tiny).
  int64_t max_keys = 0;
  for (int64_t b = 0; b < a.B; ++b) max_keys = std::max(max_keys, a.pos0[b] + a.T);
  const bool threaded = a.B * a.T * a.Hq * max_keys * dh > (int64_t(1) << 20);

  run_team(threaded, [&] {
    std::vector<float> scores(static_cast<size_t>(kQueryBlock * kKeyBlock)), acc(static_cast<size_t>(kQueryBlock * dh));
    std::vector<float> row_max(static_cast<size_t>(kQueryBlock)), row_sum(static_cast<size_t>(kQueryBlock));
#pragma omp for schedule(dynamic)
    for (int64_t job = 0; job < jobs; ++job) {
      const int64_t qb = job % qblocks, h = (job / qblocks) % a.Hq, b = job / (qblocks * a.Hq);
      const int64_t g = h / rep;
      const int64_t t_begin = qb * kQueryBlock, t_end = std::min(a.T, t_begin + kQueryBlock), nq = t_end - t_begin;
      const int64_t p_first = a.pos0[b] + t_begin, p_last = a.pos0[b] + t_end - 1;
      int64_t s_begin = a.window > 0 ? std::max<int64_t>(0, p_first - a.window + 1) : 0;
      const int32_t* seg =
          a.seg_start ? a.seg_start + b * a.T : nullptr;            // by query row; values are key positions
      if (seg) s_begin = std::max<int64_t>(s_begin, seg[t_begin]);  // starts never decrease along a row
      const int64_t s_end = p_last + 1;
      const float* q = a.q + (b * a.T + t_begin) * q_stride + h * dh;
      const float* kc = a.k_cache + b * a.S * kv_stride + g * dh;
      const float* vc = a.v_cache + b * a.S * kv_stride + g * dh;

      std::fill(acc.begin(), acc.begin() + nq * dh, 0.0f);
      std::fill(row_max.begin(), row_max.begin() + nq, -INFINITY);
      std::fill(row_sum.begin(), row_sum.begin() + nq, 0.0f);

      for (int64_t s0 = s_begin; s0 < s_end; s0 += kKeyBlock) {
        const int64_t nk = std::min(kKeyBlock, s_end - s0);
        cpu_gemm(true, nq, nk, dh, a.scale, q, q_stride, kc + s0 * kv_stride, kv_stride, 0.0f, scores.data(), nk);
        for (int64_t i = 0; i < nq; ++i) {
          // Row i sees keys [first, p] (causal, window, document start): columns [lo, hi) here.
          const int64_t p = p_first + i;
          int64_t first = a.window > 0 ? p - a.window + 1 : 0;
          if (seg) first = std::max<int64_t>(first, seg[t_begin + i]);
          const int64_t lo = std::clamp<int64_t>(first - s0, 0, nk),
                        hi = std::clamp<int64_t>(p + 1 - s0, lo, nk);
          float* srow = scores.data() + i * nk;
          std::fill(srow, srow + lo, 0.0f);
          std::fill(srow + hi, srow + nk, 0.0f);
          if (lo == hi) continue;  // nothing visible in this block for this row
          const float mx = max_of(srow + lo, hi - lo, row_max[size_t(i)]);
          if (mx == -INFINITY) {  // every visible score so far is -inf (an infinite q or k)
            std::fill(srow + lo, srow + hi, 0.0f);
            continue;
          }
          const float corr = exp_vectorisable(row_max[size_t(i)] - mx);
          exp_shifted_inplace(srow + lo, hi - lo, mx);
          row_sum[size_t(i)] = row_sum[size_t(i)] * corr + float(sum_of(srow + lo, hi - lo));
          row_max[size_t(i)] = mx;
          float* arow = acc.data() + i * dh;
          for (int64_t d = 0; d < dh; ++d) arow[d] *= corr;
        }
        cpu_gemm(false, nq, dh, nk, 1.0f, scores.data(), nk, vc + s0 * kv_stride, kv_stride, 1.0f, acc.data(), dh);
      }
      for (int64_t i = 0; i < nq; ++i) {
        float* o = a.out + (b * a.T + t_begin + i) * q_stride + h * dh;
        const float inv = row_sum[size_t(i)] > 0 ? 1.0f / row_sum[size_t(i)] : 0.0f;
        for (int64_t d = 0; d < dh; ++d) o[d] = acc[size_t(i * dh + d)] * inv;
      }
    }
  });
}

}  // namespace zaya
