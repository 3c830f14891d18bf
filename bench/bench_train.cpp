// Training-step benchmark on the CPU backend, or on the GPU backend with --backend cuda.
//
// One training step exactly as the trainer runs it: zero the grads, Model::forward_backward on
// each of --micro-batches K (default 1) micro-batches of B sequences of T tokens, the gradients
// accumulating (loss = mean next-token CE over all K*B*T tokens, loss_scale = 1 / (K*B*T)),
// global grad-norm clip (max norm 1.0), Optimizer::step (Muon with 5 Newton-Schulz steps per
// matrix / per expert, AdamW for the rest), BiasBalancer::step on the summed expert counts.
// zaya-60m preset, random init (seed), random token ids (fixed seed), B=8 T=256 by default.
// Warm-up steps, then the median over timed steps of: tokens/s, seconds of forward+backward
// and seconds of the optimizer part (norm + clip + optimizer + balancer).
// mfu_fwd_bwd is the same FLOPs over the forward+backward time alone (what each data-parallel
// rank repeats in full; distributed Muon shares the optimizer's Newton-Schulz among the ranks).
// newton_schulz_flops_per_step counts the optimizer's matmuls, which MFU leaves out;
// model_share_of_matmul_flops is the model's part of all the step's matmul FLOPs (the most MFU
// can reach on one rank), matmul_flops_utilisation both together over the step time and peak.
//
// MFU = training_flops_per_token(config, T) * tokens/s / sgemm peak. The peak is the median
// GFLOP/s of a 2048^3 cblas_sgemm on all threads (the trainer's measure_sgemm_gflops() figure,
// the best of a few 2048^3 runs, is reported too; the larger of the two is the denominator).
//
// --profile adds a per-op breakdown of the timed steps from a timing decorator Backend that
// wraps the CPU backend (forward, backward and optimizer ops; linear / linear_backward are
// named by their weight).
// Prints one JSON object on stdout; human-readable lines go to stderr.
// Run with OMP_WAIT_POLICY=PASSIVE on a shared machine (the zaya CLI sets it itself).
//
// --backend cuda: the same step on the GPU backend (bf16 GEMMs, fp32 master weights and
// optimizer state); each timed step ends with a device synchronisation. MFU is then against the
// backend's measured matmul peak (Backend::matmul_peak_gflops: 8192^3 bf16 GEMMs through the
// engine the ops use), and the JSON also reports the device memory the backend held at most.
// --config FILE takes the model shape from a config.json (random init) instead of a preset.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench_common.h"
#include "timed_backend.h"
#include "core/error.h"
#include "model/config.h"
#include "model/model.h"
#include "model/model_io.h"
#include "train/balancer.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/train_support.h"

using namespace zaya;
using Clock = std::chrono::steady_clock;
using bench::bench_sgemm;
using bench::median;
using bench::seconds_since;
using bench::stats;
using bench::TimedBackend;
using bench::name_weights;
using json = nlohmann::json;

namespace {



std::vector<int32_t> random_ids(int64_t n, int64_t V, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& id : ids) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    id = int32_t((s >> 33) % uint64_t(V));
  }
  return ids;
}

struct Args {
  std::string model_dir, preset = "zaya-60m", config_path, backend = "cpu";
  uint64_t seed = 1234, data_seed = 7;
  int64_t B = 8, T = 256, micro_batches = 1;
  int warmup = 2, steps = 7, peak_runs = 7;
  int64_t gemm_n = 2048;
  double lr = 4e-4, clip = 1.0;
  bool profile = false, skip_peaks = false, recompute = false;
};

void add_options(CLI::App& app, Args& a) {
  app.add_option("--model", a.model_dir, "Model directory to load (instead of a random --preset model)");
  app.add_option("--preset", a.preset, "Built-in model shape, random init")->capture_default_str();
  app.add_option("--config", a.config_path, "A config.json instead of a preset (random init)");
  app.add_option("--backend", a.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--seed", a.seed, "Random init seed (with --preset or --config)")->capture_default_str();
  app.add_option("--data-seed", a.data_seed, "Seed of the random token ids")->capture_default_str();
  app.add_option("--batch", a.B, "Sequences per step (one micro-batch)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seq", a.T, "Tokens per sequence (at least 2)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, std::numeric_limits<int64_t>::max()).description("INT>=2"));
  app.add_option("--micro-batches", a.micro_batches,
                 "Micro-batches of --batch sequences accumulated per optimizer step (distinct random tokens)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "Untimed steps first")->capture_default_str();
  app.add_option("--steps", a.steps, "Timed steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--lr", a.lr, "Learning rate")->capture_default_str();
  app.add_option("--clip", a.clip, "Global grad-norm clip (<= 0: no clipping)")->capture_default_str();
  app.add_option("--gemm-n", a.gemm_n, "Size of the CPU sgemm peak measure (N^3)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--peak-runs", a.peak_runs, "Timed runs of the CPU sgemm peak measure")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--skip-peaks", a.skip_peaks, "Skip the matmul peak measures (no MFU)");
  app.add_flag("--profile", a.profile, "Add a per-op breakdown of the timed steps");
  app.add_flag("--recompute", a.recompute,
               "Activation recomputation: keep each block's inputs only and rerun its forward before its backward "
               "(less memory; MFU still counts the model's FLOPs once)");
}

}  // namespace

int main(int argc, char** argv) try {
  Args args;
  CLI::App app("bench_train: one training step (forward+backward, clip, optimizer, balancer): tok/s and MFU");
  add_options(app, args);
  CLI11_PARSE(app, argc, argv);  // --help and bad options: CLI11's message and exit code
  json out;
  const int threads = omp_get_max_threads();
  out["threads"] = threads;
  const char* wp = std::getenv("OMP_WAIT_POLICY");
  out["omp_wait_policy"] = wp ? wp : "(unset)";
  std::fprintf(stderr, "bench_train: %d OpenMP threads, OMP_WAIT_POLICY=%s\n", threads, wp ? wp : "(unset)");

  // --- model, optimizer, balancer (exactly the trainer's objects) ---
  std::unique_ptr<Backend> base = make_backend(args.backend);
  TimedBackend tb(*base);
  out["backend"] = base->name();
  std::unique_ptr<Model> model;
  if (!args.model_dir.empty()) {
    model = load_model(args.model_dir, tb);
    out["model"] = args.model_dir;
  } else if (!args.config_path.empty()) {
    model = std::make_unique<Model>(load_config_file(args.config_path), tb);
    model->init_random(args.seed);
    args.preset = "config " + args.config_path;
    out["model"] = args.config_path + " (random init, seed " + std::to_string(args.seed) + ")";
  } else {
    model = std::make_unique<Model>(preset_config(args.preset), tb);
    model->init_random(args.seed);
    out["model"] = "preset " + args.preset + " (random init, seed " + std::to_string(args.seed) + ")";
  }
  name_weights(tb, *model);
  const ModelConfig& c = model->config();
  const ParamLayout& layout = model->layout();
  OptimizerConfig oc;  // defaults: Muon (mu 0.95, Nesterov, 5 NS steps) + AdamW (0.9, 0.95), wd 0.1
  oc.lr = args.lr;
  Optimizer optim(layout, oc, tb);
  BalancerConfig bc;
  BiasBalancer balancer(layout, bc, tb);
  float* grads = tb.alloc(layout.total);

  // N: tokens per optimizer step, over K micro-batches of B x T (distinct random tokens each).
  const int64_t B = args.B, T = args.T, K = args.micro_batches, N = K * B * T;
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(K)), targets(static_cast<size_t>(K));
  for (int64_t m = 0; m < K; ++m) {
    ids[size_t(m)] = random_ids(B * T, c.vocab_size, args.data_seed + uint64_t(m));
    targets[size_t(m)].resize(size_t(B * T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        targets[size_t(m)][size_t(b * T + t)] = t + 1 < T ? ids[size_t(m)][size_t(b * T + t + 1)] : -1;
  }

  int64_t muon_mats = int64_t(optim.muon_matrices().size());
  out["config"] = {{"preset", args.preset}, {"layers", c.num_hidden_layers}, {"hidden", c.hidden_size},
                   {"vocab", c.vocab_size}, {"experts", c.num_experts}, {"expert_width", c.moe_intermediate_size},
                   {"heads_q", c.num_attention_heads}, {"heads_kv", c.num_key_value_heads},
                   {"head_dim", c.head_dim}, {"router_hidden", c.router_hidden_size},
                   {"params", layout.total}, {"muon_matrices", muon_mats}};
  out["batch"] = {{"B", B}, {"T", T}, {"tokens_per_step", N}, {"micro_batches", K}};
  model->set_activation_recompute(args.recompute);
  out["activation_recompute"] = args.recompute;
  std::fprintf(stderr,
               "model %s: %lld params, %lld Muon matrices; batch B=%lld T=%lld x %lld micro-batches (%lld "
               "tokens/step)%s\n",
               args.preset.c_str(), (long long)layout.total, (long long)muon_mats, (long long)B, (long long)T,
               (long long)K, (long long)N, args.recompute ? "; activations recomputed" : "");

  // --- the step ---
  struct StepTimes {
    double total, fb, opt;
    double loss, gnorm;
  };
  auto step_once = [&]() -> StepTimes {
    auto t0 = Clock::now();
    tb.phase = "fb.";
    tb.fill(grads, 0.0f, layout.total);
    StepStats st;
    for (int64_t m = 0; m < K; ++m) {  // gradients accumulate; the loss is the mean over all N tokens
      StepStats mb = model->forward_backward(ids[size_t(m)].data(), targets[size_t(m)].data(), B, T, grads,
                                             1.0f / float(N));
      st.loss_sum += mb.loss_sum;
      st.tokens += mb.tokens;
      if (st.expert_counts.empty()) st.expert_counts.assign(mb.expert_counts.size(), 0);
      for (size_t i = 0; i < mb.expert_counts.size(); ++i) st.expert_counts[i] += mb.expert_counts[i];
    }
    const double t_fb = seconds_since(t0);
    auto t1 = Clock::now();
    tb.phase = "opt.";
    const double gnorm = std::sqrt(tb.sum_squares(grads, layout.total));
    if (args.clip > 0) {
      const double s = clip_scale(gnorm, args.clip);
      if (s < 1.0) tb.scale_inplace(grads, float(s), layout.total);
    }
    optim.step(model->params(), grads, float(args.lr));
    balancer.step(st.expert_counts, model->params());
    float sync;
    tb.to_host(&sync, grads, 4);  // the device has finished the step (a no-op wait on the CPU)
    const double t_opt = seconds_since(t1);
    return {seconds_since(t0), t_fb, t_opt, st.loss_sum / double(st.tokens), gnorm};
  };

  for (int i = 0; i < args.warmup; ++i) {
    StepTimes s = step_once();
    std::fprintf(stderr, "warm-up step %d: %.1f ms (fwd+bwd %.1f, optimizer %.1f), loss %.4f, grad norm %.3f\n", i + 1,
                 s.total * 1e3, s.fb * 1e3, s.opt * 1e3, s.loss, s.gnorm);
  }
  tb.enabled = args.profile;
  std::vector<double> tot, fb, opt, tps, losses;
  for (int i = 0; i < args.steps; ++i) {
    StepTimes s = step_once();
    tot.push_back(s.total);
    fb.push_back(s.fb);
    opt.push_back(s.opt);
    tps.push_back(double(N) / s.total);
    losses.push_back(s.loss);
    std::fprintf(stderr, "step %d: %.1f ms (fwd+bwd %.1f, optimizer %.1f) = %.0f tok/s, loss %.4f, grad norm %.3f\n",
                 i + 1, s.total * 1e3, s.fb * 1e3, s.opt * 1e3, double(N) / s.total, s.loss, s.gnorm);
  }
  tb.enabled = false;

  const double flops_tok = training_flops_per_token(c, T);
  const double tok_s = median(tps);
  const double gflops = flops_tok * tok_s * 1e-9;
  out["step_seconds"] = stats(tot);
  out["fwd_bwd_seconds"] = stats(fb);
  out["optimizer_seconds"] = stats(opt);
  out["tokens_per_s"] = stats(tps);
  out["losses"] = losses;
  out["fwd_bwd_share"] = median(fb) / median(tot);
  out["optimizer_share"] = median(opt) / median(tot);
  out["training_flops_per_token"] = flops_tok;
  out["flop_formula"] =
      "training_flops_per_token (src/train/train_support.cpp): 3 x (2 x active matmul params [q,k,v,o, router, one "
      "expert, grouped conv, LM head] + causal attention L*2*T*q_dim); optimizer FLOPs not counted";
  out["gflops_per_s"] = gflops;
  // Forward + backward alone: the part of the step every data-parallel rank repeats in full,
  // while distributed Muon splits the optimizer's Newton-Schulz work across the ranks.
  const double fb_gflops = flops_tok * double(N) / median(fb) * 1e-9;
  out["fwd_bwd_gflops_per_s"] = fb_gflops;
  // Newton-Schulz's matmuls, which MFU does not count: on one rank they bound MFU at the model's
  // share of the step's matmul FLOPs, however fast every kernel runs.
  double ns_flops = 0;
  for (const MuonMatrix& m : optim.muon_matrices()) ns_flops += newton_schulz_flops(m.rows, m.cols, oc.ns_steps);
  const double model_flops = flops_tok * double(N);
  const double model_share = model_flops / (model_flops + ns_flops);
  out["newton_schulz_flops_per_step"] = ns_flops;
  out["newton_schulz_gflops_per_s_of_optimizer_time"] = ns_flops / median(opt) * 1e-9;
  out["model_share_of_matmul_flops"] = model_share;

  std::fprintf(stderr,
               "median step %.1f ms = %.0f tok/s (min %.0f, max %.0f); fwd+bwd %.1f ms (%.0f%%), optimizer %.1f ms "
               "(%.0f%%); %.3f GFLOP/token -> %.1f GFLOP/s\n",
               median(tot) * 1e3, tok_s, out["tokens_per_s"]["min"].get<double>(),
               out["tokens_per_s"]["max"].get<double>(), median(fb) * 1e3, 100 * median(fb) / median(tot),
               median(opt) * 1e3, 100 * median(opt) / median(tot), flops_tok * 1e-9, gflops);
  std::fprintf(stderr,
               "Newton-Schulz: %.2f TFLOP per step = %.1f GFLOP/s over the optimizer's time; the model is %.1f%% of "
               "the step's matmul FLOPs, the most MFU can reach with Muon on one rank\n",
               ns_flops * 1e-12, ns_flops / median(opt) * 1e-9, 100 * model_share);

  out["peak_memory_bytes"] = tb.peak_memory_bytes();
  out["backend_diagnostics"] = tb.diagnostics();
  if (!tb.diagnostics().empty()) std::fprintf(stderr, "%s\n", tb.diagnostics().c_str());
  if (tb.peak_memory_bytes() > 0)
    std::fprintf(stderr, "device memory held at most: %.2f GiB\n", double(tb.peak_memory_bytes()) / double(1 << 30));
  // --- peak (after the steps, so the timed steps see a warm, unperturbed process) ---
  const double backend_peak = args.skip_peaks ? 0.0 : tb.matmul_peak_gflops();
  if (backend_peak > 0) {
    out["matmul_peak_gflops"] = backend_peak;
    out["mfu"] = gflops / backend_peak;
    out["mfu_fwd_bwd"] = fb_gflops / backend_peak;
    out["matmul_flops_utilisation"] = (model_flops + ns_flops) / median(tot) * 1e-9 / backend_peak;
    std::fprintf(stderr,
                 "%s matmul peak (8192^3, the ops' precision): %.1f TFLOP/s; MFU %.1f%% (fwd+bwd alone %.1f%%)\n",
                 base->name().c_str(), backend_peak * 1e-3, 100 * gflops / backend_peak,
                 100 * fb_gflops / backend_peak);
  } else if (!args.skip_peaks) {
    json g = bench_sgemm(args.gemm_n, args.peak_runs);
    const double small = measure_sgemm_gflops();
    out["sgemm"] = g;
    out["trainer_measure_sgemm_gflops"] = small;
    const double peak = std::max(g["median"].get<double>(), small);
    out["sgemm_peak_gflops"] = peak;
    out["sgemm_peak_source"] = peak == small ? "measure_sgemm_gflops (best of 2048^3 runs)"
                                             : "cblas_sgemm " + std::to_string(args.gemm_n) + "^3";
    out["mfu"] = gflops / peak;
    out["mfu_fwd_bwd"] = fb_gflops / peak;
    out["matmul_flops_utilisation"] = (model_flops + ns_flops) / median(tot) * 1e-9 / peak;
    std::fprintf(
        stderr,
        "sgemm %lld^3: median %.1f GFLOP/s (min %.1f, max %.1f); trainer's measure_sgemm_gflops %.1f; "
        "MFU %.1f%% of %.1f (fwd+bwd alone %.1f%%)\n",
        (long long)args.gemm_n, g["median"].get<double>(), g["min"].get<double>(), g["max"].get<double>(),
        small, 100 * gflops / peak, peak, 100 * fb_gflops / peak);
  }

  if (args.profile) {
    double total = 0;
    for (double s : tot) total += s;
    std::vector<std::pair<std::string, TimedBackend::Stat>> v(tb.stats.begin(), tb.stats.end());
    std::sort(v.begin(), v.end(), [](auto& x, auto& y) { return x.second.seconds > y.second.seconds; });
    json ops = json::array();
    double covered = 0;
    std::fprintf(stderr, "  per-op breakdown (%% of step wall time, ms per step; fb. = forward+backward, opt. = "
                         "optimizer part)\n");
    for (auto& [nm, s] : v) {
      covered += s.seconds;
      ops.push_back({{"op", nm}, {"seconds", s.seconds}, {"calls", s.calls}, {"share", s.seconds / total},
                     {"ms_per_step", 1e3 * s.seconds / double(args.steps)}});
      std::fprintf(stderr, "    %-34s %6.1f%%  %9.2f ms/step  calls/step %6lld\n", nm.c_str(), 100 * s.seconds / total,
                   1e3 * s.seconds / double(args.steps), (long long)(s.calls / args.steps));
    }
    std::fprintf(stderr, "    %-34s %6.1f%%\n", "(outside ops)", 100 * (1 - covered / total));
    out["profile"] = {{"ops", ops}, {"outside_ops_share", 1 - covered / total}};
  }
  tb.free(grads);
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train: %s\n", e.what());
  return 1;
}
