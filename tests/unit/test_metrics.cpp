// The comparison metrics the op tests rely on (tests/unit/test_helpers.h): max_rel_err (the GPU
// tests' expect_close uses it too), rel_l2 and max_err_over_scale. For max_rel_err: a NaN anywhere (an output a kernel never wrote, since the
// GPU tests poison outputs with NaN) or an infinite difference must fail a comparison, and the
// scale is the reference's largest magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "test_helpers.h"

namespace zaya {
namespace {

TEST(MaxRelErr, RelativeToTheReferenceScale) {
  const std::vector<float> ref = {1.0f, -4.0f, 2.0f}, got = {1.0f, -4.0f, 2.1f};
  EXPECT_NEAR(test::max_rel_err(got.data(), ref.data(), ref.size()), 0.1 / 4.0, 1e-7);
  EXPECT_EQ(test::max_rel_err(ref.data(), ref.data(), ref.size()), 0.0);
}

TEST(MaxRelErr, NanOrInfinityAnywhereIsInfinite) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> ref = {1.0f, 2.0f, 3.0f};
  for (size_t i = 0; i < ref.size(); ++i) {
    for (const float bad : {nan, inf, -inf}) {
      std::vector<float> got = ref;
      got[i] = bad;
      EXPECT_TRUE(std::isinf(test::max_rel_err(got.data(), ref.data(), ref.size()))) << i << " " << bad;
      EXPECT_TRUE(std::isinf(test::max_rel_err(ref.data(), got.data(), ref.size()))) << i << " " << bad;
    }
  }
  const std::vector<float> all_nan(3, nan);
  EXPECT_TRUE(std::isinf(test::max_rel_err(all_nan.data(), ref.data(), ref.size())));
}

TEST(RelL2, FrobeniusRelativeAndStrict) {
  const std::vector<float> ref = {3.0f, 4.0f}, got = {3.0f, 4.5f};
  EXPECT_NEAR(test::rel_l2(got.data(), ref.data(), 2), 0.5 / 5.0, 1e-7);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> bad = {nan, 4.0f};
  EXPECT_TRUE(std::isinf(test::rel_l2(bad.data(), ref.data(), 2)));
  EXPECT_TRUE(std::isinf(test::rel_l2(ref.data(), bad.data(), 2)));
}

TEST(MaxErrOverScale, PerElementScaleZeroScaleExactNanInfinite) {
  const std::vector<float> ref = {1.0f, 0.01f, 0.0f}, got = {1.0f, 0.02f, 0.0f};
  const std::vector<double> scale = {2.0, 1.0, 0.0};
  EXPECT_NEAR(test::max_err_over_scale(got.data(), ref.data(), scale.data(), 3), 0.01, 1e-7);
  std::vector<float> off = got;
  off[2] = 1e-30f;  // a zero scale allows no difference at all
  EXPECT_TRUE(std::isinf(test::max_err_over_scale(off.data(), ref.data(), scale.data(), 3)));
  off = got;
  off[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isinf(test::max_err_over_scale(off.data(), ref.data(), scale.data(), 3)));
}

}  // namespace
}  // namespace zaya
