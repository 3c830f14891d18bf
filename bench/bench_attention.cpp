// Attention op benchmark: milliseconds and TFLOP/s of causal GQA attention, forward and
// forward + backward, on one backend, at the shape of ZAYA1-base's CCA attention by default
// (8 query heads over 2 KV heads of 128, T = 4096). On CUDA it times both attention paths in one
// run: the GEMM engine with materialised scores, and the tensor-core flash kernels
// (ZAYA_ATTN_FLASH=1, set for the second backend). bench_attention_torch.py times PyTorch's
// scaled_dot_product_attention on the same shape as the peer; scripts/gpu_device_checks.sh runs
// both. FLOPs count the causal half only: forward 2 * 2 * B * Hq * dh * T^2 / 2, backward 2.5x
// that (five products instead of two), the convention of FlashAttention's benchmarks.
// Prints one JSON object on stdout; human-readable lines go to stderr.
//
// usage: bench_attention [--backend cpu|cuda] [--batch B] [--seq T] [--heads Hq] [--kv-heads Hkv]
//                        [--head-dim dh] [--window W] [--warmup N] [--runs N] [--seed N]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench_common.h"

using namespace zaya;
using bench::Clock;
using bench::seconds_since;
using json = nlohmann::json;

namespace {

struct Args {
  std::string backend = "cuda";
  int64_t B = 1, T = 4096, Hq = 8, Hkv = 2, dh = 128, window = 0;
  int warmup = 2, runs = 7;
  uint64_t seed = 1234;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app("bench_attention: causal GQA attention forward and backward, ms and TFLOP/s");
  app.add_option("--backend", a.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--batch", a.B, "Sequences")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seq", a.T, "Tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--heads", a.Hq, "Query heads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", a.Hkv, "Key/value heads (divides --heads)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--head-dim", a.dh, "Head dimension")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--window", a.window, "Sliding window (0: none)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", a.warmup, "Untimed runs first")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--runs", a.runs, "Timed runs (median reported)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "Input seed")->capture_default_str();
  try {
    app.parse(argc, argv);
    if (a.Hq % a.Hkv != 0) throw CLI::ValidationError("--kv-heads", "must divide --heads");
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return a;
}

// One backend's attention on device copies of the same inputs.
struct AttentionRun {
  std::unique_ptr<Backend> be;
  float *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *dout = nullptr, *dq = nullptr, *dk = nullptr,
        *dv = nullptr;
  AttentionArgs a;

  AttentionRun(const std::string& name, const Args& g, const std::vector<float>& hq, const std::vector<float>& hk,
               const std::vector<float>& hv, const std::vector<float>& hdo, const std::vector<int64_t>& pos0)
      : be(make_backend(name)) {
    const int64_t nq = int64_t(hq.size()), nk = int64_t(hk.size());
    q = upload(hq);
    k = upload(hk);
    v = upload(hv);
    dout = upload(hdo);
    out = be->alloc(nq);
    dq = be->alloc(nq);
    dk = be->alloc(nk);
    dv = be->alloc(nk);
    a.q = q; a.k_cache = k; a.v_cache = v; a.out = out; a.pos0 = pos0.data();
    a.B = g.B; a.T = g.T; a.S = g.T; a.Hq = g.Hq; a.Hkv = g.Hkv; a.dh = g.dh; a.window = g.window;
    a.scale = 1.0f / std::sqrt(float(g.dh));
  }
  ~AttentionRun() {
    for (float* p : {q, k, v, out, dout, dq, dk, dv}) be->free(p);
  }
  float* upload(const std::vector<float>& h) {
    float* p = be->alloc(int64_t(h.size()));
    be->from_host(p, h.data(), int64_t(h.size()) * 4);
    return p;
  }
  void sync() {
    float x;
    be->to_host(&x, out, 4);
  }
  // Median seconds of `fn` over the timed runs.
  template <typename Fn>
  double time(const Args& g, Fn fn) {
    for (int i = 0; i < g.warmup; ++i) fn();
    sync();
    std::vector<double> s;
    for (int i = 0; i < g.runs; ++i) {
      const auto t0 = Clock::now();
      fn();
      sync();
      s.push_back(seconds_since(t0));
    }
    return bench::median(s);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Args g = parse(argc, argv);
  std::mt19937_64 rng(g.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = normal(rng);
    return x;
  };
  const auto hq = random(g.B * g.T * g.Hq * g.dh), hk = random(g.B * g.T * g.Hkv * g.dh),
             hv = random(g.B * g.T * g.Hkv * g.dh), hdo = random(g.B * g.T * g.Hq * g.dh);
  const std::vector<int64_t> pos0(size_t(g.B), 0);
  // The causal half of the score matrix (a window keeps at most `window` keys a row).
  double pairs = double(g.T) * double(g.T + 1) / 2.0;
  if (g.window > 0 && g.window < g.T) pairs = double(g.window) * double(g.T) - double(g.window) * (g.window - 1) / 2.0;
  const double fwd_flops = 4.0 * double(g.B * g.Hq * g.dh) * pairs, bwd_flops = 2.5 * fwd_flops;

  std::vector<std::pair<std::string, bool>> paths = {{"default", false}};
  if (g.backend == "cuda") paths = {{"gemm", false}, {"flash", true}};
  json out;
  out["shape"] = {{"B", g.B}, {"T", g.T}, {"Hq", g.Hq}, {"Hkv", g.Hkv}, {"dh", g.dh}, {"window", g.window}};
  out["backend"] = g.backend;
  out["flops"] = {{"forward", fwd_flops}, {"backward", bwd_flops}};
  for (const auto& [path, flash] : paths) {
    if (flash) setenv("ZAYA_ATTN_FLASH", "1", 1);
    else unsetenv("ZAYA_ATTN_FLASH");
    try {
      AttentionRun run(g.backend, g, hq, hk, hv, hdo, pos0);
      const double fwd = run.time(g, [&] { run.be->attention(run.a); });
      const double both = run.time(g, [&] {
        run.be->attention(run.a);
        run.be->attention_backward(run.a, run.dout, run.dq, run.dk, run.dv);
      });
      const double bwd = both - fwd;
      out["paths"][path] = {{"forward_ms", fwd * 1e3},
                            {"forward_backward_ms", both * 1e3},
                            {"forward_tflops", fwd_flops / fwd * 1e-12},
                            {"backward_tflops", bwd > 0 ? bwd_flops / bwd * 1e-12 : 0.0},
                            {"forward_backward_tflops", (fwd_flops + bwd_flops) / both * 1e-12},
                            {"diagnostics", run.be->diagnostics()}};
      std::fprintf(stderr, "%-7s forward %8.3f ms (%6.1f TFLOP/s)  forward+backward %8.3f ms (%6.1f TFLOP/s)\n",
                   path.c_str(), fwd * 1e3, fwd_flops / fwd * 1e-12, both * 1e3,
                   (fwd_flops + bwd_flops) / both * 1e-12);
    } catch (const std::exception& e) {
      out["paths"][path] = {{"error", e.what()}};
      std::fprintf(stderr, "%-7s failed: %s\n", path.c_str(), e.what());
    }
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
