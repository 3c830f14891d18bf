// How the GPU backend is created: a clear zaya::Error("cuda", ...) without a device (this
// test runs, and passes, on machines without a GPU), and make_backend("cuda") in a ZAYA_CUDA
// build; the clear error of a device out of memory; the options the environment sets; and the
// check of the tensor-core primitives against plain products.
#include <cstdlib>
#include <functional>
#include <string>

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

// ZAYA_ATTN_KEY_SPLITS: a count from 0 to 64 reaches the options; anything else fails naming the
// variable, the value and what it takes. No device needed.
TEST(GpuFactory, AttentionKeySplitsFromTheEnvironment) {
  const char* before = std::getenv("ZAYA_ATTN_KEY_SPLITS");
  const std::string saved = before ? before : "";
  unsetenv("ZAYA_ATTN_KEY_SPLITS");
  EXPECT_EQ(cuda_backend_options_for("cuda", 0, 1).attention_key_splits, 0);
  setenv("ZAYA_ATTN_KEY_SPLITS", "1", 1);
  EXPECT_EQ(cuda_backend_options_for("cuda", 0, 1).attention_key_splits, 1);
  setenv("ZAYA_ATTN_KEY_SPLITS", "64", 1);
  EXPECT_EQ(cuda_backend_options_for("cuda-fp32", 0, 1).attention_key_splits, 64);
  for (const char* bad : {"65", "-1", "4x", "", "two"}) {
    setenv("ZAYA_ATTN_KEY_SPLITS", bad, 1);
    test::expect_error([] { cuda_backend_options_for("cuda", 0, 1); },
                       {"ZAYA_ATTN_KEY_SPLITS='" + std::string(bad) + "'", "whole number from 0 to 64"});
  }
  if (before) setenv("ZAYA_ATTN_KEY_SPLITS", saved.c_str(), 1);
  else unsetenv("ZAYA_ATTN_KEY_SPLITS");
}

// `var`=1 in the environment turns off what `on` tells of the options, which is on otherwise;
// var is restored after.
void expect_switch_turns_off(const char* var, const std::function<bool(const CudaBackendOptions&)>& on) {
  const char* before = std::getenv(var);
  const std::string saved = before ? before : "";
  unsetenv(var);
  EXPECT_TRUE(on(cuda_backend_options_for("cuda", 0, 1))) << var << " unset";
  setenv(var, "1", 1);
  EXPECT_FALSE(on(cuda_backend_options_for("cuda", 0, 1))) << var << "=1";
  if (before) setenv(var, saved.c_str(), 1);
  else unsetenv(var);
}
void expect_switch_turns_off(const char* var, bool CudaBackendOptions::*option) {
  expect_switch_turns_off(var, [option](const CudaBackendOptions& o) { return o.*option; });
}

// ZAYA_UPLOAD_PAGEABLE=1 turns the pinned staging of small uploads off (no chunks); it is on
// otherwise.
TEST(GpuFactory, UploadPageableFromTheEnvironment) {
  expect_switch_turns_off("ZAYA_UPLOAD_PAGEABLE",
                          [](const CudaBackendOptions& o) { return o.upload_staging_chunks > 0; });
}

// ZAYA_MOE_PER_EXPERT=1 turns the few-rows GEMVs of decode's MoE off; they are on otherwise.
TEST(GpuFactory, MoePerExpertFromTheEnvironment) {
  expect_switch_turns_off("ZAYA_MOE_PER_EXPERT", &CudaBackendOptions::moe_few_rows_gemv);
}

// ZAYA_LINEAR_GEMM=1 turns the few-rows GEMVs of decode's linears off; they are on otherwise.
TEST(GpuFactory, LinearGemmFromTheEnvironment) {
  expect_switch_turns_off("ZAYA_LINEAR_GEMM", &CudaBackendOptions::linear_few_rows_gemv);
}

// The tensor-core primitives of gpu_mma.h (mma.sync, ldmatrix, cp.async, bf16x2 rounding) agree
// with plain products on this device, for fresh inputs each run, and the backend's own start-up
// check (run when a path that uses them is asked for) passed, so its diagnostics say they may
// run. When the flash attention or the pipelined grouped GEMMs fail on a new GPU, this names the
// primitive to look at first.
TEST(GpuMma, PrimitivesAgreeWithPlainProducts) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  if (!cuda_tensor_core_kernels_built()) GTEST_SKIP() << "skipped: this build has no mma.sync kernels";
  CudaBackendOptions asks_for_flash;
  asks_for_flash.attention_flash_tc = true;  // the start-up check runs where a path needs it
  auto gpu = make_cuda_backend(asks_for_flash);
  for (int run = 0; run < 3; ++run) {
    const MmaSelfCheck check = cuda_mma_self_check(*gpu, fresh_seed());
    if (!check.ran) GTEST_SKIP() << "skipped: this device runs no mma.sync kernels (before sm_80)";
    std::string all;
    for (const auto& m : check.mismatches) all += m + "\n";
    EXPECT_TRUE(check.mismatches.empty()) << all;
  }
  const std::string diagnostics = gpu->diagnostics();
  EXPECT_NE(diagnostics.find("mma.sync primitives agree with plain products"), std::string::npos) << diagnostics;
  const std::string plain = make_cuda_backend({})->diagnostics();  // nothing asks: nothing checked
  EXPECT_NE(plain.find("mma.sync primitives not checked"), std::string::npos) << plain;
}

TEST(GpuMma, SelfCheckNeedsTheGpuBackend) {
  CpuBackend cpu;
  test::expect_error([&] { cuda_mma_self_check(cpu, 1); }, {"cuda_mma_self_check needs the GPU backend", "cpu"});
}

}  // namespace
}  // namespace zaya
