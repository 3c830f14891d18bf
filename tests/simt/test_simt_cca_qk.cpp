// The CCA projection tail's forward kernels (src/backend/cuda/ops_cca_qk_kernels.h: the RoPE
// table, and one warp per (token, head) for the mean paths, QK-norm, key temperature and partial
// RoPE from the table or computed in place), run on the CPU by the host GPU emulation against the CPU backend's cca_qk at the fp32
// tolerance (max|got - cpu| / max|cpu| < 1e-4). Built with 32-lane warps (zaya_simt_tests) and
// with 64-lane warps (zaya_simt_wave64_tests), where the lanes stride over the head's dims 64 at
// a time and the sum of squares crosses 64 lanes. The launches repeat CudaBackend::cca_qk's.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/ops_cca_qk_kernels.h"
#include "test_helpers.h"

namespace zaya {
namespace {

constexpr double kTol = 1e-4;

struct Case {
  int64_t N, Hq, Hkv, dh, rotary_dim;
};

void check_case(const Case& c, uint64_t seed) {
  const std::string what = "warp " + std::to_string(GPU_WARP_SIZE) + " N " + std::to_string(c.N) + " Hq " +
                           std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv) + " dh " + std::to_string(c.dh) +
                           " rotary " + std::to_string(c.rotary_dim);
  const int64_t C = (c.Hq + c.Hkv) * c.dh, half = c.rotary_dim / 2;
  const std::vector<float> z = test::random_vector(size_t(c.N * C), seed);
  const std::vector<float> u = test::random_vector(size_t(c.N * C), seed + 1);
  const std::vector<float> temp = test::random_vector(size_t(c.Hkv), seed + 2);
  std::vector<int64_t> positions(static_cast<size_t>(c.N));
  for (int64_t n = 0; n < c.N; ++n) positions[size_t(n)] = 1000 * (n % 3) + n;  // several sequences' offsets

  CcaQkArgs a;
  std::vector<float> q(static_cast<size_t>(c.N * c.Hq * c.dh)), k(static_cast<size_t>(c.N * c.Hkv * c.dh));
  a.z = z.data(); a.u = u.data(); a.temp = temp.data(); a.positions = positions.data(); a.q = q.data(); a.k = k.data();
  a.N = c.N; a.Hq = c.Hq; a.Hkv = c.Hkv; a.dh = c.dh; a.rotary_dim = c.rotary_dim; a.theta = 1e4;
  CpuBackend cpu;
  cpu.cca_qk(a);

  std::vector<float> cs(size_t(half > 0 ? c.N * half : 1), NAN), sn(cs.size(), NAN);
  std::vector<float> gq(q.size(), NAN), gk(k.size(), NAN);
  if (half > 0)
    simt::launch(dim3(gpu_blocks(c.N * half)), dim3(kGpuThreads), 0, [&] {
      cca_qk_fwd::k_rope_table(positions.data(), c.N, half, c.rotary_dim, a.theta, cs.data(), sn.data());
    });
  cca_qk_fwd::RopeSource table;
  table.cs = cs.data();
  table.sn = sn.data();
  simt::launch(dim3(gpu_warp_blocks(c.N * (c.Hq + c.Hkv), GPU_WARP_SIZE)), dim3(kGpuThreads), 0, [&] {
    cca_qk_fwd::k_cca_qk(z.data(), u.data(), temp.data(), table, gq.data(), gk.data(), c.N, c.Hq, c.Hkv, c.dh, half);
  });
  const double eq = test::max_rel_err(gq.data(), q.data(), q.size());
  const double ek = test::max_rel_err(gk.data(), k.data(), k.size());
  EXPECT_LT(eq, kTol) << what << " q: max rel err " << eq;
  EXPECT_LT(ek, kTol) << what << " k: max rel err " << ek;

  // The rotation computed in place from the positions (as cca_qk does for a few tokens): the same
  // entries as the table's, so bitwise the same outputs.
  cca_qk_fwd::RopeSource in_place;
  in_place.positions = positions.data();
  in_place.rotary_dim = c.rotary_dim;
  in_place.theta = a.theta;
  std::vector<float> iq(q.size(), NAN), ik(k.size(), NAN);
  simt::launch(dim3(gpu_warp_blocks(c.N * (c.Hq + c.Hkv), GPU_WARP_SIZE)), dim3(kGpuThreads), 0, [&] {
    cca_qk_fwd::k_cca_qk(z.data(), u.data(), temp.data(), in_place, iq.data(), ik.data(), c.N, c.Hq, c.Hkv, c.dh,
                         half);
  });
  for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(iq[i], gq[i]) << what << " q in place, element " << i;
  for (size_t i = 0; i < k.size(); ++i) ASSERT_EQ(ik[i], gk[i]) << what << " k in place, element " << i;
}

// Head dims 32 to 128 with full, partial and no rotation, GQA 2:1 and 4:1 (the key's mean path
// averages the group's queries), more items than one launch's warps.
TEST(SimtCcaQk, ForwardMatchesTheCpu) {
  uint64_t seed = 901;
  for (const Case& c : {Case{7, 4, 2, 128, 64}, Case{5, 8, 2, 64, 64}, Case{3, 2, 1, 32, 0}, Case{40, 4, 1, 96, 48}})
    check_case(c, seed += 10);
}

}  // namespace
}  // namespace zaya
