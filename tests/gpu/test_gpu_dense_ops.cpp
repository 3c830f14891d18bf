// Dense ops of the GPU backend against the CPU backend, forward and backward, in every GEMM
// mode (bf16 operands, fp32, our tiled kernel): linear (also of several matrices of one input,
// and the fp32 linear with its GELU), embedding, RMSNorm, affine, the residual merge fused with
// the RMSNorm after it, scaled-add (also fused with the RMSNorm after it), GELU, softmax,
// routing and the fused LM head + loss (exact fp32, or as 3xTF32 GEMMs over vocabulary slices
// under the bf16 policy; added after the H100 run). Skipped ("skipped: no GPU") without a
// device. Passed on an H100 (linear's misaligned-bias variants and the fused ops of few-rows
// decode came later).
#include "gpu_test_support.h"
#if defined(ZAYA_SIMT)
#include "simt_host_api.h"  // the emulated runtime's counts
#endif

namespace zaya {
namespace {

using namespace gpu_test;

class GpuDense : public ::testing::TestWithParam<GemmMode> {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
    gpu = make_gpu(GetParam());
  }
  double tol() const { return GetParam().tol; }
  CpuBackend cpu;
  std::unique_ptr<Backend> gpu;
};

// The [rows, cols] block of a row-major matrix with row stride ld.
std::vector<float> block(const std::vector<float>& a, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out.push_back(a[size_t(r * ld + c)]);
  return out;
}

// Variants: bias or not, accumulate or not, a padded output row stride, and (variant & 4) the
// bias one float past an aligned address, which the BLASLt bias epilogue is not given.
TEST_P(GpuDense, Linear) {
  const int64_t M = 37, K = 70, N = 45;
  for (int variant = 0; variant < 8; ++variant) {
    const bool with_bias = variant & 1, accumulate = variant & 2, shifted_bias = variant & 4;
    const int64_t ldy = (variant & 3) == 3 ? N + 7 : N;
    auto x = rnd(size_t(M * K)), w = rnd(size_t(N * K), 0.2), bias = rnd(static_cast<size_t>(N + 1)),
         y0 = rnd(size_t(M * ldy));
    const float* host_bias = bias.data() + (shifted_bias ? 1 : 0);
    std::vector<float> y = y0;
    cpu.linear(x.data(), w.data(), with_bias ? host_bias : nullptr, y.data(), M, K, N, accumulate, ldy);
    DevBuf dx(*gpu, x), dw(*gpu, w), db(*gpu, bias), dy(*gpu, M * ldy);
    if (accumulate) dy.upload(y0);
    const float* dev_bias = db.f() + (shifted_bias ? 1 : 0);
    gpu->linear(dx.f(), dw.f(), with_bias ? dev_bias : nullptr, dy.f(), M, K, N, accumulate, ldy);
    expect_close(block(dy.get(), M, N, ldy), block(y, M, N, ldy), tol(), "linear variant " + std::to_string(variant));
  }
  // One row (decode) and a large K.
  auto x = rnd(3000), w = rnd(size_t(5 * 3000), 0.05);
  std::vector<float> y(5);
  cpu.linear(x.data(), w.data(), nullptr, y.data(), 1, 3000, 5, false, 0);
  DevBuf dx(*gpu, x), dw(*gpu, w), dy(*gpu, 5);
  gpu->linear(dx.f(), dw.f(), nullptr, dy.f(), 1, 3000, 5, false, 0);
  expect_close(dy.get(), y, tol(), "linear M=1");
}

// Decode's linears: 1 to 5 token rows (up to 4 take the few-rows GEMV, gpu_gemv.h: under the
// bf16 policy on the weight's bf16 copy, and for the fp32 linears, the router's and the logits',
// on the fp32 weights), K a multiple of 8 or not and past a 64-lane warp's pass, with bias and
// accumulation and a padded output stride, on weights as trained (converted per call) and
// frozen (their bf16 shadow, as the server runs); `linear` at the mode's tolerance and
// `linear_fp32` at fp32's.
TEST_P(GpuDense, LinearFewRows) {
  const GemmMode& mode = GetParam();
  for (int frozen = 0; frozen < 2; ++frozen) {
    gpu->set_weights_frozen(frozen == 1);
    for (int64_t M = 1; M <= 5; ++M)
      for (int64_t K : {int64_t(70), int64_t(528)})
        for (bool fp32_linear : {false, true}) {
          const int64_t N = 37;
          const auto linear = [&](Backend& be, const float* x, const float* w, const float* b, float* y, bool acc,
                                  int64_t ldy) {
            if (fp32_linear) be.linear_fp32(x, w, b, y, M, K, N, acc, ldy);
            else be.linear(x, w, b, y, M, K, N, acc, ldy);
          };
          for (int variant = 0; variant < 4; ++variant) {
            const bool with_bias = variant & 1, accumulate = variant & 2;
            const int64_t ldy = accumulate ? N + 3 : N;
            auto x = rnd(size_t(M * K)), w = rnd(size_t(N * K), 0.2), bias = rnd(size_t(N)),
                 y0 = rnd(size_t(M * ldy));
            std::vector<float> y = y0;
            linear(cpu, x.data(), w.data(), with_bias ? bias.data() : nullptr, y.data(), accumulate, ldy);
            DevBuf dx(*gpu, x), dw(*gpu, w), db(*gpu, bias), dy(*gpu, M * ldy);
            if (accumulate) dy.upload(y0);
            linear(*gpu, dx.f(), dw.f(), with_bias ? db.f() : nullptr, dy.f(), accumulate, ldy);
            const std::string what = std::string(fp32_linear ? "linear_fp32 " : "linear ") + mode.name +
                                     (frozen ? " frozen" : "") + " M=" + std::to_string(M) +
                                     " K=" + std::to_string(K) + " variant " + std::to_string(variant);
            expect_close(block(dy.get(), M, N, ldy), block(y, M, N, ldy), fp32_linear ? kTolF32 : tol(), what);
            if (accumulate) {  // the padding between rows is left as it was
              const std::vector<float> got = dy.get();
              for (int64_t r = 0; r + 1 < M; ++r)
                for (int64_t c = N; c < ldy; ++c)
                  EXPECT_EQ(got[size_t(r * ldy + c)], y0[size_t(r * ldy + c)]) << what << " padding";
            }
#if defined(ZAYA_SIMT)
            // The form taken, from the emulated runtime's launches: with a frozen weight's shadow
            // built (the call above), the few-rows GEMV is one launch in every mode; the bf16
            // GEMM path converts x first, so two or more.
            if (frozen) {
              const int64_t before = simt::api_counts().launches;
              linear(*gpu, dx.f(), dw.f(), with_bias ? db.f() : nullptr, dy.f(), accumulate, ldy);
              const int64_t launches = simt::api_counts().launches - before;
              if (M <= 4) {
                EXPECT_EQ(launches, 1) << what << ": launches";
              } else if (mode.bf16 && !fp32_linear) {
                EXPECT_GE(launches, 2) << what << ": launches";
              }
            }
#endif
          }
        }
  }
  gpu->set_weights_frozen(false);
}

// linear_many, the attention's four input projections of one input (Backend's default: a linear
// each): 1 to 9 token rows (up to 4 take one few-rows GEMV launch for every 4 matrices,
// gpu_gemv.h; more, a GEMM each from one bf16 copy of x), 1 to 5 matrices, two of them into one
// buffer with a padded row stride as the block's q and k, of distinct widths so that a column
// given to the wrong matrix shows; weights as trained and frozen. The padding between the
// outputs stays poisoned.
TEST_P(GpuDense, LinearManyOfOneInput) {
  const GemmMode& mode = GetParam();
  const int64_t widths[] = {37, 21, 13, 14, 9};
  for (int frozen = 0; frozen < 2; ++frozen) {
    gpu->set_weights_frozen(frozen == 1);
    for (int64_t M : {1, 3, 4, 5, 9})
      for (int64_t K : {int64_t(70), int64_t(528)})
        for (int count = 1; count <= 5; ++count) {
          // outputs 0 and 1 share a buffer of row stride C (padding of 3), the others have their own
          const int64_t C = widths[0] + widths[1] + 3;
          auto x = rnd(size_t(M * K));
          std::vector<std::vector<float>> w(static_cast<size_t>(count));
          for (int i = 0; i < count; ++i) w[size_t(i)] = rnd(size_t(widths[i] * K), 0.2);
          std::vector<std::vector<float>> y_cpu(5);
          y_cpu[0].assign(size_t(M * C), NAN);
          for (int i = 2; i < 5; ++i) y_cpu[size_t(i)].assign(size_t(M * widths[i]), NAN);
          const auto outputs = [&](std::vector<float*> y, std::vector<const float*> wp) {
            std::vector<LinearOutput> outs;
            for (int i = 0; i < count; ++i) {
              if (i == 0) outs.push_back({wp[0], y[0], widths[0], C});
              else if (i == 1) outs.push_back({wp[1], y[0] + widths[0], widths[1], C});
              else outs.push_back({wp[size_t(i)], y[size_t(i)], widths[i], 0});
            }
            return outs;
          };
          std::vector<const float*> w_host;
          for (auto& m : w) w_host.push_back(m.data());
          const auto cpu_outs = outputs({y_cpu[0].data(), nullptr, y_cpu[2].data(), y_cpu[3].data(), y_cpu[4].data()},
                                        w_host);
          cpu.linear_many(x.data(), M, K, cpu_outs.data(), count);
          DevBuf dx(*gpu, x), dy0(*gpu, M * C), dy2(*gpu, M * widths[2]), dy3(*gpu, M * widths[3]),
              dy4(*gpu, M * widths[4]);
          std::vector<std::unique_ptr<DevBuf>> dw;
          std::vector<const float*> w_dev;
          for (auto& m : w) {
            dw.push_back(std::make_unique<DevBuf>(*gpu, m));
            w_dev.push_back(dw.back()->f());
          }
          const auto gpu_outs = outputs({dy0.f(), nullptr, dy2.f(), dy3.f(), dy4.f()}, w_dev);
          gpu->linear_many(dx.f(), M, K, gpu_outs.data(), count);
          const std::string what = std::string("linear_many ") + mode.name + (frozen ? " frozen" : "") +
                                   " M=" + std::to_string(M) + " K=" + std::to_string(K) +
                                   " matrices=" + std::to_string(count);
          const std::vector<float> got0 = dy0.get();
          for (int i = 0; i < std::min(count, 2); ++i) {
            std::vector<float> g, want;
            for (int64_t r = 0; r < M; ++r)
              for (int64_t c = 0; c < widths[i]; ++c) {
                const size_t at = size_t(r * C + (i == 1 ? widths[0] : 0) + c);
                g.push_back(got0[at]);
                want.push_back(y_cpu[0][at]);
              }
            expect_close(g, want, tol(), what + " output " + std::to_string(i));
          }
          for (int64_t r = 0; r < M; ++r)
            for (int64_t c = widths[0] + (count > 1 ? widths[1] : 0); c < C; ++c)
              EXPECT_TRUE(std::isnan(got0[size_t(r * C + c)])) << what << ": wrote past its outputs, column " << c;
          const DevBuf* own[] = {nullptr, nullptr, &dy2, &dy3, &dy4};
          for (int i = 2; i < count; ++i)
            expect_close(own[i]->get(), y_cpu[size_t(i)], tol(), what + " output " + std::to_string(i));
#if defined(ZAYA_SIMT)
          // A launch for every 4 when the GEMV takes them (the shadows are built by now); else a
          // GEMM each after one conversion of x under the bf16 policy: the launches of one linear
          // (its conversion and GEMM) and a GEMM for each other matrix.
          if (frozen) {
            int64_t before = simt::api_counts().launches;
            gpu->linear(dx.f(), w_dev[0], nullptr, dy0.f(), M, K, widths[0], false, C);
            const int64_t one_linear = simt::api_counts().launches - before;
            before = simt::api_counts().launches;
            gpu->linear_many(dx.f(), M, K, gpu_outs.data(), count);
            const int64_t want = M <= 4 ? (count + 3) / 4 : one_linear + count - 1;
            EXPECT_EQ(simt::api_counts().launches - before, want) << what << ": launches";
          }
#endif
        }
  }
  gpu->set_weights_frozen(false);
}

// linear_fp32_gelu, the router MLP's layers (Backend's default: linear_fp32, a copy, the GELU):
// 1 to 6 rows (up to 4 as one GEMV launch with the GELU in its store), with bias or not, the sums
// kept apart (training) or the activation in place (inference). Inputs of a few units, so the
// GELU's curved part and both tails are reached.
TEST_P(GpuDense, LinearFp32Gelu) {
  const GemmMode& mode = GetParam();
  const int64_t N = 37;
  for (int64_t M : {1, 2, 4, 6})
    for (int64_t K : {int64_t(70), int64_t(528)})
      for (int variant = 0; variant < 4; ++variant) {
        const bool with_bias = variant & 1, in_place = variant & 2;
        auto x = rnd(size_t(M * K)), w = rnd(size_t(N * K), 3.0 / std::sqrt(double(K))), bias = rnd(size_t(N));
        std::vector<float> pre(size_t(M * N), NAN), y(size_t(M * N), NAN);
        cpu.linear_fp32_gelu(x.data(), w.data(), with_bias ? bias.data() : nullptr, in_place ? y.data() : pre.data(),
                             y.data(), M, K, N);
        DevBuf dx(*gpu, x), dw(*gpu, w), db(*gpu, bias), dpre(*gpu, M * N), dy(*gpu, M * N);
        gpu->linear_fp32_gelu(dx.f(), dw.f(), with_bias ? db.f() : nullptr, in_place ? dy.f() : dpre.f(), dy.f(), M,
                              K, N);
        const std::string what = std::string("linear_fp32_gelu ") + mode.name + " M=" + std::to_string(M) +
                                 " K=" + std::to_string(K) + " variant " + std::to_string(variant);
        expect_close(dy.get(), y, kTolF32, what + " y");
        if (!in_place) expect_close(dpre.get(), pre, kTolF32, what + " pre");
#if defined(ZAYA_SIMT)
        if (M <= 4) {
          const int64_t before = simt::api_counts().launches;
          gpu->linear_fp32_gelu(dx.f(), dw.f(), with_bias ? db.f() : nullptr, in_place ? dy.f() : dpre.f(), dy.f(),
                                M, K, N);
          EXPECT_EQ(simt::api_counts().launches - before, 1) << what << ": launches";
        }
#endif
      }
}

// scaled_add_rmsnorm, the router's depth-averaged latent and its norm (Backend's default:
// scaled_add, then rmsnorm): 1, 3 and 67 rows of 17, 256 (the router's width) and 300 columns
// (past a block's threads); the sum kept in y and its norm, at fp32's tolerance; one launch on
// the GPU.
TEST_P(GpuDense, ScaledAddRmsnorm) {
  for (int64_t rows : {1, 3, 67})
    for (int64_t dim : {17, 256, 300}) {
      auto y0 = rnd(size_t(rows * dim)), x = rnd(size_t(rows * dim)), scale = rnd(size_t(dim)),
           w = rnd(size_t(dim));
      std::vector<float> y = y0, out(size_t(rows * dim), NAN);
      cpu.scaled_add_rmsnorm(y.data(), x.data(), scale.data(), w.data(), 1e-6f, out.data(), rows, dim);
      DevBuf gy(*gpu, y0), gx(*gpu, x), gs(*gpu, scale), gw(*gpu, w), gout(*gpu, rows * dim);
#if defined(ZAYA_SIMT)
      const int64_t before = simt::api_counts().launches;
#endif
      gpu->scaled_add_rmsnorm(gy.f(), gx.f(), gs.f(), gw.f(), 1e-6f, gout.f(), rows, dim);
      const std::string what = "scaled_add_rmsnorm rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
#if defined(ZAYA_SIMT)
      EXPECT_EQ(simt::api_counts().launches - before, 1) << what << ": launches";
#endif
      expect_close(gy.get(), y, kTolF32, what + " sum");
      expect_close(gout.get(), out, kTolF32, what + " norm");
    }
}

TEST_P(GpuDense, LinearBackward) {
  const int64_t M = 41, K = 33, N = 29;
  for (int variant = 0; variant < 3; ++variant) {
    const bool acc_dx = variant >= 1;
    const int64_t lddy = variant == 2 ? N + 5 : N;
    auto x = rnd(size_t(M * K)), w = rnd(size_t(N * K), 0.3), dyv = rnd(size_t(M * lddy));
    auto dx0 = rnd(size_t(M * K)), dw0 = rnd(size_t(N * K)), db0 = rnd(static_cast<size_t>(N));
    std::vector<float> dx = dx0, dw = dw0, db = db0;
    cpu.linear_backward(x.data(), w.data(), dyv.data(), dx.data(), dw.data(), db.data(), M, K, N, acc_dx, lddy);
    DevBuf gx(*gpu, x), gw(*gpu, w), gdy(*gpu, dyv), gdx(*gpu, M * K), gdw(*gpu, dw0), gdb(*gpu, db0);
    if (acc_dx) gdx.upload(dx0);
    gpu->linear_backward(gx.f(), gw.f(), gdy.f(), gdx.f(), gdw.f(), gdb.f(), M, K, N, acc_dx, lddy);
    const std::string v = " variant " + std::to_string(variant);
    expect_close(gdx.get(), dx, tol(), "dx" + v);
    expect_close(gdw.get(), dw, tol(), "dw" + v);
    expect_close(gdb.get(), db, kTolF32, "db" + v);  // column sums are fp32
  }
}

TEST_P(GpuDense, ElementwiseAndRowOps) {
  const int64_t R = 67, D = 300, V = 1000;
  {  // embedding (+ backward with repeated ids)
    auto table = rnd(size_t(V * D));
    auto ids = rnd_ints(size_t(R), 50);
    std::vector<float> out(size_t(R * D));
    cpu.embedding(table.data(), ids.data(), out.data(), R, D);
    DevBuf gt(*gpu, table), gi(*gpu, ids), go(*gpu, R * D);
    gpu->embedding(gt.f(), gi.i(), go.f(), R, D);
    expect_close(go.get(), out, kTolF32, "embedding");
    auto dout = rnd(size_t(R * D));
    auto dt0 = rnd(size_t(V * D));
    std::vector<float> dt = dt0;
    cpu.embedding_backward(ids.data(), dout.data(), dt.data(), R, D);
    DevBuf gd(*gpu, dout), gdt(*gpu, dt0);
    gpu->embedding_backward(gi.i(), gd.f(), gdt.f(), R, D);
    expect_close(gdt.get(), dt, kTolF32, "embedding_backward");
    // Each id's rows are added in token order, as the CPU does: bitwise the same.
    EXPECT_EQ(gdt.get(), dt) << "embedding_backward: summation order differs from the CPU's";
    // A narrow table (the kernel's 64-thread blocks) with hundreds of distinct ids.
    const int64_t Dn = 40, Rn = 500;
    auto ids_n = rnd_ints(size_t(Rn), int32_t(V));
    auto dout_n = rnd(size_t(Rn * Dn)), dtn0 = rnd(size_t(V * Dn));
    std::vector<float> dtn = dtn0;
    cpu.embedding_backward(ids_n.data(), dout_n.data(), dtn.data(), Rn, Dn);
    DevBuf gin(*gpu, ids_n), gdn(*gpu, dout_n), gdtn(*gpu, dtn0);
    gpu->embedding_backward(gin.i(), gdn.f(), gdtn.f(), Rn, Dn);
    EXPECT_EQ(gdtn.get(), dtn) << "embedding_backward, D = 40";
  }
  {  // rmsnorm + backward
    auto x = rnd(size_t(R * D)), w = rnd(static_cast<size_t>(D)), dy = rnd(size_t(R * D)), dx0 = rnd(size_t(R * D));
    auto dw0 = rnd(static_cast<size_t>(D));
    std::vector<float> y(size_t(R * D));
    cpu.rmsnorm(x.data(), w.data(), 1e-6f, y.data(), R, D);
    DevBuf gx(*gpu, x), gw(*gpu, w), gy(*gpu, R * D);
    gpu->rmsnorm(gx.f(), gw.f(), 1e-6f, gy.f(), R, D);
    expect_close(gy.get(), y, kTolF32, "rmsnorm");
    for (bool acc : {false, true}) {
      std::vector<float> dx = dx0, dw = dw0;
      cpu.rmsnorm_backward(x.data(), w.data(), dy.data(), 1e-6f, dx.data(), dw.data(), R, D, acc);
      DevBuf gdy(*gpu, dy), gdx(*gpu, R * D), gdw(*gpu, dw0);
      if (acc) gdx.upload(dx0);
      gpu->rmsnorm_backward(gx.f(), gw.f(), gdy.f(), 1e-6f, gdx.f(), gdw.f(), R, D, acc);
      expect_close(gdx.get(), dx, kTolF32, "rmsnorm_backward dx");
      expect_close(gdw.get(), dw, kTolF32, "rmsnorm_backward dw");
    }
  }
  {  // affine + backward
    auto x = rnd(size_t(R * D)), s = rnd(static_cast<size_t>(D)), b = rnd(static_cast<size_t>(D)), d = rnd(size_t(R * D));
    auto ds0 = rnd(static_cast<size_t>(D)), db0 = rnd(static_cast<size_t>(D));
    std::vector<float> xc = x;
    cpu.affine(xc.data(), s.data(), b.data(), R, D);
    DevBuf gx(*gpu, x), gs(*gpu, s), gb(*gpu, b);
    gpu->affine(gx.f(), gs.f(), gb.f(), R, D);
    expect_close(gx.get(), xc, kTolF32, "affine");
    std::vector<float> dc = d, ds = ds0, db = db0;
    cpu.affine_backward(x.data(), s.data(), b.data(), dc.data(), ds.data(), db.data(), R, D);
    DevBuf gx2(*gpu, x), gd(*gpu, d), gds(*gpu, ds0), gdb(*gpu, db0);
    gpu->affine_backward(gx2.f(), gs.f(), gb.f(), gd.f(), gds.f(), gdb.f(), R, D);
    expect_close(gd.get(), dc, kTolF32, "affine_backward d");
    expect_close(gds.get(), ds, kTolF32, "affine_backward dscale");
    expect_close(gdb.get(), db, kTolF32, "affine_backward dbias");
  }
  {  // scaled_add + backward
    auto y = rnd(size_t(R * D)), x = rnd(size_t(R * D)), s = rnd(static_cast<size_t>(D)), dy = rnd(size_t(R * D));
    auto dx0 = rnd(size_t(R * D)), ds0 = rnd(static_cast<size_t>(D));
    std::vector<float> yc = y;
    cpu.scaled_add(yc.data(), x.data(), s.data(), R, D);
    DevBuf gy(*gpu, y), gx(*gpu, x), gs(*gpu, s);
    gpu->scaled_add(gy.f(), gx.f(), gs.f(), R, D);
    expect_close(gy.get(), yc, kTolF32, "scaled_add");
    std::vector<float> dx = dx0, ds = ds0;
    cpu.scaled_add_backward(x.data(), s.data(), dy.data(), dx.data(), ds.data(), R, D);
    DevBuf gdy(*gpu, dy), gdx(*gpu, dx0), gds(*gpu, ds0);
    gpu->scaled_add_backward(gx.f(), gs.f(), gdy.f(), gdx.f(), gds.f(), R, D);
    expect_close(gdx.get(), dx, kTolF32, "scaled_add_backward dx");
    expect_close(gds.get(), ds, kTolF32, "scaled_add_backward dscale");
  }
  {  // gelu + backward
    auto x = rnd(size_t(R * D), 2.0), d = rnd(size_t(R * D));
    std::vector<float> xc = x, dc = d;
    cpu.gelu(xc.data(), R * D);
    cpu.gelu_backward(x.data(), dc.data(), R * D);
    DevBuf gx(*gpu, x), gx2(*gpu, x), gd(*gpu, d);
    gpu->gelu(gx.f(), R * D);
    gpu->gelu_backward(gx2.f(), gd.f(), R * D);
    expect_close(gx.get(), xc, kTolF32, "gelu");
    expect_close(gd.get(), dc, kTolF32, "gelu_backward");
  }
  {  // softmax + backward, route_select + route_backward
    const int64_t classes = 17;
    auto s = rnd(size_t(R * classes), 3.0), d = rnd(size_t(R * classes)), bias = rnd(size_t(classes), 0.1);
    std::vector<float> p = s;
    cpu.softmax(p.data(), R, classes);
    DevBuf gp(*gpu, s);
    gpu->softmax(gp.f(), R, classes);
    expect_close(gp.get(), p, kTolF32, "softmax");
    std::vector<float> dc = d;
    cpu.softmax_backward(p.data(), dc.data(), R, classes);
    DevBuf gpp(*gpu, p), gd(*gpu, d);
    gpu->softmax_backward(gpp.f(), gd.f(), R, classes);
    expect_close(gd.get(), dc, kTolF32, "softmax_backward");
    std::vector<int32_t> ex(static_cast<size_t>(R));
    std::vector<float> wt(static_cast<size_t>(R));
    cpu.route_select(p.data(), bias.data(), ex.data(), wt.data(), R, classes);
    DevBuf gb(*gpu, bias), gex(*gpu, R), gwt(*gpu, R);
    gpu->route_select(gpp.f(), gb.f(), gex.i(), gwt.f(), R, classes);
    EXPECT_EQ(gex.get_i(), ex) << "route_select experts";
    expect_close(gwt.get(), wt, kTolF32, "route_select weight");
    auto dwt = rnd(static_cast<size_t>(R));
    std::vector<float> dprobs(size_t(R * classes));
    cpu.route_backward(ex.data(), dwt.data(), dprobs.data(), R, classes);
    DevBuf gdw(*gpu, dwt), gdp(*gpu, R * classes);
    gpu->route_backward(gex.i(), gdw.f(), gdp.f(), R, classes);
    expect_close(gdp.get(), dprobs, kTolF32, "route_backward");
  }
  // route (softmax and route_select fused, a warp per row) against the CPU's two steps: decode's
  // few rows and a training chunk's many, fewer classes than a warp's lanes and several per lane
  // (a ZAYA1-base router has 17). The selection is checked by class and by weight, with the
  // outputs poisoned; classes whose scores tie exactly must give the lowest of them, as the CPU's
  // first maximum does.
  for (const int64_t rows : {int64_t(1), int64_t(3), R})
    for (const int64_t classes : {int64_t(17), int64_t(65), int64_t(300)}) {
      const std::string what = "route rows " + std::to_string(rows) + " classes " + std::to_string(classes);
      const auto logits = rnd(size_t(rows * classes), 3.0), bias = rnd(size_t(classes), 0.1);
      std::vector<float> p = logits, wt(static_cast<size_t>(rows));
      std::vector<int32_t> ex(static_cast<size_t>(rows));
      cpu.softmax(p.data(), rows, classes);
      cpu.route_select(p.data(), bias.data(), ex.data(), wt.data(), rows, classes);
      DevBuf gl(*gpu, logits), gb(*gpu, bias), gex(*gpu, rows), gwt(*gpu, rows);
      gpu->route(gl.f(), gb.f(), gex.i(), gwt.f(), rows, classes);
      expect_close(gl.get(), p, kTolF32, what + " probabilities");
      EXPECT_EQ(gex.get_i(), ex) << what << " experts";
      expect_close(gwt.get(), wt, kTolF32, what + " weight");
    }
  {  // ties go to the lowest class: classes 3 and 64 tie above the rest in row 0 (the warp's lane 0
     // holds class 64, another lane class 3); every class ties in row 1
    const int64_t classes = 70;
    std::vector<float> logits(size_t(2 * classes), 0.25f);
    logits[3] = logits[64] = 2.0f;
    const std::vector<float> bias(size_t(classes), 0.0f);
    DevBuf gl(*gpu, logits), gb(*gpu, bias), gex(*gpu, 2), gwt(*gpu, 2);
    gpu->route(gl.f(), gb.f(), gex.i(), gwt.f(), 2, classes);
    EXPECT_EQ(gex.get_i(), (std::vector<int32_t>{3, 0})) << "route: ties go to the lowest class";
    const float top = 1.0f / (2.0f + float(classes - 2) * std::exp(0.25f - 2.0f));
    expect_close(gwt.get(), {top, 1.0f / float(classes)}, kTolF32, "route: the tied classes' weight");
  }
}

// The fused LM head + loss of `gpu` against the CPU on fresh inputs (two rows without a
// target), forward + backward and the evaluation form (loss only), at the fp32 tolerance in every
// mode: the head stays fp32 (spec A.11; exact, or 3xTF32 under the bf16 policy).
void check_lm_head(Backend& gpu, int64_t N, int64_t D, int64_t V, const std::string& what) {
  CpuBackend cpu;
  auto y = rnd(size_t(N * D)), w = rnd(size_t(V * D), 0.1), bias = rnd(size_t(V), 0.1);
  auto target = rnd_ints(size_t(N), int32_t(V));
  target[3] = -1;
  target[size_t(N - 1)] = -1;
  auto dw0 = rnd(size_t(V * D), 0.01), db0 = rnd(size_t(V), 0.01);
  std::vector<float> dy(size_t(N * D)), dw = dw0, db = db0;
  const float scale = 1.0f / float(N);
  const double loss = cpu.lm_head_loss(y.data(), w.data(), bias.data(), target.data(), N, D, V, scale, dy.data(),
                                       dw.data(), db.data());
  DevBuf gy(gpu, y), gw(gpu, w), gb(gpu, bias), gt(gpu, target), gdy(gpu, N * D), gdw(gpu, dw0), gdb(gpu, db0);
  const double gloss = gpu.lm_head_loss(gy.f(), gw.f(), gb.f(), gt.i(), N, D, V, scale, gdy.f(), gdw.f(), gdb.f());
  EXPECT_NEAR(gloss, loss, kTolF32 * std::fabs(loss)) << what;
  expect_close(gdy.get(), dy, kTolF32, what + " dy");
  expect_close(gdw.get(), dw, kTolF32, what + " dw");
  expect_close(gdb.get(), db, kTolF32, what + " dbias");
  const double eval = gpu.lm_head_loss(gy.f(), gw.f(), gb.f(), gt.i(), N, D, V, 0.0f, nullptr, nullptr, nullptr);
  EXPECT_NEAR(eval, loss, kTolF32 * std::fabs(loss)) << what << " evaluation";
}

// A large vocabulary in one row chunk (GpuLmHead covers several chunks and slices).
TEST_P(GpuDense, LmHeadLoss) { check_lm_head(*gpu, 50, 48, 131072 + 11, std::string(GetParam().name) + " lm_head"); }

// The 3xTF32 LM head (ops_lm_head.cu) over several token chunks and vocabulary slices, the
// last ones partial and most slices starting at addresses the bias epilogue is not given, with
// the weight split once per call and split slice by slice, and the exact fp32 head the same way.
// The diagnostics say which head ran, so that a backend quietly taking the exact path cannot
// pass as the split one.
TEST(GpuLmHead, Tf32x3SlicesMatchFp32) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  for (const int run : {0, 1, 2}) {  // split, with the weight split once; split per slice; exact
    const bool split = run < 2;
    CudaBackendOptions o;
    o.lm_head_tf32x3 = split;
    o.lm_head_chunk_rows = 128;    // token chunks of 128, 128 and 44
    o.lm_head_vocab_slice = 1001;  // 5 slices of 1001 and one of 998
    o.lm_head_split_cache_bytes = run == 0 ? int64_t(1) << 30 : 0;
    auto gpu = make_cuda_backend(o);
    // Only cuBLASLt has TF32 (the tiled engine and HIP do not): elsewhere the head stays exact.
    const std::string diag = gpu->diagnostics();
    const bool cublaslt = diag.find("gemm engine cublaslt") != std::string::npos;
    EXPECT_EQ(diag.find("LM head 3xTF32") != std::string::npos, split && cublaslt) << diag;
    check_lm_head(*gpu, 300, 64, 5003,
                  run == 0 ? "3xTF32 head" : run == 1 ? "3xTF32 head, split per slice" : "exact head");
  }
}

// The residual merge fused with the RMSNorm that reads it (one row kernel forward; row
// statistics, then one column-chunk kernel for the five parameter gradients, dh and dr) against
// the CPU's. 600 rows span three column chunks of 256 (the last short) and 300 columns two
// thread blocks (the second partial); in place (r_out == r, as the model calls it) and not, and
// without the norm weight's gradient (a null gradient is skipped).
TEST(GpuResidualNorm, MatchesTheCpu) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  auto gpu = make_cuda_backend(CudaBackendOptions{});
  CpuBackend cpu;
  const int64_t R = 600, D = 300, n = R * D;
  for (const bool in_place : {true, false}) {
    SCOPED_TRACE(in_place ? "in place" : "into another buffer");
    auto r = rnd(size_t(n), 3.0), h = rnd(size_t(n)), hs = rnd(size_t(D)), hb = rnd(size_t(D)), rs = rnd(size_t(D)),
         rb = rnd(size_t(D)), w = rnd(size_t(D)), dy = rnd(size_t(n)), dr0 = rnd(size_t(n));
    ResidualNormArgs a;
    a.hidden_scale = hs.data(); a.hidden_bias = hb.data(); a.residual_scale = rs.data();
    a.residual_bias = rb.data(); a.norm_weight = w.data(); a.r = r.data(); a.h = h.data();
    a.eps = 1e-6f; a.rows = R; a.dim = D;
    std::vector<float> r_out(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    cpu.residual_scale_rmsnorm(a, r_out.data(), y.data());

    DevBuf gr(*gpu, r), gh(*gpu, h), ghs(*gpu, hs), ghb(*gpu, hb), grs(*gpu, rs), grb(*gpu, rb), gw(*gpu, w),
        gr_out(*gpu, n), gy(*gpu, n);
    ResidualNormArgs ga = a;
    ga.r = gr.f(); ga.h = gh.f(); ga.hidden_scale = ghs.f(); ga.hidden_bias = ghb.f(); ga.residual_scale = grs.f();
    ga.residual_bias = grb.f(); ga.norm_weight = gw.f();
    float* out = in_place ? gr.f() : gr_out.f();
    gpu->residual_scale_rmsnorm(ga, out, gy.f());
    expect_close(in_place ? gr.get() : gr_out.get(), r_out, kTolF32, "residual_scale_rmsnorm r_out");
    expect_close(gy.get(), y, kTolF32, "residual_scale_rmsnorm y");

    std::vector<std::vector<float>> g0;
    for (int k = 0; k < 5; ++k) g0.push_back(rnd(size_t(D)));
    auto g = g0;
    std::vector<float> dr = dr0, dh(static_cast<size_t>(n));
    ResidualNormGrads cg{g[0].data(), g[1].data(), g[2].data(), g[3].data(), in_place ? g[4].data() : nullptr};
    cpu.residual_scale_rmsnorm_backward(a, r_out.data(), dy.data(), dr.data(), dh.data(), cg);
    DevBuf gr_in(*gpu, r), gr_new(*gpu, r_out), gdy(*gpu, dy), gdr(*gpu, dr0), gdh(*gpu, n), gg0(*gpu, g0[0]),
        gg1(*gpu, g0[1]), gg2(*gpu, g0[2]), gg3(*gpu, g0[3]), gg4(*gpu, g0[4]);
    ga.r = gr_in.f();
    gpu->residual_scale_rmsnorm_backward(ga, gr_new.f(), gdy.f(), gdr.f(), gdh.f(),
                                         {gg0.f(), gg1.f(), gg2.f(), gg3.f(), in_place ? gg4.f() : nullptr});
    expect_close(gdr.get(), dr, kTolF32, "residual_scale_rmsnorm_backward dr");
    expect_close(gdh.get(), dh, kTolF32, "residual_scale_rmsnorm_backward dh");
    expect_close(gg0.get(), g[0], kTolF32, "dhidden_scale");
    expect_close(gg1.get(), g[1], kTolF32, "dhidden_bias");
    expect_close(gg2.get(), g[2], kTolF32, "dresidual_scale");
    expect_close(gg3.get(), g[3], kTolF32, "dresidual_bias");
    expect_close(gg4.get(), g[4], kTolF32, in_place ? "dnorm_weight" : "dnorm_weight, not asked for");
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuDense, ::testing::ValuesIn(gemm_modes()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zaya
