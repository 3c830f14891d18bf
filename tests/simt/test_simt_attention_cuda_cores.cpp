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

#include "attention_reference.h"
#include "backend/cuda/ops_attention_backward_kernels.h"
#include "backend/cuda/ops_attention_kernels.h"

namespace zaya {
namespace {

using simt_test::AttnCase;
using simt_test::AttnReference;

constexpr double kTol = 1e-4;

// The forward whole, and with each query tile's keys split over 3 and over 7 blocks whose slices
// k_attention_merge combines (decode over a long cache; attention_key_splits.h).
void check_forward(const AttnCase& c, const AttnReference& ref, const std::string& what) {
  const int64_t nq = int64_t(ref.q.size());
  const AttnParams p = ref.params();
  const unsigned threads = unsigned(kAttnWarps * GPU_WARP_SIZE);
  const int64_t tile_q = int64_t(kAttnWarps) * attention_fwd::kQueriesPerWarp;
  for (const int64_t splits : {int64_t(1), int64_t(3), int64_t(7)}) {
    std::vector<float> got(size_t(nq), NAN), part(size_t(nq / c.dh * splits * (c.dh + 2)), NAN);
    AttnParams ps = p;
    ps.out = got.data();
    ps.splits = splits;
    ps.part = splits > 1 ? part.data() : nullptr;
    simt::launch(dim3(unsigned((c.T + tile_q - 1) / tile_q * splits), unsigned(c.Hq), unsigned(c.B)), dim3(threads),
                 0, [&] { attention_fwd::k_attention(ps); });
    if (splits > 1) {
      const int64_t rows = c.B * c.T * c.Hq, per_block = 4;
      simt::launch(dim3(unsigned((rows + per_block - 1) / per_block)), dim3(unsigned(per_block * GPU_WARP_SIZE)), 0,
                   [&] { attention_fwd::k_attention_merge(ps); });
    }
    simt_test::expect_close(got, ref.out, kTol, what + " out, keys in " + std::to_string(splits) + " splits");
  }
}

void check_case(const AttnCase& c, uint64_t seed) {
  const std::string what = simt_test::describe(c);
  const AttnReference ref(c, seed);
  check_forward(c, ref, what);
  const int64_t nq = int64_t(ref.q.size()), nkv = int64_t(ref.k.size());
  AttnParams p = ref.params();
  const unsigned threads = unsigned(kAttnWarps * GPU_WARP_SIZE);

  std::vector<float> lse(size_t(c.B * c.T * c.Hq), NAN), drow(size_t(c.B * c.T * c.Hq), NAN);
  std::vector<float> gdq(size_t(nq), NAN), gdk(size_t(nkv), NAN), gdv(size_t(nkv), NAN);
  p.o = ref.out.data(); p.dout = ref.dout.data();
  p.dq = gdq.data(); p.dk = gdk.data(); p.dv = gdv.data(); p.lse = lse.data(); p.drow = drow.data();
  const int64_t bq = int64_t(kAttnWarps) * attention_bwd::kQueriesPerWarp,
                bk = int64_t(kAttnWarps) * attention_bwd::kKeysPerWarp;
  simt::launch(dim3(unsigned((c.T + bq - 1) / bq), unsigned(c.Hq), unsigned(c.B)), dim3(threads), 0,
               [&] { attention_bwd::k_attention_dq(p); });
  simt::launch(dim3(unsigned((c.S + bk - 1) / bk), unsigned(c.Hkv), unsigned(c.B)), dim3(threads), 0,
               [&] { attention_bwd::k_attention_dkdv(p); });
  simt_test::expect_close(gdq, ref.dq, kTol, what + " dq");
  simt_test::expect_close(gdk, ref.dk, kTol, what + " dk");
  simt_test::expect_close(gdv, ref.dv, kTol, what + " dv");
}

// Head dims from 16 to 128 (on 64-lane warps, 128 is two elements a lane and 16 leaves 48 lanes
// idle), GQA 2:1 and 4:1, several query and key tiles, windows, document starts, and decode
// offsets in a NaN-padded cache (backward too: a context-parallel chunk under 64 queries sits at
// an offset); the forward also with its keys split over several blocks.
TEST(SimtCudaCoreAttention, ShortChunksMatchTheCpuForwardAndBackward) {
  const std::vector<AttnCase> cases = {
      {1, 37, 37, 2, 1, 16, 0, {0}, false},    {1, 21, 21, 4, 2, 128, 0, {0}, false},
      {1, 40, 40, 2, 1, 64, 9, {0}, false},    {1, 35, 35, 2, 1, 64, 0, {0}, true},
      {1, 33, 33, 4, 1, 128, 7, {0}, true},    {2, 3, 40, 4, 2, 64, 0, {20, 36}, false},
      {2, 1, 40, 8, 2, 128, 6, {12, 39}, false}, {2, 8, 32, 4, 2, 64, 5, {8, 16}, true},
      // Decode over longer caches: several key tiles in every split.
      {1, 1, 700, 4, 2, 64, 0, {699}, false},    {2, 4, 600, 4, 2, 128, 100, {300, 596}, true},
  };
  // The cases alternate between warps in step and warp 0 running ahead to each barrier (the
  // kernels stage K/V tiles in shared memory between barriers).
  uint64_t seed = 501;
  bool in_step = true;
  for (const AttnCase& c : cases) {
    simt::set_schedule({in_step, false});
    check_case(c, seed += 10);
    in_step = !in_step;
  }
  simt::set_schedule({});
}

// Keys whose score is -inf (an infinite key component that the query multiplies by a positive
// value) weigh 0, as on the CPU, also when such a key is the first a warp or a key slice meets:
// here keys 0-3 of every 32-key tile, the first of each warp's share of it. Decode (two queries:
// every warp over its share of the keys) and a chunk of 20 queries (a warp per 4 queries).
TEST(SimtCudaCoreAttention, InfiniteKeysWeighNothingAsOnTheCpu) {
  const std::vector<AttnCase> cases = {{1, 2, 300, 4, 2, 64, 0, {298}, false}, {1, 20, 20, 2, 1, 64, 0, {0}, false}};
  for (const AttnCase& c : cases) {
    const AttnReference ref(c, 777, [](AttnReference& r) {
      const AttnCase& k = r.c;
      for (int64_t row = 0; row < k.B * k.T * k.Hq; ++row) r.q[size_t(row * k.dh)] = 1.0f;
      for (int64_t b = 0; b < k.B; ++b)
        for (int64_t s = 0; s < k.pos0[size_t(b)] + k.T; ++s)
          if (s % 32 < 4)
            for (int64_t g = 0; g < k.Hkv; ++g) r.k[size_t(((b * k.S + s) * k.Hkv + g) * k.dh)] = -INFINITY;
    });
    check_forward(c, ref, simt_test::describe(c) + " with infinite keys");
  }
}

}  // namespace
}  // namespace zaya
