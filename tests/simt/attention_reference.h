// One attention check for the emulated GPU kernels (test_simt_flash_attention.cpp,
// test_simt_attention_cuda_cores.cpp): random inputs for a shape, NaN in the cache slots past each
// chunk (no kernel may read them), document starts, the kernels' AttnParams as attn_params sets
// them ("device" memory is host memory under the emulation), and the CPU backend's forward and
// backward as the reference. The backward serves chunks at an offset too: a context-parallel
// chunk's queries at pos0 + t over its whole gathered sequence (docs/training.md).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/ops_attention_common.h"
#include "test_helpers.h"

namespace zaya::simt_test {

struct AttnCase {
  int64_t B, T, S, Hq, Hkv, dh, window;
  std::vector<int64_t> pos0;
  bool segmented;
};

inline std::string describe(const AttnCase& c) {
  return "warp " + std::to_string(GPU_WARP_SIZE) + " B " + std::to_string(c.B) + " T " + std::to_string(c.T) +
         " S " + std::to_string(c.S) + " Hq " + std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv) + " dh " +
         std::to_string(c.dh) + " window " + std::to_string(c.window) + " pos0 " + std::to_string(c.pos0[0]) +
         (c.segmented ? " segmented" : "");
}

// Document starts at chunk positions 0, 11, 12, 30 (and T - 40 for chunks over 100, 2 for chunks
// under 11): seg[b*T + t] = the key position of the latest start <= t. A chunk at an offset
// (context parallelism) continues a document that began 5 keys before it, and its later starts
// sit at pos0 + start.
inline std::vector<int32_t> segments(int64_t B, int64_t T, const std::vector<int64_t>& pos0) {
  std::vector<int32_t> starts = {0, 11, 12, 30};
  if (T > 100) starts.push_back(int32_t(T) - 40);
  if (T < 11) starts.push_back(2);
  std::vector<int32_t> seg(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t p0 = int32_t(pos0[size_t(b)]);
    for (int64_t t = 0; t < T; ++t) {
      int32_t s = 0;
      for (int32_t st : starts)
        if (st <= t) s = st;
      seg[size_t(b * T + t)] = s == 0 ? (p0 >= 5 ? p0 - 5 : 0) : p0 + s;
    }
  }
  return seg;
}

using test::expect_close;

// The inputs and the CPU's results for one case (holds pointers into itself: not copyable).
struct AttnReference {
  AttnCase c;
  std::vector<float> q, k, v, dout;  // inputs
  std::vector<int32_t> seg;
  std::vector<float> out, dq, dk, dv;  // the CPU's forward and backward
  AttentionArgs args;

  // edit, when given, changes the inputs before the CPU computes its results.
  AttnReference(const AttnCase& cs, uint64_t seed, const std::function<void(AttnReference&)>& edit = nullptr)
      : c(cs) {
    const int64_t nq = c.B * c.T * c.Hq * c.dh, nkv = c.B * c.S * c.Hkv * c.dh;
    q = test::random_vector(size_t(nq), seed);
    k = test::random_vector(size_t(nkv), seed + 1);
    v = test::random_vector(size_t(nkv), seed + 2);
    dout = test::random_vector(size_t(nq), seed + 3);
    for (int64_t b = 0; b < c.B; ++b)  // cache slots past each chunk were never written
      for (int64_t s = c.pos0[size_t(b)] + c.T; s < c.S; ++s)
        for (int64_t e = 0; e < c.Hkv * c.dh; ++e) {
          k[size_t((b * c.S + s) * c.Hkv * c.dh + e)] = NAN;
          v[size_t((b * c.S + s) * c.Hkv * c.dh + e)] = NAN;
        }
    if (c.segmented) seg = segments(c.B, c.T, c.pos0);
    if (edit) edit(*this);
    out.resize(size_t(nq));
    args.q = q.data(); args.k_cache = k.data(); args.v_cache = v.data(); args.out = out.data();
    args.pos0 = c.pos0.data();
    args.B = c.B; args.T = c.T; args.S = c.S; args.Hq = c.Hq; args.Hkv = c.Hkv; args.dh = c.dh;
    args.window = c.window;
    args.scale = 1.0f / std::sqrt(float(c.dh));
    args.seg_start = c.segmented ? seg.data() : nullptr;
    CpuBackend cpu;
    cpu.attention(args);
    dq.resize(size_t(nq));
    dk.resize(size_t(nkv));
    dv.resize(size_t(nkv));
    cpu.attention_backward(args, dout.data(), dq.data(), dk.data(), dv.data());
  }
  AttnReference(const AttnReference&) = delete;
  AttnReference& operator=(const AttnReference&) = delete;

  // The kernels' inputs, as attn_params sets them (outputs left null).
  AttnParams params() const {
    AttnParams p;
    p.q = q.data(); p.k = k.data(); p.v = v.data(); p.pos0 = c.pos0.data();
    p.seg = c.segmented ? seg.data() : nullptr;
    p.B = c.B; p.T = c.T; p.S = c.S; p.Hq = c.Hq; p.Hkv = c.Hkv; p.dh = c.dh; p.window = c.window;
    p.scale = args.scale;
    return p;
  }
};

}  // namespace zaya::simt_test
