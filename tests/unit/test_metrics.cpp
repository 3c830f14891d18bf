// The comparison metric every op test relies on (tests/unit/test_helpers.h, max_rel_err; the
// GPU tests' expect_close uses it too): a NaN anywhere (an output a kernel never wrote, since the
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

}  // namespace
}  // namespace zaya
