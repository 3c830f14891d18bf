// The rotary (NeoX RoPE) cosines and sines of the CPU CCA ops, one row per position: row p holds
// cos and sin of p * theta^(-2i / rotary_dim) for i < rotary_dim / 2, computed in double and
// rounded to float (exactly what the ops computed for every row before), once per position
// instead of once per row, layer and step. The table grows to the largest position asked for,
// up to kMaxCachedPosition; rows beyond it (and negative positions) are computed on the spot.
#pragma once
#include <cstdint>
#include <vector>

namespace zaya {

class RopeTable {
 public:
  static constexpr int64_t kMaxCachedPosition = int64_t(1) << 17;

  // Makes the rows of positions[0..n) available (those up to kMaxCachedPosition) for this theta
  // and rotary_dim; a different theta or rotary_dim starts the table over. Not thread-safe: call
  // it before the threads that read rows start.
  void cover(double theta, int64_t rotary_dim, const int64_t* positions, int64_t n);

  // The half = rotary_dim / 2 cosines and sines of `position`: from the table when covered, else
  // computed into cs_scratch and sn_scratch (each of `half` floats), which are then returned.
  void row(int64_t position, float* cs_scratch, float* sn_scratch, const float** cs, const float** sn) const;

 private:
  double theta_ = 0;
  int64_t rotary_dim_ = 0, half_ = 0, rows_ = 0;
  std::vector<double> inv_freq_;
  std::vector<float> cos_, sin_;  // [rows_, half_]
};

}  // namespace zaya
