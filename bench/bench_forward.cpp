// Forward (inference) benchmark on the CPU backend.
//
// Measures, on this machine:
//   * the sgemm peak (large square cblas_sgemm, all threads, median GFLOP/s),
//   * the memory read bandwidth (OpenMP sum over a large float array, median GB/s),
//   * prefill throughput of a ZAYA model for [B,T] batches (tok/s, GFLOP/s, MFU),
//   * batch-1 decode throughput after a prompt, against the bandwidth bound
//     (read bandwidth / bytes of weights + KV cache touched per token),
//   * optionally (--profile) a per-op time breakdown of prefill and decode, from a
//     timing decorator Backend that wraps the CPU backend.
// Prints one JSON object on stdout; human-readable lines go to stderr.
//
// FLOP accounting (also written into the JSON):
//   prefill FLOPs = 2 * P_active * tokens + L * B * 2 * T^2 * Hq * dh
//   P_active = parameters used per token excluding the embedding lookup and including the LM
//   head: every non-expert block parameter (CCA projections, convs, norms, router, residual
//   scales), the final norm, V*D for the head, and the selected expert's 3*I*D for each
//   token that is routed (skip-class tokens run no expert; we count the routed fraction
//   measured on the benchmark batch). The attention term is QK^T and P.V over the causal
//   half: 2 matmuls * 2 FLOP * T^2/2 * Hq * dh per layer per sequence. Element-wise work
//   (norms, RoPE, softmax, GELU) is not counted.
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
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
#include "model/params.h"

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


json bench_read_bw(int64_t bytes, int runs) {
  const int64_t n = bytes / 4;
  float* a = static_cast<float*>(std::aligned_alloc(64, size_t(n) * 4));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = float(i & 1023) * 1e-3f;  // first touch by the reading thread
  volatile float sink = 0;
  std::vector<double> gbs;
  for (int r = 0; r < runs + 1; ++r) {
    auto t0 = Clock::now();
    // 8 independent AVX accumulators per thread so the adds never limit the read rate.
    float s = 0;
#pragma omp parallel reduction(+ : s)
    {
      __m256 acc[8];
      for (auto& v : acc) v = _mm256_setzero_ps();
      const int64_t blocks = n / 64;
#pragma omp for schedule(static)
      for (int64_t bi = 0; bi < blocks; ++bi) {
        const float* p = a + bi * 64;
        for (int k = 0; k < 8; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_load_ps(p + 8 * k));
      }
      for (int k = 1; k < 8; ++k) acc[0] = _mm256_add_ps(acc[0], acc[k]);
      alignas(32) float t[8];
      _mm256_store_ps(t, acc[0]);
      for (float x : t) s += x;
    }
    double t = seconds_since(t0);
    sink = sink + s;
    if (r > 0) gbs.push_back(double(n) * 4 / t * 1e-9);  // first pass is the warm-up
  }
  std::free(a);
  json j = stats(gbs);
  j["bytes"] = bytes;
  return j;
}

// ------------------------------------------------------------------ model accounting
struct Accounting {
  double nonexpert_params = 0;  // per-token params excl. embedding, experts and LM head
  double expert_params = 0;     // one expert: 3*I*D
  double head_params = 0;       // V*D (+ bias)
  double embed_row = 0;         // D (one embedding row read per token)
};

Accounting account(const Model& m) {
  const ModelConfig& c = m.config();
  Accounting a;
  for (const ParamSpec& p : m.layout().params) {
    if (p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight" || p.name == "lm_head.bias") continue;
    if (p.name.find(".mlp.experts.") != std::string::npos) continue;
    a.nonexpert_params += double(p.numel);
  }
  a.expert_params = 3.0 * double(c.moe_intermediate_size) * c.hidden_size;
  a.head_params = double(c.vocab_size) * c.hidden_size + (c.lm_head_bias ? double(c.vocab_size) : 0.0);
  a.embed_row = double(c.hidden_size);
  return a;
}

std::vector<int32_t> random_ids(int64_t n, int64_t V, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& id : ids) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    id = int32_t((s >> 33) % uint64_t(V));
  }
  return ids;
}

json ops_json(const TimedBackend& tb, double total_seconds) {
  std::vector<std::pair<std::string, TimedBackend::Stat>> v(tb.stats.begin(), tb.stats.end());
  std::sort(v.begin(), v.end(), [](auto& x, auto& y) { return x.second.seconds > y.second.seconds; });
  json j = json::array();
  for (auto& [nm, s] : v) {
    json o{{"op", nm}, {"seconds", s.seconds}, {"calls", s.calls}, {"share", s.seconds / total_seconds}};
    if (s.flops > 0) o["gflops_per_s"] = s.flops / s.seconds * 1e-9;
    j.push_back(o);
  }
  return j;
}

void print_ops(const char* title, const json& ops, double total, double per) {
  std::fprintf(stderr, "  %s (op time summed over runs; %% of forward wall time)\n", title);
  double covered = 0;
  for (const auto& o : ops) {
    covered += o["seconds"].get<double>();
    std::fprintf(stderr, "    %-20s %6.1f%%  %9.3f ms/%s  calls %6lld", o["op"].get<std::string>().c_str(),
                 100 * o["share"].get<double>(), 1e3 * o["seconds"].get<double>() / per,
                 "fwd", (long long)o["calls"].get<int64_t>());
    if (o.contains("gflops_per_s")) std::fprintf(stderr, "  %7.1f GFLOP/s", o["gflops_per_s"].get<double>());
    std::fprintf(stderr, "\n");
  }
  std::fprintf(stderr, "    %-20s %6.1f%%\n", "(outside ops)", 100 * (1 - covered / total));
}

struct Args {
  std::string model_dir, save_dir, preset = "zaya-60m";
  uint64_t seed = 1234;
  int prefill_runs = 7, decode_runs = 3, peak_runs = 7;
  int64_t prompt = 64, steps = 128, gemm_n = 2048, bw_mib = 512;
  bool profile = false, skip_peaks = false, peaks_only = false;
  std::string shapes = "1x512,4x256";  // prefill batches, BxT,BxT (parse_shapes)
};

// "BxT,BxT,..." as (B, T) pairs; empty if any entry is malformed or not positive.
std::vector<std::pair<int64_t, int64_t>> parse_shapes(const std::string& text) {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t x = item.find('x');
    if (x == std::string::npos) return {};
    int64_t B = 0, T = 0;
    const char* end = item.data() + item.size();
    auto b = std::from_chars(item.data(), item.data() + x, B);
    auto t = std::from_chars(item.data() + x + 1, end, T);
    if (b.ec != std::errc() || b.ptr != item.data() + x || t.ec != std::errc() || t.ptr != end) return {};
    if (B < 1 || T < 1) return {};
    shapes.emplace_back(B, T);
  }
  return shapes;
}

// A CLI11 check for --shapes.
std::string check_shapes(const std::string& text) {
  return parse_shapes(text).empty() ? "expected BxT[,BxT...] with positive B and T, got '" + text + "'" : "";
}

void add_options(CLI::App& app, Args& a) {
  app.add_option("--model", a.model_dir, "Model directory to load (instead of a random --preset model)");
  app.add_option("--preset", a.preset, "Built-in model shape, random init")->capture_default_str();
  app.add_option("--seed", a.seed, "Random init seed (with --preset)")->capture_default_str();
  app.add_option("--save", a.save_dir, "Also write the model to this directory");
  app.add_option("--shapes", a.shapes, "Prefill batches, BxT,BxT")
      ->capture_default_str()
      ->check(CLI::Validator(check_shapes, "BxT,BxT"));
  app.add_option("--prefill-runs", a.prefill_runs, "Timed prefill runs per shape")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--decode-runs", a.decode_runs, "Timed batch-1 decode runs")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--prompt", a.prompt, "Prompt tokens before decoding")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", a.steps, "Decode steps per run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--gemm-n", a.gemm_n, "Size of the sgemm peak measure (N^3)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--bw-mib", a.bw_mib, "Array size of the read bandwidth measure, MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--peak-runs", a.peak_runs, "Timed runs of the sgemm and bandwidth measures")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--skip-peaks", a.skip_peaks, "Skip the sgemm and bandwidth measures (no MFU, no bound)");
  app.add_flag("--peaks-only", a.peaks_only, "Only the sgemm and bandwidth measures, no model");
  app.add_flag("--profile", a.profile, "Add a per-op breakdown of prefill and decode");
}

}  // namespace

int main(int argc, char** argv) try {
  Args args;
  CLI::App app("bench_forward: CPU forward benchmark (sgemm peak, read bandwidth, prefill and decode tok/s)");
  add_options(app, args);
  CLI11_PARSE(app, argc, argv);  // --help and bad options: CLI11's message and exit code
  json out;
  const int threads = omp_get_max_threads();
  out["threads"] = threads;
  std::fprintf(stderr, "bench_forward: %d OpenMP threads\n", threads);

  // --- machine peaks ---
  double peak_gflops = 0, bw_gbs = 0;
  if (!args.skip_peaks) {
    json g = bench_sgemm(args.gemm_n, args.peak_runs);
    peak_gflops = g["median"];
    out["sgemm"] = g;
    std::fprintf(stderr, "sgemm %lld^3: median %.1f GFLOP/s (min %.1f, max %.1f)\n", (long long)args.gemm_n,
                 peak_gflops, g["min"].get<double>(), g["max"].get<double>());
    json bw = bench_read_bw(args.bw_mib << 20, args.peak_runs);
    bw_gbs = bw["median"];
    out["read_bw"] = bw;
    std::fprintf(stderr, "read bandwidth (%lld MiB array): median %.2f GB/s (min %.2f, max %.2f)\n",
                 (long long)args.bw_mib, bw_gbs, bw["min"].get<double>(), bw["max"].get<double>());
  }

  if (args.peaks_only) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }

  // --- model ---
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  TimedBackend tb(*cpu);
  std::unique_ptr<Model> model;
  if (!args.model_dir.empty()) {
    model = load_model(args.model_dir, tb);
    out["model"] = args.model_dir;
  } else {
    model = std::make_unique<Model>(preset_config(args.preset), tb);
    model->init_random(args.seed);
    out["model"] = "preset " + args.preset + " (random init, seed " + std::to_string(args.seed) + ")";
  }
  if (!args.save_dir.empty()) {
    save_model(*model, args.save_dir);
    std::fprintf(stderr, "wrote %s\n", args.save_dir.c_str());
  }
  name_weights(tb, *model);
  // Second bandwidth figure at the size of the whole weight arena: on parts whose last-level
  // cache holds the model (this VM reports a 480 MiB L3) decode can stream from cache, so the
  // 512 MiB-array (DRAM) bound understates what is reachable.
  double bw_model_gbs = 0;
  if (!args.skip_peaks) {
    const int64_t arena_bytes = (model->layout().total * 4 + (int64_t(1) << 20) - 1) >> 20 << 20;
    json bw2 = bench_read_bw(arena_bytes, args.peak_runs);
    bw_model_gbs = bw2["median"];
    out["read_bw_model_size"] = bw2;
    std::fprintf(stderr, "read bandwidth (%.0f MiB array = all weights): median %.2f GB/s (min %.2f, max %.2f)\n",
                 double(arena_bytes >> 20), bw_model_gbs, bw2["min"].get<double>(), bw2["max"].get<double>());
  }
  const ModelConfig& c = model->config();
  const int64_t L = c.num_hidden_layers, V = c.vocab_size, E = c.num_experts, Hq = c.num_attention_heads,
                dh = c.head_dim;
  Accounting acc = account(*model);
  out["config"] = {{"layers", L}, {"hidden", c.hidden_size}, {"vocab", V}, {"experts", E},
                   {"expert_width", c.moe_intermediate_size}, {"heads_q", Hq}, {"heads_kv", c.num_key_value_heads},
                   {"head_dim", dh}, {"router_hidden", c.router_hidden_size}};
  out["params_per_token"] = {{"non_expert", acc.nonexpert_params}, {"one_expert_per_layer", acc.expert_params * L},
                             {"lm_head", acc.head_params},
                             {"active_total", acc.nonexpert_params + acc.expert_params * L + acc.head_params}};
  out["flop_formula"] =
      "FLOPs = 2*(P_nonexpert + P_lmhead + routed_fraction*L*3*I*D)*B*T + L*B*2*T^2*Hq*dh; "
      "P excludes the embedding lookup; routed_fraction = share of (token, layer) pairs not sent to the skip class, "
      "measured on the batch; attention = QK^T + PV over the causal half (4*T^2/2*Hq*dh per layer per sequence); "
      "element-wise ops not counted. MFU = achieved GFLOP/s / sgemm peak.";
  std::fprintf(stderr, "model: %lld layers, d=%lld, %lld experts x %lld, vocab %lld; active params/token %.2fM "
                       "(non-expert %.2fM + experts %.2fM + LM head %.2fM)\n",
               (long long)L, (long long)c.hidden_size, (long long)E, (long long)c.moe_intermediate_size, (long long)V,
               (acc.nonexpert_params + acc.expert_params * L + acc.head_params) * 1e-6, acc.nonexpert_params * 1e-6,
               acc.expert_params * L * 1e-6, acc.head_params * 1e-6);
  std::fprintf(stderr, "FLOPs: %s\n", out["flop_formula"].get<std::string>().c_str());

  // --- prefill ---
  json prefill = json::array();
  json profiles;
  for (auto [B, T] : parse_shapes(args.shapes)) {
    const int64_t N = B * T;
    std::vector<int32_t> ids = random_ids(N, V, 42 + uint64_t(B * 100000 + T));
    std::vector<float> logits(size_t(N * V));
    std::vector<int32_t> experts(size_t(L * N));
    ForwardOutputs fo;
    fo.logits = logits.data();
    // Warm-up run; it also records the routing to count the expert FLOPs actually done.
    ForwardOutputs fw = fo;
    fw.experts = experts.data();
    model->forward(ids.data(), B, T, nullptr, fw);
    int64_t routed = 0;
    for (int32_t e : experts) routed += e < E;
    const double routed_frac = double(routed) / double(L * N);
    const double flops = 2.0 * (acc.nonexpert_params + acc.head_params) * N + 2.0 * acc.expert_params * routed +
                         double(L) * B * 2.0 * double(T) * T * Hq * dh;
    const double flops_nominal = 2.0 * (acc.nonexpert_params + acc.head_params + acc.expert_params * L) * N +
                                 double(L) * B * 2.0 * double(T) * T * Hq * dh;
    std::vector<double> tps, secs;
    for (int r = 0; r < args.prefill_runs; ++r) {
      auto t0 = Clock::now();
      model->forward(ids.data(), B, T, nullptr, fo);
      double s = seconds_since(t0);
      secs.push_back(s);
      tps.push_back(double(N) / s);
    }
    const double tok_s = median(tps), sec = median(secs);
    const double gflops = flops / sec * 1e-9;
    json p{{"B", B},
           {"T", T},
           {"tokens_per_s", stats(tps)},
           {"seconds", stats(secs)},
           {"flops", flops},
           {"flops_nominal_all_routed", flops_nominal},
           {"routed_fraction", routed_frac},
           {"gflops_per_s", gflops}};
    if (peak_gflops > 0) p["mfu"] = gflops / peak_gflops;
    prefill.push_back(p);
    std::fprintf(stderr,
                 "prefill B=%lld T=%lld: median %.0f tok/s (%.1f ms; min %.0f, max %.0f tok/s), %.2f GFLOP/forward, "
                 "%.1f GFLOP/s, MFU %.1f%% (routed fraction %.3f)\n",
                 (long long)B, (long long)T, tok_s, sec * 1e3, p["tokens_per_s"]["min"].get<double>(),
                 p["tokens_per_s"]["max"].get<double>(), flops * 1e-9, gflops,
                 peak_gflops > 0 ? 100 * gflops / peak_gflops : 0.0, routed_frac);
    if (args.profile) {
      tb.reset();
      tb.enabled = true;
      const int pr = std::max(3, args.prefill_runs / 2);
      auto t0 = Clock::now();
      for (int r = 0; r < pr; ++r) model->forward(ids.data(), B, T, nullptr, fo);
      double total = seconds_since(t0);
      tb.enabled = false;
      json ops = ops_json(tb, total);
      profiles["prefill_B" + std::to_string(B) + "_T" + std::to_string(T)] = {
          {"forward_seconds", total / pr}, {"ops", ops}};
      print_ops(("prefill B=" + std::to_string(B) + " T=" + std::to_string(T)).c_str(), ops, total, pr);
    }
  }
  out["prefill"] = prefill;

  // --- decode at batch 1 ---
  {
    const int64_t P = args.prompt, S = args.steps;
    DecodeState st(c, model->backend(), 1, P + S);
    std::vector<int32_t> prompt = random_ids(P, V, 7);
    std::vector<float> logits(static_cast<size_t>(V));
    std::vector<int32_t> exp_step(static_cast<size_t>(L));
    ForwardOutputs fo;
    fo.logits = logits.data();
    fo.last_only = true;
    int64_t routed = 0, layer_steps = 0;
    auto run = [&](bool count) {
      st.reset();
      model->forward(prompt.data(), 1, P, &st, fo);
      ForwardOutputs fs = fo;
      if (count) fs.experts = exp_step.data();
      auto t0 = Clock::now();
      for (int64_t s = 0; s < S; ++s) {
        int32_t tok = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        model->forward(&tok, 1, 1, &st, fs);
        if (count) {
          for (int32_t e : exp_step) routed += e < E;
          layer_steps += L;
        }
      }
      return seconds_since(t0);
    };
    run(true);  // warm-up, records routing
    const double routed_frac = double(routed) / double(layer_steps);
    std::vector<double> tps;
    for (int r = 0; r < args.decode_runs; ++r) tps.push_back(double(S) / run(false));
    const double tok_s = median(tps);
    // Bytes touched per decoded token (fp32): every non-expert parameter, one expert per layer,
    // the LM head, one embedding row, plus the K and V cache rows read by attention.
    const double avg_ctx = double(P) + double(S + 1) / 2.0;  // keys visible, averaged over the steps
    const double kv_bytes = double(L) * 2.0 * c.kv_dim() * 4.0 * avg_ctx;
    const double w_bytes = 4.0 * (acc.nonexpert_params + acc.expert_params * L + acc.head_params + acc.embed_row);
    const double bytes = w_bytes + kv_bytes;
    json d{{"prompt", P},
           {"steps", S},
           {"tokens_per_s", stats(tps)},
           {"ms_per_token", 1e3 / tok_s},
           {"bytes_per_token", bytes},
           {"weight_bytes_per_token", w_bytes},
           {"kv_bytes_per_token", kv_bytes},
           {"routed_fraction", routed_frac},
           {"bound_formula",
            "bound tok/s = read_bw (large array) / (4 bytes * (non-expert params + L*3*I*D (one expert per layer) + "
            "V*D LM head + D embedding row) + L*2*kv_dim*4 bytes*avg context)"}};
    if (bw_gbs > 0) {
      const double bound = bw_gbs * 1e9 / bytes;
      d["bound_tokens_per_s"] = bound;
      d["fraction_of_bound"] = tok_s / bound;
      d["achieved_gb_s"] = tok_s * bytes * 1e-9;
    }
    if (bw_model_gbs > 0) {
      const double bound2 = bw_model_gbs * 1e9 / bytes;
      d["bound_tokens_per_s_model_size_bw"] = bound2;
      d["fraction_of_bound_model_size_bw"] = tok_s / bound2;
    }
    out["decode"] = d;
    std::fprintf(stderr,
                 "decode B=1 (prompt %lld, %lld steps): median %.1f tok/s (%.2f ms/token; min %.1f, max %.1f); "
                 "%.1f MB/token (weights %.1f + KV %.2f); bound %.1f tok/s -> %.1f%% of bound (routed %.3f)\n",
                 (long long)P, (long long)S, tok_s, 1e3 / tok_s, d["tokens_per_s"]["min"].get<double>(),
                 d["tokens_per_s"]["max"].get<double>(), bytes * 1e-6, w_bytes * 1e-6, kv_bytes * 1e-6,
                 bw_gbs > 0 ? bw_gbs * 1e9 / bytes : 0.0, bw_gbs > 0 ? 100 * tok_s / (bw_gbs * 1e9 / bytes) : 0.0,
                 routed_frac);
    if (bw_model_gbs > 0)
      std::fprintf(stderr, "decode vs model-size-array bandwidth: bound %.1f tok/s -> %.1f%% of bound\n",
                   bw_model_gbs * 1e9 / bytes, 100 * tok_s / (bw_model_gbs * 1e9 / bytes));
    if (args.profile) {
      tb.reset();
      tb.enabled = true;
      double total = 0;
      for (int r = 0; r < args.decode_runs; ++r) {
        // Only the decode steps: turn timing off for the prompt.
        st.reset();
        tb.enabled = false;
        model->forward(prompt.data(), 1, P, &st, fo);
        tb.enabled = true;
        auto t0 = Clock::now();
        for (int64_t s = 0; s < S; ++s) {
          int32_t tok = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
          model->forward(&tok, 1, 1, &st, fo);
        }
        total += seconds_since(t0);
      }
      tb.enabled = false;
      json ops = ops_json(tb, total);
      profiles["decode_B1"] = {{"step_seconds", total / double(args.decode_runs * S)}, {"ops", ops}};
      print_ops("decode B=1 (per token)", ops, total, double(args.decode_runs * S));
    }
  }
  if (args.profile) out["profile"] = profiles;
  if (peak_gflops > 0) out["sgemm_peak_gflops"] = peak_gflops;
  if (bw_gbs > 0) out["read_bw_gbs"] = bw_gbs;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_forward: %s\n", e.what());
  return 1;
}
