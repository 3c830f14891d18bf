// How the GPU backend is created: a clear zaya::Error("cuda", ...) without a device (this
// test runs, and passes, on machines without a GPU), and make_backend("cuda") in a ZAYA_CUDA
// build; and the clear error of a device out of memory.
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

// Asking for more than the device has (1 TiB) is a clear error with the sizes and what to lower,
// and the backend goes on working afterwards.
TEST(GpuFactory, OutOfMemoryNamesTheSizesAndWhatToLower) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  auto be = make_cuda_backend({});
  float* held = be->alloc(int64_t(1) << 20);  // 4 MiB held
  test::expect_error([&] { be->alloc(int64_t(1) << 38); },
                     {"cuda: out of device memory on GPU 0: 1024.00 GiB asked for while zaya holds 4.0 MiB (at most",
                      "free of", "batch.recompute_activations = true", "a smaller batch.micro_batch"});
  float* more = be->alloc(1024);
  be->fill(more, 1.0f, 1024);
  float back = 0;
  be->to_host(&back, more + 1023, 4);
  EXPECT_EQ(back, 1.0f);
  be->free(more);
  be->free(held);
}

TEST(GpuFactory, BadDeviceIndex) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  CudaBackendOptions o;
  o.device = cuda_device_count();
  EXPECT_THROW(make_cuda_backend(o), Error);
}

}  // namespace
}  // namespace zaya
