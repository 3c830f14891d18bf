// How the GPU backend is created: a clear zaya::Error("cuda", ...) without a device (this
// test runs, and passes, on machines without a GPU), and make_backend("cuda") in a ZAYA_CUDA
// build.
#include "core/error.h"
#include "gpu_test_support.h"

namespace zaya {
namespace {

using namespace gpu_test;

TEST(GpuFactory, NoDeviceGivesAClearError) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present";
  try {
    auto be = make_cuda_backend({});
    FAIL() << "make_cuda_backend succeeded without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.component(), "cuda");
    EXPECT_NE(e.message().find("no GPU"), std::string::npos) << e.message();
  }
}

TEST(GpuFactory, MakeBackendByName) {
#ifdef ZAYA_CUDA
  if (!gpu_present()) {
    EXPECT_THROW(make_backend("cuda"), Error);
    return;
  }
  EXPECT_EQ(make_backend("cuda")->name(), "cuda");
#else
  GTEST_SKIP() << "built without ZAYA_CUDA";
#endif
}

TEST(GpuFactory, BadDeviceIndex) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  CudaBackendOptions o;
  o.device = cuda_device_count();
  EXPECT_THROW(make_cuda_backend(o), Error);
}

}  // namespace
}  // namespace zaya
