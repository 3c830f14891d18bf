// Decode benchmark: tokens/s of incremental decoding (KV cache, CCA conv state and delayed
// value kept on the backend, spec F) at a given batch size, on any backend.
//
// B sequences of a random prompt of P tokens are prefilled in one forward, then K decode steps
// each feed every sequence its greedy next token (argmax of the last position's logits, taken on
// the host, as `zaya generate` does). Reported: prefill tokens/s and decode tokens/s
// (B * K / decode seconds; medians over --rounds), plus milliseconds per decode step.
// Prints one JSON object on stdout; human-readable lines go to stderr.
//
// usage: bench_decode [--preset NAME | --config FILE] [--backend cpu|cuda] [--batch B] [--prompt P]
//                     [--tokens K] [--rounds R] [--seed N]
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench_common.h"
#include "model/config.h"
#include "model/model.h"

using namespace zaya;
using bench::Clock;
using bench::median;
using bench::seconds_since;
using bench::stats;
using json = nlohmann::json;

namespace {

struct Args {
  std::string preset = "zaya-60m", config_path, backend = "cpu";
  int64_t B = 1, P = 128, K = 128;
  int rounds = 3;
  uint64_t seed = 1234;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app("bench_decode: prefill and greedy decode tokens/s on any backend");
  app.add_option("--preset", a.preset, "Built-in model shape")->capture_default_str();
  app.add_option("--config", a.config_path, "A config.json instead of a preset (random init)");
  app.add_option("--backend", a.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--batch", a.B, "Sequences decoded together")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--prompt", a.P, "Prompt tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--tokens", a.K, "Decode steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rounds", a.rounds, "Timed rounds after one warm-up")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "Weights and prompt seed")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return a;
}

int32_t argmax(const float* x, int64_t n) {
  return int32_t(std::max_element(x, x + n) - x);
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  std::unique_ptr<Backend> be = make_backend(a.backend);
  const ModelConfig c = a.config_path.empty() ? preset_config(a.preset) : load_config_file(a.config_path);
  Model model(c, *be);
  model.init_random(a.seed);
  be->set_weights_frozen(true);  // as zaya generate: a GPU converts each weight to bf16 once
  const int64_t V = c.vocab_size, B = a.B, P = a.P, K = a.K;
  uint64_t s = a.seed;
  const std::vector<int32_t> prompt = bench::random_token_ids(B * P, V, &s);
  std::fprintf(stderr, "bench_decode: %s on %s, batch %lld, prompt %lld, %lld decode steps, %d rounds\n",
               a.config_path.empty() ? a.preset.c_str() : a.config_path.c_str(), be->name().c_str(), (long long)B,
               (long long)P, (long long)K, a.rounds);

  DecodeState state(c, *be, B, P + K);
  std::vector<float> logits(static_cast<size_t>(B * V));
  std::vector<int32_t> next(static_cast<size_t>(B));
  ForwardOutputs out;
  out.logits = logits.data();
  out.last_only = true;
  std::vector<double> prefill_tps, decode_tps, step_ms;
  std::vector<int32_t> first_tokens;
  for (int r = 0; r <= a.rounds; ++r) {  // round 0 warms up (allocations, GEMM plans)
    state.reset();
    auto t0 = Clock::now();
    model.forward(prompt.data(), B, P, &state, out);  // logits come back to the host: synchronised
    const double prefill = seconds_since(t0);
    for (int64_t b = 0; b < B; ++b) next[size_t(b)] = argmax(logits.data() + b * V, V);
    if (r == 1) first_tokens = next;
    auto t1 = Clock::now();
    for (int64_t k = 0; k < K; ++k) {
      model.forward(next.data(), B, 1, &state, out);
      for (int64_t b = 0; b < B; ++b) next[size_t(b)] = argmax(logits.data() + b * V, V);
    }
    const double decode = seconds_since(t1);
    if (r == 0) continue;
    prefill_tps.push_back(double(B * P) / prefill);
    decode_tps.push_back(double(B * K) / decode);
    step_ms.push_back(1e3 * decode / double(K));
    std::fprintf(stderr, "round %d: prefill %.0f tok/s, decode %.1f tok/s (%.2f ms per step of %lld tokens)\n", r,
                 prefill_tps.back(), decode_tps.back(), step_ms.back(), (long long)B);
  }
  json j;
  j["backend"] = be->name();
  j["model"] = a.config_path.empty() ? "preset " + a.preset : a.config_path;
  j["config"] = {{"layers", c.num_hidden_layers}, {"hidden", c.hidden_size}, {"vocab", V},
                 {"experts", c.num_experts}, {"expert_width", c.moe_intermediate_size}};
  j["batch"] = B;
  j["prompt_tokens"] = P;
  j["decode_steps"] = K;
  j["prefill_tokens_per_s"] = stats(prefill_tps);
  j["decode_tokens_per_s"] = stats(decode_tps);
  j["decode_ms_per_step"] = stats(step_ms);
  j["peak_memory_bytes"] = be->peak_memory_bytes();
  std::fprintf(stderr, "median: prefill %.0f tok/s, decode %.1f tok/s at batch %lld (%.2f ms per step)\n",
               median(prefill_tps), median(decode_tps), (long long)B, median(step_ms));
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_decode: %s\n", e.what());
  return 1;
}
