// The CUDA-core attention kernels for short chunks (decode, chunked prefill under 64 queries;
// src/backend/cuda/ops_attention_kernels.h and ops_attention_backward_kernels.h), run on the CPU
// by the host GPU emulation against the CPU backend, in fp32 (max|got - cpu| / max|cpu| < 1e-4).
// This file is built twice: with 32-lane warps (zaya_simt_tests, as on NVIDIA) and with 64-lane
// warps (zaya_simt_wave64_tests, as CDNA's wavefronts on AMD, where the head vector spreads over
// 64 lanes and every reduction crosses 64): the wave64 build is the only place the HIP build's
// kernels run at all until an AMD GPU is lent. The launches repeat CudaBackend::attention and
// attention_backward's grids for chunks under kAttnGemmMinQueries.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/ops_attention_backward_kernels.h"
#include "backend/cuda/ops_attention_kernels.h"
#include "test_helpers.h"

namespace zaya {
namespace {

constexpr double kTol = 1e-4;

struct Case {
  int64_t B, T, S, Hq, Hkv, dh, window;
  std::vector<int64_t> pos0;
  bool segmented;
};

std::string describe(const Case& c) {
  return "warp " + std::to_string(GPU_WARP_SIZE) + " B " + std::to_string(c.B) + " T " + std::to_string(c.T) +
         " S " + std::to_string(c.S) + " Hq " + std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv) + " dh " +
         std::to_string(c.dh) + " window " + std::to_string(c.window) + " pos0 " + std::to_string(c.pos0[0]) +
         (c.segmented ? " segmented" : "");
}

// Document starts at 0, 11, 12 and 30: seg[b*T + t] = the latest start <= t.
std::vector<int32_t> segments(int64_t B, int64_t T) {
  std::vector<int32_t> seg(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) seg[size_t(b * T + t)] = t >= 30 ? 30 : t >= 12 ? 12 : t >= 11 ? 11 : 0;
  return seg;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double err = test::max_rel_err(got.data(), want.data(), got.size());
  EXPECT_LT(err, kTol) << what << ": max rel err " << err;
}

void check_case(const Case& c, uint64_t seed) {
  const std::string what = describe(c);
  const int64_t nq = c.B * c.T * c.Hq * c.dh, nkv = c.B * c.S * c.Hkv * c.dh;
  std::vector<float> q = test::random_vector(size_t(nq), seed), k = test::random_vector(size_t(nkv), seed + 1),
                     v = test::random_vector(size_t(nkv), seed + 2), dout = test::random_vector(size_t(nq), seed + 3);
  for (int64_t b = 0; b < c.B; ++b)  // cache slots past each chunk were never written
    for (int64_t s = c.pos0[size_t(b)] + c.T; s < c.S; ++s)
      for (int64_t e = 0; e < c.Hkv * c.dh; ++e) {
        k[size_t((b * c.S + s) * c.Hkv * c.dh + e)] = NAN;
        v[size_t((b * c.S + s) * c.Hkv * c.dh + e)] = NAN;
      }
  const std::vector<int32_t> seg = c.segmented ? segments(c.B, c.T) : std::vector<int32_t>{};

  AttentionArgs a;
  std::vector<float> out(static_cast<size_t>(nq));
  a.q = q.data(); a.k_cache = k.data(); a.v_cache = v.data(); a.out = out.data(); a.pos0 = c.pos0.data();
  a.B = c.B; a.T = c.T; a.S = c.S; a.Hq = c.Hq; a.Hkv = c.Hkv; a.dh = c.dh; a.window = c.window;
  a.scale = 1.0f / std::sqrt(float(c.dh));
  a.seg_start = c.segmented ? seg.data() : nullptr;
  CpuBackend cpu;
  cpu.attention(a);

  // The kernels' parameters, as attn_params sets them ("device" memory is host memory here).
  AttnParams p;
  p.q = q.data(); p.k = k.data(); p.v = v.data(); p.pos0 = c.pos0.data(); p.seg = c.segmented ? seg.data() : nullptr;
  p.B = c.B; p.T = c.T; p.S = c.S; p.Hq = c.Hq; p.Hkv = c.Hkv; p.dh = c.dh; p.window = c.window; p.scale = a.scale;
  std::vector<float> got(size_t(nq), NAN);
  p.out = got.data();
  const unsigned threads = unsigned(kAttnWarps * GPU_WARP_SIZE);
  const int64_t tile_q = int64_t(kAttnWarps) * attention_fwd::kQueriesPerWarp;
  simt::launch(dim3(unsigned((c.T + tile_q - 1) / tile_q), unsigned(c.Hq), unsigned(c.B)), dim3(threads), 0,
               [&] { attention_fwd::k_attention(p); });
  expect_close(got, out, what + " out");

  if (c.pos0[0] != 0) return;  // the backward serves training chunks (pos0 = 0, S = T)
  std::vector<float> dq(static_cast<size_t>(nq)), dk(static_cast<size_t>(nkv)), dv(static_cast<size_t>(nkv));
  cpu.attention_backward(a, dout.data(), dq.data(), dk.data(), dv.data());
  std::vector<float> lse(size_t(c.B * c.T * c.Hq), NAN), drow(size_t(c.B * c.T * c.Hq), NAN);
  std::vector<float> gdq(size_t(nq), NAN), gdk(size_t(nkv), NAN), gdv(size_t(nkv), NAN);
  p.o = out.data(); p.dout = dout.data();
  p.dq = gdq.data(); p.dk = gdk.data(); p.dv = gdv.data(); p.lse = lse.data(); p.drow = drow.data();
  const int64_t bq = int64_t(kAttnWarps) * attention_bwd::kQueriesPerWarp,
                bk = int64_t(kAttnWarps) * attention_bwd::kKeysPerWarp;
  simt::launch(dim3(unsigned((c.T + bq - 1) / bq), unsigned(c.Hq), unsigned(c.B)), dim3(threads), 0,
               [&] { attention_bwd::k_attention_dq(p); });
  simt::launch(dim3(unsigned((c.S + bk - 1) / bk), unsigned(c.Hkv), unsigned(c.B)), dim3(threads), 0,
               [&] { attention_bwd::k_attention_dkdv(p); });
  expect_close(gdq, dq, what + " dq");
  expect_close(gdk, dk, what + " dk");
  expect_close(gdv, dv, what + " dv");
}

// Head dims from 16 to 128 (on 64-lane warps, 128 is two elements a lane and 16 leaves 48 lanes
// idle), GQA 2:1 and 4:1, several query and key tiles, windows, document starts, and decode
// offsets in a NaN-padded cache.
TEST(SimtCudaCoreAttention, ShortChunksMatchTheCpuForwardAndBackward) {
  const std::vector<Case> cases = {
      {1, 37, 37, 2, 1, 16, 0, {0}, false},    {1, 21, 21, 4, 2, 128, 0, {0}, false},
      {1, 40, 40, 2, 1, 64, 9, {0}, false},    {1, 35, 35, 2, 1, 64, 0, {0}, true},
      {1, 33, 33, 4, 1, 128, 7, {0}, true},    {2, 3, 40, 4, 2, 64, 0, {20, 36}, false},
      {2, 1, 40, 8, 2, 128, 6, {12, 39}, false},
  };
  // The cases alternate between warps in step and warp 0 running ahead to each barrier (the
  // kernels stage K/V tiles in shared memory between barriers).
  uint64_t seed = 501;
  bool in_step = true;
  for (const Case& c : cases) {
    simt::set_schedule({in_step, false});
    check_case(c, seed += 10);
    in_step = !in_step;
  }
  simt::set_schedule({});
}

}  // namespace
}  // namespace zaya
