// Serving benchmark: the inference server's engine (src/serve/completion_engine.h) under
// concurrent completions, with continuous batching against the same engine serialised
// (--batch 1 is what the server did before batching, and what a server without batching does).
//
// N completions of random prompts (P tokens, K generated, greedy, EOS banned so every one runs
// to K) are submitted at once, each waited on by its own thread as HTTP handlers do. Every round
// draws new prompts (the same ones for both modes), so no kept prompt state serves a later round.
// Reported per mode: completed tokens/s (N * K / wall seconds from submission to the last
// result), the mean time to first token, the mean batch the engine decoded, and the ratio
// batched / serial. Medians over --rounds after one warm-up round. There is no PyTorch peer for
// a serving engine; the serialised engine, run in the same process on the same model, is the
// baseline. Prints one JSON object on stdout; human-readable lines go to stderr.
//
// usage: bench_serve [--preset NAME | --config FILE] [--backend cpu|cuda] [--completions N]
//                    [--batch B] [--prefill-chunk C] [--prompt P] [--tokens K] [--rounds R] [--seed S]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "bench_common.h"
#include "model/config.h"
#include "model/model.h"
#include "serve/completion_engine.h"

using namespace zaya;
using bench::Clock;
using bench::median;
using bench::seconds_since;
using bench::stats;
using json = nlohmann::json;

namespace {

struct Args {
  std::string preset = "zaya-60m", config_path, backend = "cpu";
  int64_t N = 8, B = 8, P = 64, K = 64, prefill_chunk = 256;
  int rounds = 3;
  uint64_t seed = 1234;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app("bench_serve: completions/s of the serving engine, batched against serialised");
  app.add_option("--preset", a.preset, "Built-in model shape")->capture_default_str();
  app.add_option("--config", a.config_path, "A config.json instead of a preset (random init)");
  app.add_option("--backend", a.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--completions", a.N, "Completions submitted at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", a.B, "The engine's decoding batch (the serial baseline uses 1)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--prefill-chunk", a.prefill_chunk, "Prompt positions prefilled per engine turn")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--prompt", a.P, "Prompt tokens per completion")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--tokens", a.K, "Tokens generated per completion")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", a.rounds, "Timed rounds after one warm-up")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "Weights and prompt seed")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return a;
}

struct Round {
  double tokens_per_s = 0, first_token_s = 0, mean_batch = 0;
};

Round run_round(CompletionEngine& engine, const std::vector<CompletionJob>& jobs) {
  const EngineStats before = engine.stats();
  const auto t0 = Clock::now();
  std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
  std::vector<double> first(jobs.size(), 0.0);
  std::vector<int64_t> generated(jobs.size(), 0);
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < jobs.size(); ++i)
    waiters.emplace_back([&, i] {
      bool seen = false;
      generated[i] = int64_t(engine
                                 .wait(tickets[i],
                                       [&](const CompletionChunk& c) {
                                         if (!seen && !c.ids.empty()) {
                                           seen = true;
                                           first[i] = seconds_since(t0);
                                         }
                                         return true;
                                       })
                                 .ids.size());
    });
  for (std::thread& t : waiters) t.join();
  const double wall = seconds_since(t0);
  const EngineStats after = engine.stats();
  Round r;
  int64_t tokens = 0;
  for (int64_t g : generated) tokens += g;
  r.tokens_per_s = double(tokens) / wall;
  for (double f : first) r.first_token_s += f / double(first.size());
  const int64_t steps = after.decode_steps - before.decode_steps;
  r.mean_batch = steps > 0 ? double(after.decoded_tokens - before.decoded_tokens) / double(steps) : 0;
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  std::unique_ptr<Backend> be = make_backend(a.backend);
  ModelConfig c = a.config_path.empty() ? preset_config(a.preset) : load_config_file(a.config_path);
  c.max_position_embeddings =
      std::min<int64_t>(c.max_position_embeddings, a.P + a.K);  // the decode states' size
  Model model(c, *be);
  model.init_random(a.seed);
  be->set_weights_frozen(true);
  const int64_t V = c.vocab_size;
  // The jobs of every round, warm-up included.
  std::vector<std::vector<CompletionJob>> rounds(static_cast<size_t>(a.rounds + 1));
  uint64_t s = a.seed;
  for (std::vector<CompletionJob>& jobs : rounds) {
    jobs.resize(static_cast<size_t>(a.N));
    for (CompletionJob& j : jobs) {
      j.prompt = bench::random_token_ids(a.P, V, &s);
      j.max_tokens = a.K;
      j.sampling = SamplingParams{0.0f, 0, 1.0f};
      for (int64_t e : c.eos_token_ids) j.sampling.logit_bias.emplace_back(int32_t(e), -100.0f);
    }
  }
  std::fprintf(stderr,
               "bench_serve: %s on %s, %lld completions of %lld + %lld tokens, batch %lld vs 1, %d rounds\n",
               a.config_path.empty() ? a.preset.c_str() : a.config_path.c_str(), be->name().c_str(),
               (long long)a.N, (long long)a.P, (long long)a.K, (long long)a.B, a.rounds);

  json out;
  out["backend"] = be->name();
  out["model"] = a.config_path.empty() ? "preset " + a.preset : a.config_path;
  out["completions"] = a.N;
  out["prompt_tokens"] = a.P;
  out["generated_tokens"] = a.K;
  out["prefill_chunk"] = a.prefill_chunk;
  double medians[2] = {0, 0};
  const int64_t batches[2] = {1, a.B};
  const char* names[2] = {"serial", "batched"};
  for (int mode = 0; mode < 2; ++mode) {
    CompletionEngine engine(model, nullptr,
                            EngineOptions{size_t(a.N) + 1, 0, batches[mode], a.prefill_chunk});
    std::vector<double> tps, first, mean_batch;
    for (int r = 0; r <= a.rounds; ++r) {  // round 0 warms up
      const Round round = run_round(engine, rounds[size_t(r)]);
      if (r == 0) continue;
      tps.push_back(round.tokens_per_s);
      first.push_back(round.first_token_s);
      mean_batch.push_back(round.mean_batch);
      std::fprintf(
          stderr,
          "%s (batch %lld) round %d: %.1f tok/s, first token after %.2f s on average, mean batch %.2f\n",
          names[mode], (long long)batches[mode], r, round.tokens_per_s, round.first_token_s,
          round.mean_batch);
    }
    medians[mode] = median(tps);
    out[names[mode]] = {{"batch", batches[mode]},
                        {"tokens_per_s", stats(tps)},
                        {"mean_first_token_s", stats(first)},
                        {"mean_batch", stats(mean_batch)}};
  }
  out["batched_over_serial"] = medians[1] / medians[0];
  std::fprintf(stderr, "median: serial %.1f tok/s, batched %.1f tok/s: %.2fx\n", medians[0], medians[1],
               medians[1] / medians[0]);
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_serve: %s\n", e.what());
  return 1;
}
