// Shared helpers for zaya's unit tests: fixture paths, error metrics, random fills.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"

namespace zaya::test {

inline std::string source_path(const std::string& rel) { return std::string(ZAYA_SOURCE_DIR) + "/" + rel; }

// max|a-b| / max|b|: relative to the reference's scale, robust to entries near zero. A NaN in
// either input (an output never written: the GPU tests poison outputs with NaN) or an infinite
// difference makes it infinite. std::max would drop a NaN (NaN compares false), so it is checked
// element by element.
inline double max_rel_err(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!std::isfinite(d)) return INFINITY;
    diff = std::max(diff, d);
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

inline std::vector<float> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(rng.normal() * scale);
  return v;
}

}  // namespace zaya::test
