// Lazily grown table of rotary cosines and sines. See rope_table.h.
#include "backend/cpu/rope_table.h"

#include <algorithm>
#include <cmath>

namespace zaya {

void RopeTable::cover(double theta, int64_t rotary_dim, const int64_t* positions, int64_t n) {
  if (theta != theta_ || rotary_dim != rotary_dim_) {
    theta_ = theta;
    rotary_dim_ = rotary_dim;
    half_ = rotary_dim / 2;
    rows_ = 0;
    cos_.clear();
    sin_.clear();
    inv_freq_.resize(size_t(half_));
    for (int64_t i = 0; i < half_; ++i)
      inv_freq_[size_t(i)] = std::pow(theta, -2.0 * double(i) / double(rotary_dim));
  }
  if (n <= 0) return;
  const int64_t wanted = std::min(*std::max_element(positions, positions + n) + 1, kMaxCachedPosition);
  if (wanted <= rows_) return;
  // Grow in steps of 1024 rows so that decoding one position at a time rarely grows it.
  const int64_t rows = std::min(kMaxCachedPosition, (wanted + 1023) / 1024 * 1024);
  cos_.resize(size_t(rows * half_));
  sin_.resize(size_t(rows * half_));
  for (int64_t p = rows_; p < rows; ++p)
    for (int64_t i = 0; i < half_; ++i) {
      const double angle = double(p) * inv_freq_[size_t(i)];
      cos_[size_t(p * half_ + i)] = float(std::cos(angle));
      sin_[size_t(p * half_ + i)] = float(std::sin(angle));
    }
  rows_ = rows;
}

void RopeTable::row(int64_t position, float* cs_scratch, float* sn_scratch, const float** cs,
                    const float** sn) const {
  if (position >= 0 && position < rows_) {
    *cs = cos_.data() + position * half_;
    *sn = sin_.data() + position * half_;
    return;
  }
  for (int64_t i = 0; i < half_; ++i) {
    const double angle = double(position) * inv_freq_[size_t(i)];
    cs_scratch[i] = float(std::cos(angle));
    sn_scratch[i] = float(std::sin(angle));
  }
  *cs = cs_scratch;
  *sn = sn_scratch;
}

}  // namespace zaya
