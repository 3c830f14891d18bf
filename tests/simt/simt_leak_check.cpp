// For the tests of the whole backend under the host emulation (zaya_simt_gpu_tests): once the
// tests of a process have run and every backend they made is gone, no emulated device memory may
// remain allocated. A backend that loses track of a block (a pool entry never freed, a
// gpuMalloc outside the pool) fails here.
#include <gtest/gtest.h>

#include "simt_runtime.h"

namespace {

class DeviceMemoryReturned : public ::testing::Environment {
 public:
  void TearDown() override {
    EXPECT_EQ(zaya::simt::device_bytes_in_use(), size_t(0))
        << "emulated device memory still allocated after every test (a backend leaked it)";
  }
};

const auto* const kRegistered = ::testing::AddGlobalTestEnvironment(new DeviceMemoryReturned);

}  // namespace
