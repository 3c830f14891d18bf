// Helpers shared by the benchmark binaries: timing, medians, JSON run statistics and the
// machine's measured sgemm peak (the denominator of every MFU figure).
#pragma once
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace zaya::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline nlohmann::json stats(const std::vector<double>& v) {
  return nlohmann::json{{"median", median(v)},
                        {"min", *std::min_element(v.begin(), v.end())},
                        {"max", *std::max_element(v.begin(), v.end())},
                        {"runs", v.size()}};
}

// n pseudo-random token ids in [0, vocab) from a 64-bit LCG started at `seed` (the prompts of
// the decode and serving benchmarks); *seed is left where the stream stopped, so successive
// calls give successive prompts.
inline std::vector<int32_t> random_token_ids(int64_t n, int64_t vocab, uint64_t* seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    id = int32_t((*seed >> 33) % uint64_t(vocab));
  }
  return ids;
}

// GFLOP/s of an n^3 sgemm on all threads, after one warm-up run (thread pool, page faults).
inline nlohmann::json bench_sgemm(int64_t n, int runs) {
  std::vector<float> a(size_t(n * n)), b(size_t(n * n)), c(size_t(n * n));
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    b[i] = float((i * 40503u) % 1000) * 1e-3f - 0.5f;
  }
  auto once = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(n), int(n), 1.0f, a.data(), int(n), b.data(),
                int(n), 0.0f, c.data(), int(n));
  };
  once();
  std::vector<double> gf;
  for (int r = 0; r < runs; ++r) {
    auto t0 = Clock::now();
    once();
    gf.push_back(2.0 * double(n) * n * n / seconds_since(t0) * 1e-9);
  }
  nlohmann::json j = stats(gf);
  j["n"] = n;
  return j;
}

}  // namespace zaya::bench
