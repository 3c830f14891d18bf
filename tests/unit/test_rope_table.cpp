// The CPU CCA ops' table of rotary cosines and sines (src/backend/cpu/rope_table.h): every row
// equals the angle computed on the spot, in the table, past its end and for a new theta.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/rope_table.h"

namespace zaya {
namespace {

// cos and sin of position * theta^(-2i / rotary_dim), in double, rounded to float.
void expect_row(const RopeTable& table, int64_t position, double theta, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  std::vector<float> cs_scratch(size_t(half), -9.0f), sn_scratch(size_t(half), -9.0f);
  const float *cs = nullptr, *sn = nullptr;
  table.row(position, cs_scratch.data(), sn_scratch.data(), &cs, &sn);
  ASSERT_NE(cs, nullptr);
  ASSERT_NE(sn, nullptr);
  for (int64_t i = 0; i < half; ++i) {
    const double angle = double(position) * std::pow(theta, -2.0 * double(i) / double(rotary_dim));
    EXPECT_EQ(cs[i], float(std::cos(angle))) << "position " << position << ", i " << i;
    EXPECT_EQ(sn[i], float(std::sin(angle))) << "position " << position << ", i " << i;
  }
}

TEST(RopeTable, RowsEqualTheAnglesComputedOnTheSpot) {
  RopeTable table;
  const std::vector<int64_t> positions = {0, 5, 3, 1500};
  table.cover(1e4, 16, positions.data(), int64_t(positions.size()));
  for (int64_t p : {0, 1, 5, 1023, 1500, 2047}) expect_row(table, p, 1e4, 16);
  // Past the table, far past its cap, and negative: computed into the scratch rows.
  for (int64_t p : {int64_t(4096), RopeTable::kMaxCachedPosition + 7, int64_t(-3)})
    expect_row(table, p, 1e4, 16);
  // A larger position grows the table; another theta or rotary dimension starts it over.
  const int64_t later = 70000;
  table.cover(1e4, 16, &later, 1);
  expect_row(table, later, 1e4, 16);
  table.cover(5e5, 8, positions.data(), int64_t(positions.size()));
  for (int64_t p : {0, 3, 1500, 9000}) expect_row(table, p, 5e5, 8);
}

TEST(RopeTable, NoPositionsCoverNothing) {
  RopeTable table;
  table.cover(1e4, 4, nullptr, 0);
  expect_row(table, 2, 1e4, 4);  // computed on the spot, with the theta given
}

}  // namespace
}  // namespace zaya
