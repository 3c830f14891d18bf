// The CPU backend's vectorisable row helpers (src/backend/cpu/vector_math.h): exp against the
// exact value, the in-place row exp against the scalar one bit for bit (vector body and tail),
// and the max / sum / dot reductions against plain loops, at every length around the lane count
// and at shifted addresses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/vector_math.h"
#include "test_helpers.h"

namespace zaya {
namespace {

// |got - exact| in units of the float spacing at the exact value.
double ulp_error(float got, double exact) {
  const float rounded = float(exact);
  const double spacing = double(std::nextafter(rounded, INFINITY)) - double(rounded);
  return std::fabs(double(got) - exact) / spacing;
}

TEST(VectorMath, ExpIsWithinTwoUlpOverTheNormalRange) {
  double worst = 0;
  float worst_x = 0;
  int checked = 0;
  for (int k = 0; k <= 200000; ++k) {
    const float x = -87.33f + float(k) * (88.72f + 87.33f) / 200000.0f;
    const double e = ulp_error(exp_vectorisable(x), std::exp(double(x)));
    if (e > worst) worst = e, worst_x = x;
    ++checked;
  }
  // Small arguments, where e^x is near 1 and the polynomial alone decides.
  for (int k = -10000; k <= 10000; ++k) {
    const float x = float(k) * 1e-7f;
    const double e = ulp_error(exp_vectorisable(x), std::exp(double(x)));
    if (e > worst) worst = e, worst_x = x;
    ++checked;
  }
  EXPECT_EQ(checked, 220002);
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  EXPECT_EQ(exp_vectorisable(0.0f), 1.0f);
}

TEST(VectorMath, ExpLimits) {
  EXPECT_EQ(exp_vectorisable(-INFINITY), 0.0f);
  EXPECT_EQ(exp_vectorisable(-100.0f), 0.0f);
  EXPECT_EQ(exp_vectorisable(-87.34f), 0.0f);  // just below ln(FLT_MIN): no subnormal result
  EXPECT_GT(exp_vectorisable(-87.33f), 0.0f);
  EXPECT_EQ(exp_vectorisable(INFINITY), INFINITY);
  EXPECT_EQ(exp_vectorisable(89.0f), INFINITY);
  EXPECT_TRUE(std::isfinite(exp_vectorisable(88.72f)));
  EXPECT_LE(ulp_error(exp_vectorisable(88.72f), std::exp(double(88.72f))), 2.0);
  EXPECT_TRUE(std::isnan(exp_vectorisable(std::numeric_limits<float>::quiet_NaN())));
}

// The loop GCC vectorises gives each element the bits the scalar function gives it, whatever its
// place in the row (vector body or tail).
TEST(VectorMath, RowExpMatchesTheScalarExpBitForBit) {
  const std::vector<float> base = test::random_vector(300, 7, 30.0);
  for (int64_t n : {1, 7, 8, 9, 31, 64, 257}) {
    std::vector<float> row(base.begin(), base.begin() + n);
    exp_shifted_inplace(row.data(), n, 2.5f);
    for (int64_t i = 0; i < n; ++i) {
      volatile float x = base[size_t(i)] - 2.5f;  // computed apart from any vector loop
      const float want = exp_vectorisable(x);
      ASSERT_EQ(std::memcmp(&row[size_t(i)], &want, 4), 0) << "n " << n << " i " << i;
    }
  }
}

TEST(VectorMath, ReductionsMatchPlainLoopsAtEveryLengthAndAddress) {
  const std::vector<float> x = test::random_vector(200, 11, 3.0), y = test::random_vector(200, 12, 3.0);
  for (int64_t n = 0; n <= 40; ++n) {
    float mx = -5.0f;
    double sum = 0, dot = 0, scale = 0, dscale = 0;
    for (int64_t i = 0; i < n; ++i) {
      mx = std::max(mx, x[size_t(i)]);
      sum += x[size_t(i)];
      dot += double(x[size_t(i)]) * y[size_t(i)];
      scale += std::fabs(x[size_t(i)]);
      dscale += std::fabs(double(x[size_t(i)]) * y[size_t(i)]);
    }
    EXPECT_EQ(max_of(x.data(), n, -5.0f), mx) << n;
    EXPECT_NEAR(sum_of(x.data(), n), sum, 1e-14 * (scale + 1)) << n;
    EXPECT_NEAR(dot_of(x.data(), y.data(), n), dot, 1e-14 * (dscale + 1)) << n;
    // The same values at another address (another alignment) give the same bits.
    std::vector<float> shifted(size_t(n) + 3), shifted_y(size_t(n) + 3);
    std::copy(x.begin(), x.begin() + n, shifted.begin() + 3);
    std::copy(y.begin(), y.begin() + n, shifted_y.begin() + 3);
    EXPECT_EQ(sum_of(shifted.data() + 3, n), sum_of(x.data(), n)) << n;
    EXPECT_EQ(dot_of(shifted.data() + 3, shifted_y.data() + 3, n), dot_of(x.data(), y.data(), n)) << n;
  }
  EXPECT_EQ(max_of(x.data(), 0, 1.5f), 1.5f);
}

}  // namespace
}  // namespace zaya
