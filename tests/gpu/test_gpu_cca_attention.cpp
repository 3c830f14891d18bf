// CCA and attention ops of the GPU backend against the CPU backend (fp32 paths 1e-4):
// the two-stage conv with carried state and with packed-document resets (chunks of 1, 13 and
// 150 tokens, every GEMM mode, a deterministic backward), QK-norm +
// temperature + partial RoPE, the delayed values, cache writes, and causal GQA attention
// (head_dim 16/64/128, sliding window, decode offsets, document starts), forward and
// backward (chunks at an offset too, as context parallelism runs them; attention in every GEMM
// mode: 64 or more queries run on the GEMM engine, at the bf16 tolerance under bf16 operands;
// and on the tensor-core flash kernels, whose backward must also repeat bit for bit), with NaN
// in the cache slots no query may read; and decode with its keys split over blocks. Skipped
// ("skipped: no GPU") without a device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "backend/cuda/attention_key_splits.h"
#include "gpu_test_support.h"
#if defined(ZAYA_SIMT)
#include "simt_host_api.h"  // the emulated runtime's counts
#endif

namespace zaya {
namespace {

using namespace gpu_test;

class GpuCca : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
    gpu = make_cuda_backend({});
  }
  CpuBackend cpu;
  std::unique_ptr<Backend> gpu;
};

// seg_start for B rows of T tokens with documents starting at the given positions of each row.
std::vector<int32_t> segments(int64_t B, int64_t T, const std::vector<std::vector<int32_t>>& starts) {
  std::vector<int32_t> seg(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t cur = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int32_t s : starts[size_t(b)])
        if (s == t) cur = s;
      seg[size_t(b * T + t)] = cur;
    }
  }
  return seg;
}

// T = 1 and 8: the whole forward in one kernel (its 2 and 16 rows are at most
// kConvFewRowsMaxRows of src/backend/cuda/ops_cca.cu; T = 1 is shorter than the carried state);
// T = 13: the one-kernel grouped stage from the transposed weights (26 rows, below
// kConvGemmMinTokens = 64 of src/backend/cuda/ops_cca_common.h); T = 150: its GEMM path. The backward always runs the GEMMs, twice, which must
// agree bitwise. The conv stays fp32 under every GEMM mode (bf16 policy, fp32, the tiled engine
// that HIP without hipBLASLt uses), so every mode is held to the fp32 tolerance.
TEST_F(GpuCca, Conv) {
  const int64_t B = 2, G = 16, C = 6 * G;
  for (const GemmMode& mode : gemm_modes()) {
  auto gpu = make_gpu(mode);
  for (int64_t T : {int64_t(1), int64_t(8), int64_t(13), int64_t(150)})
  for (int64_t taps : {2, 3})
    for (bool segmented : {false, true}) {
      const auto seg = T == 1    ? segments(B, T, {{0}, {0}})
                       : T == 8  ? segments(B, T, {{0, 3}, {0, 1, 6}})
                       : T == 13 ? segments(B, T, {{0, 5, 9}, {0, 7}})
                                 : segments(B, T, {{0, 5, 9, 100}, {0, 70}});
      const int64_t P = 2 * (taps - 1);
      auto u = rnd(size_t(B * T * C)), state0 = segmented ? std::vector<float>(size_t(B * P * C), 0.0f)
                                                           : rnd(size_t(B * P * C));
      auto w_dw = rnd(size_t(C * taps), 0.5), b_dw = rnd(size_t(C), 0.1), w_grp = rnd(size_t(C * G * taps), 0.2),
           b_grp = rnd(size_t(C), 0.1);
      std::vector<float> z(size_t(B * T * C)), state = state0;
      CcaConvArgs a;
      a.u = u.data(); a.state = state.data(); a.w_dw = w_dw.data(); a.b_dw = b_dw.data(); a.w_grp = w_grp.data();
      a.b_grp = b_grp.data(); a.z = z.data(); a.B = B; a.T = T; a.C = C; a.t0 = taps; a.t1 = taps; a.group = G;
      a.seg_start = segmented ? seg.data() : nullptr;
      cpu.cca_conv(a);
      DevBuf gu(*gpu, u), gs(*gpu, state0), gwd(*gpu, w_dw), gbd(*gpu, b_dw), gwg(*gpu, w_grp), gbg(*gpu, b_grp),
          gz(*gpu, B * T * C);
      CcaConvArgs g = a;
      g.u = gu.f(); g.state = gs.f(); g.w_dw = gwd.f(); g.b_dw = gbd.f(); g.w_grp = gwg.f(); g.b_grp = gbg.f();
      g.z = gz.f();
      gpu->cca_conv(g);
      const std::string what = std::string(mode.name) + " cca_conv T " + std::to_string(T) + " taps " +
                               std::to_string(taps) + (segmented ? " segmented" : "");
      expect_close(gz.get(), z, kTolF32, what + " z");
      expect_close(gs.get(), state, kTolF32, what + " state");

      // Backward (zero state), twice.
      auto dz = rnd(size_t(B * T * C)), du0 = rnd(size_t(B * T * C)), dwd0 = rnd(size_t(C * taps)),
           dbd0 = rnd(static_cast<size_t>(C)), dwg0 = rnd(size_t(C * G * taps)), dbg0 = rnd(static_cast<size_t>(C));
      std::vector<float> du = du0, dwd = dwd0, dbd = dbd0, dwg = dwg0, dbg = dbg0;
      CcaConvArgs ab = a;
      ab.state = nullptr;
      cpu.cca_conv_backward(ab, dz.data(), du.data(), dwd.data(), dbd.data(), dwg.data(), dbg.data());
      DevBuf gdz(*gpu, dz);
      CcaConvArgs gb = g;
      gb.state = nullptr;
      std::vector<std::vector<float>> runs;
      for (int run = 0; run < 2; ++run) {
        DevBuf gdu(*gpu, du0), gdwd(*gpu, dwd0), gdbd(*gpu, dbd0), gdwg(*gpu, dwg0), gdbg(*gpu, dbg0);
        gpu->cca_conv_backward(gb, gdz.f(), gdu.f(), gdwd.f(), gdbd.f(), gdwg.f(), gdbg.f());
        const std::vector<float> gdu_h = gdu.get(), gdwd_h = gdwd.get(), gdbd_h = gdbd.get(), gdwg_h = gdwg.get(),
                                 gdbg_h = gdbg.get();
        if (run == 0) {
          expect_close(gdu_h, du, kTolF32, what + " du");
          expect_close(gdwd_h, dwd, kTolF32, what + " dw_dw");
          expect_close(gdbd_h, dbd, kTolF32, what + " db_dw");
          expect_close(gdwg_h, dwg, kTolF32, what + " dw_grp");
          expect_close(gdbg_h, dbg, kTolF32, what + " db_grp");
        }
        std::vector<float> all;
        for (const auto* v : {&gdu_h, &gdwd_h, &gdbd_h, &gdwg_h, &gdbg_h}) all.insert(all.end(), v->begin(), v->end());
        runs.push_back(all);
      }
      ASSERT_EQ(runs[0].size(), runs[1].size());
      EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4), 0)
          << what << ": two identical backward runs differ";
    }
  }
}

// The whole conv of a few rows in one kernel (k_conv_few_rows) at ZAYA1's group width: G = 128,
// so both stages' loops stride past the block's threads; unequal tap counts (t0 != t1, the
// depthwise rows and the grouped window differ); with a carried state, and on the GPU without
// one (null: zeros, as the backward's recompute passes it) against the CPU given zeros.
TEST_F(GpuCca, ConvOfAFewRowsWithWideGroups) {
  const int64_t B = 2, G = 128, C = 2 * G;
  for (int64_t T : {int64_t(1), int64_t(8)})
    for (const auto& [t0, t1] : std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {3, 2}})
      for (bool with_state : {true, false}) {
        const int64_t P = (t0 - 1) + (t1 - 1);
        auto u = rnd(size_t(B * T * C)),
             state0 = with_state ? rnd(size_t(B * P * C)) : std::vector<float>(size_t(B * P * C), 0.0f);
        auto w_dw = rnd(size_t(C * t0), 0.5), b_dw = rnd(size_t(C), 0.1), w_grp = rnd(size_t(C * G * t1), 0.1),
             b_grp = rnd(size_t(C), 0.1);
        std::vector<float> z(size_t(B * T * C)), state = state0;
        CcaConvArgs a;
        a.u = u.data(); a.state = state.data(); a.w_dw = w_dw.data(); a.b_dw = b_dw.data();
        a.w_grp = w_grp.data(); a.b_grp = b_grp.data(); a.z = z.data(); a.B = B; a.T = T; a.C = C; a.t0 = t0;
        a.t1 = t1; a.group = G;
        cpu.cca_conv(a);
        DevBuf gu(*gpu, u), gs(*gpu, state0), gwd(*gpu, w_dw), gbd(*gpu, b_dw), gwg(*gpu, w_grp), gbg(*gpu, b_grp),
            gz(*gpu, B * T * C);
        CcaConvArgs g = a;
        g.u = gu.f(); g.state = with_state ? gs.f() : nullptr; g.w_dw = gwd.f(); g.b_dw = gbd.f(); g.w_grp = gwg.f();
        g.b_grp = gbg.f(); g.z = gz.f();
        gpu->cca_conv(g);
        const std::string what = "wide cca_conv T " + std::to_string(T) + " t0 " + std::to_string(t0) + " t1 " +
                                 std::to_string(t1) + (with_state ? "" : " no state");
        expect_close(gz.get(), z, kTolF32, what + " z");
        if (with_state) expect_close(gs.get(), state, kTolF32, what + " state");
      }
}

// One cca_qk call on fresh random inputs at the given positions, run on the CPU (arguments `a`,
// host outputs q and k) and on the GPU (arguments `g`, over the device buffers held here), with
// both results compared.
struct CcaQkCall {
  CcaQkCall(Backend& cpu, Backend& gpu, const std::vector<int64_t>& positions, int64_t Hq_, int64_t Hkv_,
            int64_t dh_, int64_t rotary, const std::string& what)
      : N(int64_t(positions.size())), Hq(Hq_), Hkv(Hkv_), dh(dh_), C((Hq + Hkv) * dh), z(rnd(size_t(N * C))),
        u(rnd(size_t(N * C))), temp(rnd_positive(size_t(Hkv), 0.5, 2.0)), q(size_t(N * Hq * dh)),
        k(size_t(N * Hkv * dh)), gz(gpu, z), gu(gpu, u), gt(gpu, temp), gq(gpu, N * Hq * dh), gk(gpu, N * Hkv * dh) {
    a.z = z.data(); a.u = u.data(); a.temp = temp.data(); a.positions = positions.data(); a.q = q.data();
    a.k = k.data(); a.N = N; a.Hq = Hq; a.Hkv = Hkv; a.dh = dh; a.rotary_dim = rotary; a.theta = 1e4;
    cpu.cca_qk(a);
    g = a;
    g.z = gz.f(); g.u = gu.f(); g.temp = gt.f(); g.q = gq.f(); g.k = gk.f();
    gpu.cca_qk(g);
    expect_close(gq.get(), q, kTolF32, what + " q");
    expect_close(gk.get(), k, kTolF32, what + " k");
  }
  const int64_t N, Hq, Hkv, dh, C;
  std::vector<float> z, u, temp, q, k;
  DevBuf gz, gu, gt, gq, gk;
  CcaQkArgs a, g;
};

// N = 5: the forward computes the rotation in place (a decode-sized call); N = 23: from the
// RoPE table.
TEST_F(GpuCca, QkNormRopeAndBackward) {
  for (int64_t N : {int64_t(5), int64_t(23)})
  for (int64_t dh : {16, 64, 128})
    for (int64_t Hq : {4, 8}) {
      const int64_t Hkv = 2, C = (Hq + Hkv) * dh;
      for (int64_t rotary : {dh, dh / 2}) {
        std::vector<int64_t> positions(static_cast<size_t>(N));
        for (int64_t n = 0; n < N; ++n) positions[size_t(n)] = (n % 11) * 37 + 5;
        const std::string what = "cca_qk N " + std::to_string(N) + " dh " + std::to_string(dh) + " Hq " +
                                 std::to_string(Hq) + " rotary " + std::to_string(rotary);
        const CcaQkCall call(cpu, *gpu, positions, Hq, Hkv, dh, rotary, what);
        const CcaQkArgs &a = call.a, &g = call.g;

        auto dq = rnd(size_t(N * Hq * dh)), dk = rnd(size_t(N * Hkv * dh)), du0 = rnd(size_t(N * C)),
             dt0 = rnd(static_cast<size_t>(Hkv));
        std::vector<float> dz(size_t(N * C)), du = du0, dt = dt0;
        cpu.cca_qk_backward(a, dq.data(), dk.data(), dz.data(), du.data(), dt.data());
        DevBuf gdq(*gpu, dq), gdk(*gpu, dk), gdz(*gpu, N * C), gdu(*gpu, du0), gdt(*gpu, dt0);
        gpu->cca_qk_backward(g, gdq.f(), gdk.f(), gdz.f(), gdu.f(), gdt.f());
        expect_close(gdz.get(), dz, kTolF32, what + " dz");
        expect_close(gdu.get(), du, kTolF32, what + " du");
        expect_close(gdt.get(), dt, kTolF32, what + " dtemp");
      }
    }
}

TEST_F(GpuCca, ValuesAndCacheWrite) {
  const int64_t B = 3, T = 9, half = 32;
  const auto seg = segments(B, T, {{0}, {0, 4}, {0, 1, 8}});
  for (bool segmented : {false, true}) {
    auto vc = rnd(size_t(B * T * half)), vd = rnd(size_t(B * T * half));
    auto st0 = segmented ? std::vector<float>(size_t(B * half), 0.0f) : rnd(size_t(B * half));
    std::vector<float> v(size_t(B * T * 2 * half)), st = st0;
    CcaValueArgs a;
    a.v_cur = vc.data(); a.v_del = vd.data(); a.v_state = st.data(); a.v = v.data(); a.B = B; a.T = T; a.half = half;
    a.seg_start = segmented ? seg.data() : nullptr;
    cpu.cca_values(a);
    DevBuf gvc(*gpu, vc), gvd(*gpu, vd), gst(*gpu, st0), gv(*gpu, B * T * 2 * half);
    CcaValueArgs g = a;
    g.v_cur = gvc.f(); g.v_del = gvd.f(); g.v_state = gst.f(); g.v = gv.f();
    gpu->cca_values(g);
    expect_close(gv.get(), v, kTolF32, segmented ? "cca_values segmented" : "cca_values");
    expect_close(gst.get(), st, kTolF32, "cca_values state");
    auto dv = rnd(size_t(B * T * 2 * half));
    std::vector<float> dcur(size_t(B * T * half)), ddel(size_t(B * T * half));
    cpu.cca_values_backward(dv.data(), dcur.data(), ddel.data(), B, T, half, a.seg_start);
    DevBuf gdv(*gpu, dv), gdc(*gpu, B * T * half), gdd(*gpu, B * T * half);
    gpu->cca_values_backward(gdv.f(), gdc.f(), gdd.f(), B, T, half, a.seg_start);
    expect_close(gdc.get(), dcur, kTolF32, "cca_values_backward dv_cur");
    expect_close(gdd.get(), ddel, kTolF32, "cca_values_backward dv_del");
  }
  const int64_t S = 20, W = 24, Tc = 5;
  const std::vector<int64_t> pos0 = {3, 10, 15};
  auto src = rnd(size_t(B * Tc * W)), cache0 = rnd(size_t(B * S * W));
  std::vector<float> cache = cache0;
  cpu.cache_write(src.data(), cache.data(), pos0.data(), B, Tc, S, W);
  DevBuf gsrc(*gpu, src), gcache(*gpu, cache0);
  gpu->cache_write(gsrc.f(), gcache.f(), pos0.data(), B, Tc, S, W);
  expect_close(gcache.get(), cache, kTolF32, "cache_write");
  // Keys and values at once (Backend's default: two cache_writes), one launch on the GPU; and a
  // key chunk that is its whole cache (training's), left alone while the values are written.
  auto src_v = rnd(size_t(B * Tc * W)), cache0_v = rnd(size_t(B * S * W));
  std::vector<float> k_cache = cache0, v_cache = cache0_v;
  cpu.cache_write_kv(src.data(), src_v.data(), k_cache.data(), v_cache.data(), pos0.data(), B, Tc, S, W);
  DevBuf gsrc_v(*gpu, src_v), gk(*gpu, cache0), gv(*gpu, cache0_v);
#if defined(ZAYA_SIMT)
  const int64_t launches_before = simt::api_counts().launches;
#endif
  gpu->cache_write_kv(gsrc.f(), gsrc_v.f(), gk.f(), gv.f(), pos0.data(), B, Tc, S, W);
#if defined(ZAYA_SIMT)
  EXPECT_EQ(simt::api_counts().launches - launches_before, 1) << "cache_write_kv: launches";
#endif
  expect_close(gk.get(), k_cache, kTolF32, "cache_write_kv keys");
  expect_close(gv.get(), v_cache, kTolF32, "cache_write_kv values");
  const std::vector<int64_t> zeros(size_t(B), 0);
  auto whole = rnd(size_t(B * S * W)), src_v2 = rnd(size_t(B * S * W)), cache_v2 = rnd(size_t(B * S * W));
  std::vector<float> whole_cpu = whole, v2_cpu = cache_v2;
  cpu.cache_write_kv(whole_cpu.data(), src_v2.data(), whole_cpu.data(), v2_cpu.data(), zeros.data(), B, S, S, W);
  DevBuf gwhole(*gpu, whole), gsrc_v2(*gpu, src_v2), gv2(*gpu, cache_v2);
  gpu->cache_write_kv(gwhole.f(), gsrc_v2.f(), gwhole.f(), gv2.f(), zeros.data(), B, S, S, W);
  expect_close(gwhole.get(), whole, kTolF32, "cache_write_kv keys that are their cache");
  expect_close(gv2.get(), v2_cpu, kTolF32, "cache_write_kv values beside them");
}

// The backend keeps device copies of recent position arrays and hands them out again while the
// same bytes come back (CudaBackend::upload_reused): the same bytes again at once and after
// another (kept copies served), a host array changed in place (uploaded again), and contents
// that went out of the kept four and come back. cache_write's offsets and cca_qk's positions
// (the rotation in place and the table), each call against the CPU's.
TEST_F(GpuCca, ReusedPositionUploadsFollowTheHostBytes) {
  const int64_t B = 3, T = 2, S = 16, W = 8;
  const std::vector<std::vector<int64_t>> offsets = {{0, 3, 7}, {0, 3, 7}, {5, 3, 7}, {0, 3, 7}, {1, 1, 1},
                                                     {2, 9, 4}, {6, 0, 11}, {3, 12, 2}, {0, 3, 7}, {5, 3, 7}};
  std::vector<int64_t> pos0(3);  // one host array, rewritten in place
  for (size_t round = 0; round < offsets.size(); ++round) {
    pos0 = offsets[round];
    auto src = rnd(size_t(B * T * W)), cache0 = rnd(size_t(B * S * W));
    std::vector<float> cache = cache0;
    cpu.cache_write(src.data(), cache.data(), pos0.data(), B, T, S, W);
    DevBuf gsrc(*gpu, src), gcache(*gpu, cache0);
    gpu->cache_write(gsrc.f(), gcache.f(), pos0.data(), B, T, S, W);
    expect_close(gcache.get(), cache, kTolF32, "cache_write round " + std::to_string(round));
  }
  const int64_t Hq = 4, Hkv = 2, dh = 16;
  for (int64_t N : {int64_t(3), int64_t(20)}) {  // the rotation in place, and from the table
    std::vector<int64_t> positions(static_cast<size_t>(N));
    const int starts[] = {0, 0, 1, 0, 2, 3, 4, 5, 1};  // kept copies served (rounds 1, 3), and past the four
    for (int round = 0; round < 9; ++round) {
      for (int64_t n = 0; n < N; ++n) positions[size_t(n)] = starts[round] * 100 + n;
      const CcaQkCall call(cpu, *gpu, positions, Hq, Hkv, dh, dh,
                           "cca_qk N " + std::to_string(N) + " round " + std::to_string(round));
    }
  }
}

// Small uploads are staged in a pinned ring (CudaBackendOptions::upload_staging_*,
// src/backend/cuda/staging_ring.h). With two chunks of 1 KiB it wraps within every round, so
// each chunk is written again while earlier copies from it may not have run: every upload of a
// round is staged (each round's cache, six cache writes' sources and offsets between waits, and
// cca_values' inputs and document starts), against the CPU. On a GPU each round first enqueues
// GEMMs that keep the device busy while the host stages them; the host emulation checks, at each
// wait, that no pinned source was rewritten before its copy was known to have run, and answers a
// chunk's first query "not ready", so a ring that rewrote a chunk without waiting for it, or that
// left the query's "not ready" as the last error, fails here. A ring it cannot serve is refused
// with the sizes it takes.
TEST_F(GpuCca, StagedUploadsSurviveTheRingWrappingRound) {
  CudaBackendOptions o;
  o.upload_staging_chunk_bytes = 1024;
  o.upload_staging_chunks = 2;
  auto staged = make_cuda_backend(o);
  const int64_t B = 3, T = 2, S = 8, W = 8, half = 4;  // a cache of 768 bytes: staged too
#if !defined(ZAYA_SIMT)
  const int64_t L = 4096;  // 137 GFLOP a GEMM: the device lags the host by far more than a round
  DevBuf lx(*staged, L * L), lw(*staged, L * L), ly(*staged, L * L);
#endif
  std::vector<int64_t> pos0(static_cast<size_t>(B));
  for (int round = 0; round < 8; ++round) {
#if !defined(ZAYA_SIMT)
    staged->fill(lx.f(), 0.5f, L * L);
    staged->fill(lw.f(), 0.25f, L * L);
    for (int busy = 0; busy < 2; ++busy) staged->linear(lx.f(), lw.f(), nullptr, ly.f(), L, L, L, false, 0);
#endif
    auto cache0 = rnd(size_t(B * S * W));
    std::vector<float> cache = cache0;
    DevBuf gcache(*staged, cache0);
    for (int write = 0; write < 6; ++write) {  // 6 x (192 + 32) bytes before the next wait
      for (int64_t b = 0; b < B; ++b) pos0[size_t(b)] = (round * 3 + write + b * 2) % (S - T + 1);
      auto src = rnd(size_t(B * T * W));
      cpu.cache_write(src.data(), cache.data(), pos0.data(), B, T, S, W);
      DevBuf gsrc(*staged, src);
      staged->cache_write(gsrc.f(), gcache.f(), pos0.data(), B, T, S, W);
    }
    expect_close(gcache.get(), cache, kTolF32, "staged cache_write round " + std::to_string(round));
    if (round % 2 == 0) {  // document starts: B * T int32 per call
      const auto seg = segments(B, T, {{0}, {0, round % 2}, {0, 1}});
      auto vc = rnd(size_t(B * T * half)), vd = rnd(size_t(B * T * half)), st0 = rnd(size_t(B * half));
      std::vector<float> v(size_t(B * T * 2 * half)), st = st0;
      CcaValueArgs a;
      a.v_cur = vc.data(); a.v_del = vd.data(); a.v_state = st.data(); a.v = v.data(); a.B = B; a.T = T;
      a.half = half; a.seg_start = seg.data();
      cpu.cca_values(a);
      DevBuf gvc(*staged, vc), gvd(*staged, vd), gst(*staged, st0), gv(*staged, B * T * 2 * half);
      CcaValueArgs g = a;
      g.v_cur = gvc.f(); g.v_del = gvd.f(); g.v_state = gst.f(); g.v = gv.f();
      staged->cca_values(g);
      expect_close(gv.get(), v, kTolF32, "staged cca_values round " + std::to_string(round));
    }
  }
  EXPECT_NE(staged->diagnostics().find(" uploads staged in 2048 pinned bytes"), std::string::npos)
      << staged->diagnostics();
  for (const auto& [bytes, chunks] : std::vector<std::pair<int64_t, int>>{{24, 2}, {64, 1}, {0, 4}}) {
    CudaBackendOptions bad;
    bad.upload_staging_chunk_bytes = bytes;
    bad.upload_staging_chunks = chunks;
    test::expect_error([&] { make_cuda_backend(bad); },
                       {"upload staging of " + std::to_string(chunks) + " chunks of " + std::to_string(bytes) + " bytes",
                        "at least 2 chunks of a positive multiple of 16 bytes"});
  }
}

struct AttnCase {
  int64_t B, T, S, Hq, Hkv, dh, window;
  std::vector<int64_t> pos0;
  bool segmented;
};

// Random q, k and v for a case, with NaN in the cache slots past each sequence's chunk (never
// written: NaN there must not reach any output), an output buffer, and the AttentionArgs over
// them; seg: the document starts, or empty. Holds pointers into itself: not copyable.
struct AttnInputs {
  std::vector<float> q, k, v, out;
  AttentionArgs args;
  AttnInputs(const AttnCase& c, const std::vector<int32_t>& seg)
      : q(rnd(size_t(c.B * c.T * c.Hq * c.dh))),
        k(rnd(size_t(c.B * c.S * c.Hkv * c.dh))),
        v(rnd(size_t(c.B * c.S * c.Hkv * c.dh))),
        out(q.size()) {
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t s = c.pos0[size_t(b)] + c.T; s < c.S; ++s)
        for (int64_t e = 0; e < c.Hkv * c.dh; ++e) {
          k[size_t((b * c.S + s) * c.Hkv * c.dh + e)] = NAN;
          v[size_t((b * c.S + s) * c.Hkv * c.dh + e)] = NAN;
        }
    args.q = q.data(); args.k_cache = k.data(); args.v_cache = v.data(); args.out = out.data();
    args.pos0 = c.pos0.data();
    args.B = c.B; args.T = c.T; args.S = c.S; args.Hq = c.Hq; args.Hkv = c.Hkv; args.dh = c.dh;
    args.window = c.window;
    args.scale = 1.0f / std::sqrt(float(c.dh));
    args.seg_start = seg.empty() ? nullptr : seg.data();
  }
  AttnInputs(const AttnInputs&) = delete;
  AttnInputs& operator=(const AttnInputs&) = delete;
};

// Queries past the cache (pos0[b] + T > S) fail before any kernel reads outside it, on every
// path: the warp kernels (3 queries), and from 64 queries on the GEMM path or the tensor-core
// flash kernels, forward and backward.
TEST_F(GpuCca, AttentionFailsClearlyWhenTheQueriesPassTheCache) {
  std::vector<GemmMode> modes = gemm_modes();
  if (cuda_tensor_core_kernels_built()) modes.push_back({"bf16_flash", true, false, kTolBf16, false, false, true});
  for (const GemmMode& mode : modes) {
    auto be = make_gpu(mode);
    for (const int64_t T : {int64_t(3), int64_t(70)}) {
      const int64_t B = 2, S = T + 30, H = 2, dh = 64;
      const std::vector<int64_t> pos0 = {0, 31};  // sequence 1's last query at S
      DevBuf q(*be, rnd(size_t(B * T * H * dh))), kv(*be, rnd(size_t(B * S * H * dh))),
          out(*be, B * T * H * dh), dk(*be, B * S * H * dh), dv(*be, B * S * H * dh);
      AttentionArgs a{q.f(), kv.f(), kv.f(), out.f(), pos0.data(), B, T, S, H, H, dh, 0, 0.125f};
      const std::string what = "sequence 1 has its " + std::to_string(T) + " queries at positions 31.." +
                               std::to_string(30 + T);
      SCOPED_TRACE(std::string(mode.name) + " T " + std::to_string(T));
      test::expect_error([&] { be->attention(a); }, {"attention:", what, "holds " + std::to_string(S) + " rows"});
      test::expect_error([&] { be->attention_backward(a, q.f(), out.f(), dk.f(), dv.f()); },
                         {"attention_backward:", what});
    }
  }
}

TEST_F(GpuCca, Attention) {
  std::vector<AttnCase> cases = {
      {2, 37, 37, 4, 2, 16, 0, {0, 0}, false},
      {2, 70, 70, 8, 2, 64, 0, {0, 0}, false},
      {1, 45, 45, 4, 2, 128, 0, {0}, false},
      {2, 50, 50, 4, 2, 64, 9, {0, 0}, false},
      {2, 41, 41, 4, 2, 64, 0, {0, 0}, true},
      {2, 33, 33, 8, 2, 128, 7, {0, 0}, true},
      {2, 3, 40, 4, 2, 64, 0, {20, 36}, false},
      {2, 1, 40, 8, 2, 128, 6, {12, 39}, false},
      // kAttnGemmMinQueries (64) or more queries: the GEMM path; 1100 queries make two chunks.
      {2, 200, 200, 8, 2, 128, 0, {0, 0}, false},
      {1, 257, 257, 4, 2, 64, 33, {0}, false},
      {2, 150, 150, 4, 1, 64, 0, {0, 0}, true},
      {1, 1100, 1100, 4, 2, 64, 0, {0}, false},
      {1, 1100, 1100, 4, 2, 32, 300, {0}, true},
      {2, 96, 160, 4, 2, 64, 0, {64, 20}, false},
      // head_dim 128 across several key tiles with a window and document starts, and a chunk
      // of 70 queries at position 100 of a 200-slot cache (its unwritten slots hold NaN).
      {1, 300, 300, 8, 2, 128, 70, {0}, true},
      {1, 70, 200, 8, 2, 128, 0, {100}, false},
      // Context-parallel chunks with a sliding window: queries at an offset whose window starts
      // inside the chunk before them (the dK/dV kernel's query range at an offset).
      {1, 70, 200, 8, 2, 64, 20, {100}, false},
      {2, 40, 160, 4, 2, 64, 9, {40, 120}, false},
      // Context-parallel chunks of packed documents: the starts are key positions, the first
      // token's document began 5 positions before the chunk.
      {2, 40, 160, 4, 2, 64, 0, {40, 120}, true},
      // The same from 64 queries on (the GEMM path at an offset), with a window as well; and a
      // chunk at an offset long enough for two query blocks of the GEMM path (a real GPU only).
      {2, 80, 240, 4, 2, 64, 24, {80, 160}, true},
      {1, 1100, 1500, 4, 2, 32, 300, {400}, true},
  };
#if defined(ZAYA_SIMT_SMALL)
  // Under the host emulation (tests/simt) the two cases of 1100 queries would take a minute of
  // the CPU's time: the GPU runs them.
  std::erase_if(cases, [](const AttnCase& c) { return c.T > 1000; });
#if defined(__SANITIZE_ADDRESS__) || defined(ZAYA_SIMT_RACECHECK)
  // Under the sanitizers the emulation runs about 4x slower (this test took 165 s there), and
  // under the race checking (tests/simt/racecheck.cmake) it took 163-214 s: the cases of 200 or
  // more queries go to the normal build. Every path keeps a case here: the GEMM path and the
  // flash kernels (64 queries or more; several key and query tiles at 150 queries; head_dim 128
  // at 70), windows, document starts, decode, a partly written cache.
  std::erase_if(cases, [](const AttnCase& c) { return c.T >= 200; });
#endif
#endif
  for (const AttnCase& c : cases) {
    const std::string what = "attention T " + std::to_string(c.T) + " dh " + std::to_string(c.dh) + " Hq " +
                             std::to_string(c.Hq) + " window " + std::to_string(c.window) +
                             (c.segmented ? " segmented" : "") + (c.pos0[0] ? " decode" : "");
    std::vector<int32_t> seg;
    if (c.segmented) {
      std::vector<int32_t> row = {0, 11, 12, 30};
      if (c.T > 100) row = {0, 11, 12, 30, 97, int32_t(c.T) - 40};
      std::vector<std::vector<int32_t>> starts(static_cast<size_t>(c.B), row);
      seg = segments(c.B, c.T, starts);
      for (int64_t b = 0; b < c.B; ++b)  // at an offset: key positions, the first 5 back
        if (c.pos0[size_t(b)] > 0)
          for (int64_t t = 0; t < c.T; ++t) {
            int32_t& start = seg[size_t(b * c.T + t)];
            start = start == 0 ? int32_t(c.pos0[size_t(b)] - 5) : int32_t(c.pos0[size_t(b)] + start);
          }
    }
    AttnInputs in(c, seg);
    const std::vector<float>&q = in.q, &k = in.k, &v = in.v, &out = in.out;
    const AttentionArgs& a = in.args;
    cpu.attention(a);
    // The backward of every case: the training layout (pos0 = 0, S = T), and chunks at an offset
    // as context parallelism runs them (queries at pos0 + t over the cache; keys past the chunk,
    // here NaN, get gradient 0).
    auto dout = rnd(q.size());
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    cpu.attention_backward(a, dout.data(), dq.data(), dk.data(), dv.data());
    // Every GEMM mode: from 64 queries on, the products run on the GEMM engine (bf16 operands
    // under the bf16 policy).
    // The tensor-core flash kernels too, where they are built (not on HIP, whose "bf16_flash"
    // would run the "bf16" mode's GEMM path a second time).
    std::vector<GemmMode> modes = gemm_modes();
    if (cuda_tensor_core_kernels_built()) modes.push_back({"bf16_flash", true, false, kTolBf16, false, false, true});
    for (const GemmMode& mode : modes) {
      auto be = make_gpu(mode);
      const std::string w = what + " [" + mode.name + "]";
      if (mode.attn_flash) {
        EXPECT_NE(be->diagnostics().find("attention forward and backward flash on the tensor cores"),
                  std::string::npos)
            << be->diagnostics();
      }
      DevBuf gq(*be, q), gk(*be, k), gv(*be, v), go(*be, int64_t(q.size()));
      AttentionArgs g = a;
      g.q = gq.f(); g.k_cache = gk.f(); g.v_cache = gv.f(); g.out = go.f();
      be->attention(g);
      const double tol = c.T >= 64 ? mode.tol : kTolF32;
      expect_close(go.get(), out, tol, w + " out");
      // Every mode, chunks at an offset too: from 64 queries on the GEMM path or the flash
      // kernels, below it the fp32 warp kernels.
      // The backward reads the forward output: this backend's own, as the model passes it (the
      // flash backward's D = rowsum(dO * O) must match the products its kernels form).
      DevBuf gdo(*be, dout), gdq(*be, int64_t(q.size())), gdk(*be, int64_t(k.size())), gdv(*be, int64_t(v.size()));
      be->attention_backward(g, gdo.f(), gdq.f(), gdk.f(), gdv.f());
      expect_close(gdq.get(), dq, tol, w + " dq");
      expect_close(gdk.get(), dk, tol, w + " dk");
      expect_close(gdv.get(), dv, tol, w + " dv");
      if (mode.attn_flash) {  // no atomics: a second backward repeats the first bit for bit
        DevBuf gdq2(*be, int64_t(q.size())), gdk2(*be, int64_t(k.size())), gdv2(*be, int64_t(v.size()));
        be->attention_backward(g, gdo.f(), gdq2.f(), gdk2.f(), gdv2.f());
        const auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
          return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
        };
        EXPECT_TRUE(same_bits(gdq2.get(), gdq.get()) && same_bits(gdk2.get(), gdk.get()) &&
                    same_bits(gdv2.get(), gdv.get()))
            << w << ": the flash backward does not repeat";
      }
    }
  }
}

// The flash backward is as precise as the GEMM path on values that share a large offset (each
// value 3 + 0.1 x noise), where dS = scale P (dP - D) cancels: dP and D are each about dO * 3
// while their difference is about dO * 0.1. The GEMM path forms D = sum_j P dP from its own
// products; the flash kernels take D = rowsum(dO * O) beforehand, which agrees with their dP only
// when it is formed from the same bf16 dO (with fp32 dO, dq and dk came out 2 to 2.5 times the
// GEMM path's error here). bf16 values lose part of the 0.1 noise (their spacing near 3 is
// 0.016), so both paths are a few percent off the fp32 CPU here: the check is their ratio,
// summed over the cases and two draws each, against the CPU on the same inputs.
TEST_F(GpuCca, FlashBackwardAsPreciseAsTheGemmPathOnOffsetValues) {
  if (!cuda_tensor_core_kernels_built()) GTEST_SKIP() << "skipped: the tensor-core flash kernels are not built";
  const std::vector<AttnCase> cases = {{1, 257, 257, 4, 2, 64, 33, {0}, false},
                                       {1, 160, 160, 8, 2, 128, 0, {0}, true}};
  const std::vector<GemmMode> modes = {{"bf16", true, false, kTolBf16},
                                       {"bf16_flash", true, false, kTolBf16, false, false, true}};
  double err_dq[2] = {0, 0}, err_dk[2] = {0, 0};
  for (const AttnCase& c : cases)
    for (int draw = 0; draw < 2; ++draw) {
      std::vector<int32_t> seg;
      if (c.segmented) {
        std::vector<std::vector<int32_t>> starts(static_cast<size_t>(c.B), std::vector<int32_t>{0, 12, 30, 97});
        seg = segments(c.B, c.T, starts);
      }
      AttnInputs in(c, seg);
      for (float& x : in.v) x = 3.0f + 0.1f * x;
      cpu.attention(in.args);
      const auto dout = rnd(in.q.size());
      std::vector<float> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
      cpu.attention_backward(in.args, dout.data(), dq.data(), dk.data(), dv.data());
      for (size_t m = 0; m < modes.size(); ++m) {
        auto be = make_gpu(modes[m]);
        const std::string what = "T " + std::to_string(c.T) + " dh " + std::to_string(c.dh) + " draw " +
                                 std::to_string(draw) + " [" + modes[m].name + "]";
        DevBuf gq(*be, in.q), gk(*be, in.k), gv(*be, in.v), go(*be, int64_t(in.q.size())), gdo(*be, dout);
        DevBuf gdq(*be, int64_t(in.q.size())), gdk(*be, int64_t(in.k.size())), gdv(*be, int64_t(in.v.size()));
        AttentionArgs g = in.args;
        g.q = gq.f(); g.k_cache = gk.f(); g.v_cache = gv.f(); g.out = go.f();
        be->attention(g);
        be->attention_backward(g, gdo.f(), gdq.f(), gdk.f(), gdv.f());
        err_dq[m] += test::max_rel_err(gdq.get().data(), dq.data(), dq.size());
        err_dk[m] += test::max_rel_err(gdk.get().data(), dk.data(), dk.size());
        expect_close(gdv.get(), dv, kTolBf16, what + " dv");  // no cancellation in dV = P^T dO
      }
    }
  // Measured on the host emulation over 9 runs of this test: flash / GEMM 0.96 to 1.35 for dq
  // and dk; 2.7 and 2.9 with D from the fp32 dO.
  EXPECT_LT(err_dq[1], 1.7 * err_dq[0]) << "flash dq error " << err_dq[1] << " against the GEMM path's " << err_dq[0];
  EXPECT_LT(err_dk[1], 1.7 * err_dk[0]) << "flash dk error " << err_dk[1] << " against the GEMM path's " << err_dk[0];
  std::printf("summed max relative errors, GEMM path / flash: dq %.4f / %.4f, dk %.4f / %.4f\n", err_dq[0], err_dq[1],
              err_dk[0], err_dk[1]);
}

// Decode over a long cache, with each query tile's keys split over several blocks whose slices a
// second kernel merges (attention_key_splits.h): forced splits of 1 (none), 3 and 64 (most slices
// empty at these lengths), and the backend's own choice, which splits these shapes on the
// emulated device's 8 multiprocessors and on a real GPU's, against the CPU at the fp32 tolerance,
// with windows, document starts and NaN in the slots past each chunk. Every split count must
// give the same result within the tolerance, and twice the same bits; a query row of NaN must
// come out NaN however the keys are split, as it does unsplit.
TEST_F(GpuCca, AttentionSplitsDecodeKeysAcrossBlocks) {
  const std::vector<AttnCase> cases = {
      {1, 1, 1500, 4, 2, 64, 0, {1499}, false},
      {2, 3, 1200, 8, 2, 128, 0, {900, 1197}, false},
      {1, 2, 1200, 4, 1, 64, 700, {1000}, false},
      {2, 5, 1100, 4, 2, 32, 0, {600, 1095}, true},
  };
  for (const AttnCase& c : cases) {
    // Documents: each chunk's first two queries continue one that began 300 keys earlier, the
    // rest start a new one at the chunk's third position.
    std::vector<int32_t> seg(size_t(c.B * c.T));
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t)
        seg[size_t(b * c.T + t)] = int32_t(t < 2 ? c.pos0[size_t(b)] - 300 : c.pos0[size_t(b)] + 2);
    // The backend's own choice splits each of these shapes (query tiles of 16), on the emulated
    // device's 8 multiprocessors as on an H100's 132.
    const int64_t tile_q = 16, blocks = (c.T + tile_q - 1) / tile_q * c.Hq * c.B;
    const int64_t longest = attention_longest_keys(c.pos0.data(), c.B, c.T, c.window, tile_q);
    EXPECT_GT(attention_key_splits(blocks, longest, 8, 0), 1);
    EXPECT_GT(attention_key_splits(blocks, longest, 132, 0), 1);
    const std::vector<int32_t> no_documents;
    AttnInputs in(c, c.segmented ? seg : no_documents);
    // The last query row of head 1 of the last sequence is NaN (a diverged activation).
    const size_t nan_row = size_t(((c.B - 1) * c.T + c.T - 1) * c.Hq + 1) * size_t(c.dh);
    std::fill(in.q.begin() + std::ptrdiff_t(nan_row), in.q.begin() + std::ptrdiff_t(nan_row + size_t(c.dh)), NAN);
    const std::vector<float>&q = in.q, &k = in.k, &v = in.v, &out = in.out;
    const AttentionArgs& a = in.args;
    cpu.attention(a);
    for (const int splits : {0, 1, 3, 64}) {
      CudaBackendOptions o;
      o.attention_key_splits = splits;
      auto be = make_cuda_backend(o);
      const std::string diag = be->diagnostics();
      EXPECT_NE(diag.find(" multiprocessors"), std::string::npos) << diag;
      EXPECT_EQ(diag.find(" 0 multiprocessors"), std::string::npos) << diag;
      const std::string what = "decode T " + std::to_string(c.T) + " S " + std::to_string(c.S) + " dh " +
                               std::to_string(c.dh) + " window " + std::to_string(c.window) +
                               (c.segmented ? " segmented" : "") + " splits " + std::to_string(splits);
      DevBuf gq(*be, q), gk(*be, k), gv(*be, v), go(*be, int64_t(q.size())), go2(*be, int64_t(q.size()));
      AttentionArgs g = a;
      g.q = gq.f(); g.k_cache = gk.f(); g.v_cache = gv.f(); g.out = go.f();
      be->attention(g);
      const std::vector<float> got = go.get();
      // The NaN row comes out NaN; the others match the CPU.
      for (size_t i = nan_row; i < nan_row + size_t(c.dh); ++i)
        ASSERT_TRUE(std::isnan(got[i])) << what << ": the NaN query row gave " << got[i] << " at " << i - nan_row;
      std::vector<float> got_finite = got, out_finite = out;
      for (size_t i = nan_row; i < nan_row + size_t(c.dh); ++i) got_finite[i] = out_finite[i] = 0.0f;
      expect_close(got_finite, out_finite, kTolF32, what);
      g.out = go2.f();
      be->attention(g);
      EXPECT_TRUE(std::memcmp(go2.get().data(), got.data(), got.size() * 4) == 0) << what << ": does not repeat";
    }
  }
}

}  // namespace
}  // namespace zaya
