// The GPU backend's pinned staging ring for small uploads (src/backend/cuda/staging_ring.h),
// checked on the host: a worked example, and random upload sizes against a model of the copies
// in flight (every copy from a chunk stays in flight until the backend waits for the event it
// recorded on leaving that chunk), where no upload may be given a place that overlaps a copy
// still in flight, every place is 16-byte aligned and inside its chunk, and the ring waits only
// when it comes back to a chunk it has left.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/staging_ring.h"

namespace zaya {
namespace {

TEST(StagingRing, WorkedExample) {
  StagingRing ring(64, 2);
  ASSERT_TRUE(ring.valid());
  EXPECT_EQ(ring.bytes(), 128);
  StagingRing::Place p = ring.reserve(16);
  EXPECT_EQ(p.offset, 0);
  EXPECT_EQ(p.chunk, 0);
  EXPECT_EQ(p.left, -1);
  EXPECT_FALSE(p.wait);
  p = ring.reserve(40);  // 16-byte aligned: takes 48
  EXPECT_EQ(p.offset, 16);
  EXPECT_EQ(p.left, -1);
  p = ring.reserve(1);  // 64 - 64 = 0 bytes left: the next chunk, never used, so no wait
  EXPECT_EQ(p.offset, 64);
  EXPECT_EQ(p.chunk, 1);
  EXPECT_EQ(p.left, 0);
  EXPECT_FALSE(p.wait);
  p = ring.reserve(64);  // back to chunk 0, which the ring left: wait for its copies
  EXPECT_EQ(p.offset, 0);
  EXPECT_EQ(p.chunk, 0);
  EXPECT_EQ(p.left, 1);
  EXPECT_TRUE(p.wait);
  p = ring.reserve(64);
  EXPECT_EQ(p.offset, 64);
  EXPECT_TRUE(p.wait);
}

TEST(StagingRing, RejectsShapesItCannotServe) {
  EXPECT_FALSE(StagingRing(64, 1).valid());
  EXPECT_FALSE(StagingRing(0, 4).valid());
  EXPECT_FALSE(StagingRing(24, 4).valid());
  EXPECT_TRUE(StagingRing(256 << 10, 8).valid());
}

struct Range {
  int64_t begin, end;
};

TEST(StagingRing, NeverHandsOutBytesACopyInFlightStillReads) {
  std::mt19937 gen(7);
  for (const auto& shape : std::vector<std::pair<int64_t, int>>{{64, 2}, {128, 3}, {1024, 8}, {4096, 2}}) {
    StagingRing ring(shape.first, shape.second);
    ASSERT_TRUE(ring.valid());
    std::vector<std::vector<Range>> in_flight(size_t(ring.chunks()));  // copies not known to have run
    std::vector<bool> event_recorded(size_t(ring.chunks()), false);
    std::uniform_int_distribution<int64_t> size(1, ring.chunk_bytes());
    int waits = 0;
    for (int upload = 0; upload < 5000; ++upload) {
      const int64_t bytes = upload % 3 == 0 ? size(gen) : 1 + size(gen) % 24;  // mostly small, as decode's
      const StagingRing::Place p = ring.reserve(bytes);
      const std::string what = "chunk " + std::to_string(shape.first) + " x " + std::to_string(shape.second) +
                               ", upload " + std::to_string(upload) + " of " + std::to_string(bytes) + " bytes";
      if (p.left >= 0) event_recorded[size_t(p.left)] = true;  // the backend records the left chunk's event
      ASSERT_GE(p.chunk, 0) << what;
      ASSERT_LT(p.chunk, ring.chunks()) << what;
      if (p.wait) {  // the backend waits for the chunk's event: its copies have run
        ASSERT_TRUE(event_recorded[size_t(p.chunk)]) << what << ": waits for an event never recorded";
        in_flight[size_t(p.chunk)].clear();
        event_recorded[size_t(p.chunk)] = false;
        ++waits;
      }
      EXPECT_EQ(p.offset % 16, 0) << what;
      EXPECT_GE(p.offset, p.chunk * ring.chunk_bytes()) << what;
      EXPECT_LE(p.offset + bytes, (p.chunk + 1) * ring.chunk_bytes()) << what << ": past its chunk";
      for (const auto& chunk : in_flight)
        for (const Range& r : chunk)
          ASSERT_FALSE(p.offset < r.end && r.begin < p.offset + bytes)
              << what << ": overlaps a copy in flight at [" << r.begin << ", " << r.end << ")";
      in_flight[size_t(p.chunk)].push_back({p.offset, p.offset + bytes});
    }
    EXPECT_GT(waits, 0) << "the ring never came back to a chunk";
  }
}

}  // namespace
}  // namespace zaya
