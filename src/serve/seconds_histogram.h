// A histogram of durations in seconds over fixed bucket bounds, as Prometheus exposes one: for
// each upper bound, how many observations were at most that long, and their count and sum.
// Plain data, copied with the engine's stats.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

namespace zaya {

struct SecondsHistogram {
  // From a millisecond (a decode step of a small model) to half a minute (a long prompt queued).
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
  std::array<int64_t, kBounds.size()> at_most{};  // observations <= kBounds[i] (cumulative)
  int64_t count = 0;
  double sum = 0;

  void add(double seconds) {
    for (size_t i = 0; i < kBounds.size(); ++i)
      if (seconds <= kBounds[i]) ++at_most[i];
    ++count;
    sum += seconds;
  }
};

}  // namespace zaya
