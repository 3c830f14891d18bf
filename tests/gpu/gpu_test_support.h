// Shared by the GPU tests: device detection (every test skips with "skipped: no GPU" when
// there is none), device buffers poisoned with NaN before each run, fresh random inputs per
// check, and the comparison against the CPU backend (max|gpu-cpu| / max|cpu|, as
// tests/unit/test_helpers.h). Tolerances: 1e-2 where GEMM operands are bf16, 1e-4 for fp32 paths.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_factory.h"
#include "core/rng.h"
#include "test_helpers.h"

namespace zaya::gpu_test {

constexpr double kTolBf16 = 1e-2;
constexpr double kTolF32 = 1e-4;

inline bool gpu_present() { return cuda_device_count() > 0; }

// A fresh seed for every random input in the process.
inline uint64_t fresh_seed() {
  static uint64_t counter = 0x9e3779b97f4a7c15ull;
  return ++counter;
}

inline std::vector<float> rnd(size_t n, double scale = 1.0) { return test::random_vector(n, fresh_seed(), scale); }

inline std::vector<float> rnd_positive(size_t n, double lo, double hi) {
  Rng rng(fresh_seed());
  std::vector<float> v(n);
  for (auto& x : v) x = float(lo + (hi - lo) * rng.uniform());
  return v;
}

inline std::vector<int32_t> rnd_ints(size_t n, int32_t hi) {  // uniform in [0, hi)
  Rng rng(fresh_seed());
  std::vector<int32_t> v(n);
  for (auto& x : v) x = int32_t(rng.next_u64() % uint64_t(hi));
  return v;
}

// Backend memory of n floats (or int32), filled with NaN at creation and by poison().
class DevBuf {
 public:
  DevBuf(Backend& be, int64_t n) : be_(be), n_(n), p_(be.alloc(n > 0 ? n : 1)) { poison(); }
  DevBuf(Backend& be, const std::vector<float>& h) : DevBuf(be, int64_t(h.size())) { upload(h); }
  DevBuf(Backend& be, const std::vector<int32_t>& h) : DevBuf(be, int64_t(h.size())) {
    be_.from_host(p_, h.data(), n_ * 4);
  }
  ~DevBuf() { be_.free(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  float* f() const { return p_; }
  int32_t* i() const { return reinterpret_cast<int32_t*>(p_); }
  void poison() { be_.fill(p_, NAN, n_); }
  void upload(const std::vector<float>& h) { be_.from_host(p_, h.data(), n_ * 4); }
  std::vector<float> get() const {
    std::vector<float> h(static_cast<size_t>(n_));
    be_.to_host(h.data(), p_, n_ * 4);
    return h;
  }
  std::vector<int32_t> get_i() const {
    std::vector<int32_t> h(static_cast<size_t>(n_));
    be_.to_host(h.data(), p_, n_ * 4);
    return h;
  }

 private:
  Backend& be_;
  int64_t n_;
  float* p_;
};

using test::expect_close;

// Which GEMM the backend uses: bf16 operands (the policy), fp32, or our tiled kernel in fp32;
// and for the MoE, whether its experts run as device-grouped GEMMs.
struct GemmMode {
  const char* name;
  bool bf16;
  bool portable;
  double tol;  // for results that go through a GEMM
  bool moe_grouped = false;
  // Newton-Schulz on bf16 operands (the backend's default) rather than TF32. The op tests pin
  // TF32, which they can compare element by element; test_gpu_ns_bf16.cpp and the training
  // test cover bf16.
  bool ns_bf16 = false;
  // Attention forward of 64+ queries on the tensor-core flash kernel (head_dim 64 and 128).
  bool attn_flash = false;
  // With ns_bf16: Newton-Schulz's iterates in bf16 too (ZAYA_NS_BF16_ITERATES).
  bool ns_bf16_iterates = false;
};
// A test's parameter prints as its mode's name: CTest names a parametrized test with it
// ("... # GetParam() = bf16"), where gtest's byte dump would put addresses that change with
// every run, so the costs CTest learns (Testing/Temporary/CTestCostData.txt) could never match it.
inline void PrintTo(const GemmMode& mode, std::ostream* out) { *out << mode.name; }
// The host emulation (tests/simt) has no cuBLASLt, so its "fp32" mode would run the same tiled
// kernel as "tiled_fp32" a second time: it is left out there.
inline std::vector<GemmMode> gemm_modes() {
#if defined(ZAYA_SIMT)
  return {{"bf16", true, false, kTolBf16}, {"tiled_fp32", false, true, kTolF32}};
#else
  return {{"bf16", true, false, kTolBf16}, {"fp32", false, false, kTolF32}, {"tiled_fp32", false, true, kTolF32}};
#endif
}
// gemm_modes() and the device-grouped MoE: on the tensor cores, and with the portable FMA kernel.
inline std::vector<GemmMode> moe_modes() {
  std::vector<GemmMode> modes = gemm_modes();
  modes.push_back({"bf16_grouped", true, false, kTolBf16, true});
  modes.push_back({"bf16_tiled_grouped", true, true, kTolBf16, true});
  return modes;
}
inline std::unique_ptr<Backend> make_gpu(const GemmMode& m) {
  CudaBackendOptions o;
  o.bf16_matmul = m.bf16;
  o.portable_gemm = m.portable;
  o.moe_device_grouped = m.moe_grouped;
  o.newton_schulz_bf16 = m.ns_bf16;
  o.attention_flash_tc = m.attn_flash;
  o.newton_schulz_bf16_iterates = m.ns_bf16_iterates;
  auto gpu = make_cuda_backend(o);
  // A mode that asks for the mma.sync kernels must get them: were the backend's start-up check of
  // their primitives to fail, it would serve the other paths and the mode would test those.
  const std::string diagnostics = gpu->diagnostics();
  if ((m.attn_flash || m.moe_grouped) && diagnostics.find("mma.sync primitives disagree") != std::string::npos)
    ADD_FAILURE() << "mode " << m.name << " asks for the tensor-core kernels, which this GPU's check refused: "
                  << diagnostics;
  return gpu;
}

}  // namespace zaya::gpu_test
