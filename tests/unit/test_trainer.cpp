// The training loop end to end on a tiny model and synthetic data: the loss falls; a run
// interrupted and resumed from its checkpoint gives bit-identical per-step losses and final
// weights (balancer and optimizer state included); activation recomputation trains the same
// run bit for bit; the spike/NaN policy skips bad steps.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/small_tokenizer.h"
#include "../common/synthetic_corpus.h"
#include "ckpt/dist_checkpoint.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/shard_writer.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "eval/multiple_choice.h"
#include "model/model_io.h"
#include "test_helpers.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;
using test::read_file;

Recipe tiny_recipe(const std::string& dir) {
  Recipe r = test::synthetic_recipe(dir);
  r.seed = 7;
  r.batch.micro_batch = 4;
  r.batch.global_batch = 8;
  r.schedule.kind = "wsd";
  r.schedule.total_steps = 12;
  r.checkpoint.every = 3;
  r.checkpoint.keep = 5;
  r.eval.every = 6;
  r.eval.batches = 2;
  r.logging.plot = true;
  test::write_synthetic_corpus(r.data.train, 20000, 1);
  test::write_synthetic_corpus(r.data.val, 4000, 2);
  return r;
}

std::vector<double> losses_of(const std::string& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

TEST(Trainer, LossFallsAndArtifactsAreWritten) {
  std::string dir = test::fresh_dir("train", "basic");
  Recipe r = tiny_recipe(dir);
  r.schedule.total_steps = 40;
  r.eval.every = 20;
  TrainOptions opt;
  opt.quiet = true;
  TrainSummary s = train(r, opt);
  EXPECT_EQ(s.steps, 40);
  auto losses = losses_of(r.run_dir + "/metrics.jsonl");
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_LT(losses.back(), losses.front() - 1.0) << "first " << losses.front() << " last " << losses.back();
  EXPECT_LT(s.final_val_loss, s.unigram_baseline);
  // Every metrics record carries the documented fields.
  std::ifstream in(r.run_dir + "/metrics.jsonl");
  std::string line;
  std::getline(in, line);
  auto j = nlohmann::json::parse(line);
  for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens", "tok_per_s", "mfu", "balance"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_FALSE(j.contains("device_memory_gib")) << "the CPU backend does not track its memory";
  EXPECT_TRUE(fs::exists(r.run_dir + "/loss.svg"));
  EXPECT_TRUE(fs::exists(r.run_dir + "/recipe.toml"));
  EXPECT_TRUE(fs::exists(r.run_dir + "/model/config.json"));
  EXPECT_TRUE(fs::exists(r.run_dir + "/model/model.safetensors"));
}

TEST(Trainer, MultipleChoiceAccuracyIsMeasuredAtEveryEvaluation) {
  std::string dir = test::fresh_dir("train", "choices");
  Recipe r = tiny_recipe(dir);
  // A tokenizer for the questions: its ids must fit the model's vocabulary, which the token
  // files set, so they declare 512 ids (the tokens themselves stay below 64).
  for (const std::string& path : {r.data.train, r.data.val}) {
    TokenFile f = read_token_file(path);
    f.vocab_size = 512;
    write_token_file(path, f);
  }
  r.data.tokenizer = test::train_small_tokenizer(dir + "/tok");
  r.eval.sample_tokens = 0;
  std::ofstream(dir + "/q.jsonl")
      << "{\"context\": \"The cat sat on the\", \"choices\": [\" mat\", \" park\"], \"answer\": 0}\n"
      << "{\"context\": \"A dog ran\", \"choices\": [\" in the park\", \" south\"], \"answer\": 0}\n"
      << "{\"context\": \"Birds fly\", \"choices\": [\" south\", \" mat\", \" dog\"], \"answer\": 0}\n";
  r.eval.choices = dir + "/q.jsonl";
  r.schedule.total_steps = 6;
  r.eval.every = 3;
  TrainOptions opt;
  opt.quiet = true;
  const TrainSummary s = train(r, opt);
  std::ifstream in(r.run_dir + "/metrics.jsonl");
  std::string line;
  std::vector<double> measured;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const bool eval_step = j["step"].get<int64_t>() % 3 == 0;
    EXPECT_EQ(j.contains("choice_acc"), eval_step) << line;
    if (!eval_step) continue;
    measured.push_back(j["choice_acc"].get<double>());
    const double acc = measured.back(), norm = j["choice_acc_norm"].get<double>();
    EXPECT_NEAR(acc * 3, std::round(acc * 3), 1e-9) << "3 questions: thirds only";
    EXPECT_NEAR(norm * 3, std::round(norm * 3), 1e-9);
    EXPECT_NEAR(j["choice_acc_stderr"].get<double>(), proportion_stderr(acc, 3), 1e-12);
  }
  ASSERT_EQ(measured.size(), 2u);
  // The last evaluation scored the final weights: the exported model scores the same.
  auto be = make_cpu_backend();
  auto model = load_model(r.run_dir + "/model", *be);
  auto tok = load_tokenizer(r.data.tokenizer);
  const MultipleChoiceResult want =
      evaluate_multiple_choice(*model, *tok, load_choice_questions(r.eval.choices));
  EXPECT_DOUBLE_EQ(measured.back(), want.accuracy);
  EXPECT_DOUBLE_EQ(s.final_choice_accuracy, want.accuracy);
  EXPECT_DOUBLE_EQ(s.final_choice_accuracy_norm, want.accuracy_norm);

  // A missing file stops the run before it starts, naming the key and the file.
  r.eval.choices = dir + "/missing.jsonl";
  r.run_dir = dir + "/run2";
  try {
    train(r, opt);
    ADD_FAILURE() << "a missing eval.choices file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eval.choices: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing.jsonl"), std::string::npos) << e.what();
  }
}

TEST(Trainer, ResumeIsBitExact) {
  std::string dir = test::fresh_dir("train", "resume");
  Recipe r = tiny_recipe(dir);
  TrainOptions quiet;
  quiet.quiet = true;
  TrainSummary straight = train(r, quiet);
  auto straight_losses = losses_of(r.run_dir + "/metrics.jsonl");

  Recipe r2 = r;
  r2.run_dir = dir + "/run2";
  TrainOptions half = quiet;
  half.stop_after_steps = 6;
  TrainSummary first = train(r2, half);
  EXPECT_EQ(first.steps, 6);
  // The resumed process restores parameters, optimizer and balancer state, and the data cursor.
  TrainSummary second = train(r2, quiet);
  EXPECT_EQ(second.steps, r.schedule.total_steps);
  auto resumed_losses = losses_of(r2.run_dir + "/metrics.jsonl");
  ASSERT_EQ(resumed_losses.size(), straight_losses.size());
  for (size_t i = 0; i < straight_losses.size(); ++i)
    EXPECT_EQ(resumed_losses[i], straight_losses[i]) << "step " << i + 1;
  EXPECT_EQ(second.final_weights_hash, straight.final_weights_hash);
  // Run again once finished: nothing left to train, and the summary keeps the last logged loss
  // (it printed "nan" before).
  TrainSummary third = train(r2, quiet);
  EXPECT_EQ(third.steps, r.schedule.total_steps);
  EXPECT_EQ(third.final_train_loss, second.final_train_loss);
  EXPECT_EQ(third.final_weights_hash, straight.final_weights_hash);

  // The balancing biases moved away from their init and survived the round trip.
  auto ck = load_latest_dist_checkpoint(r2.run_dir + "/checkpoints");
  ASSERT_TRUE(ck.has_value());
  std::vector<float> biases(5);
  ck->read("model.layers.1.mlp.gate.balancing_biases", {5}, biases.data());
  EXPECT_EQ(biases[4], -1.0f);  // skip bias frozen
  bool moved = false;
  for (int e = 0; e < 4; ++e) moved |= biases[size_t(e)] != 0.0f;
  EXPECT_TRUE(moved);
}

// batch.recompute_activations changes no bit of a run (losses and final weights), and may change
// between a run and its resume.
TEST(Trainer, RecomputedActivationsTrainTheSameRun) {
  std::string dir = test::fresh_dir("train", "recompute");
  Recipe r = tiny_recipe(dir);
  TrainOptions quiet;
  quiet.quiet = true;
  const TrainSummary kept = train(r, quiet);
  const auto kept_losses = losses_of(r.run_dir + "/metrics.jsonl");

  Recipe on = r;
  on.run_dir = dir + "/recomputed";
  on.batch.recompute_activations = true;
  const TrainSummary recomputed = train(on, quiet);
  EXPECT_FALSE(kept.activation_recompute);
  EXPECT_TRUE(recomputed.activation_recompute);
  EXPECT_EQ(losses_of(on.run_dir + "/metrics.jsonl"), kept_losses);
  EXPECT_EQ(recomputed.final_weights_hash, kept.final_weights_hash);

  Recipe toggled = on;
  toggled.run_dir = dir + "/toggled";
  TrainOptions half = quiet;
  half.stop_after_steps = 6;
  train(toggled, half);  // recomputing
  toggled.batch.recompute_activations = false;
  const TrainSummary resumed = train(toggled, quiet);  // keeping every activation
  EXPECT_FALSE(resumed.activation_recompute);
  EXPECT_EQ(losses_of(toggled.run_dir + "/metrics.jsonl"), kept_losses);
  EXPECT_EQ(resumed.final_weights_hash, kept.final_weights_hash);
}

TEST(Trainer, CorruptLatestCheckpointFallsBackToThePreviousOne) {
  std::string dir = test::fresh_dir("train", "fallback");
  Recipe r = tiny_recipe(dir);
  TrainOptions opt;
  opt.quiet = true;
  opt.stop_after_steps = 6;
  train(r, opt);
  // Damage step 6; a rerun must resume from step 3.
  auto list = list_checkpoints(r.run_dir + "/checkpoints");
  ASSERT_GE(list.size(), 2u);
  ASSERT_EQ(list[0].step, 6);
  std::fstream f(list[0].dir + "/rank-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-8, std::ios::end);
  f.write("garbage!", 8);
  f.close();
  opt.stop_after_steps = 1;
  TrainSummary s = train(r, opt);
  EXPECT_EQ(s.steps, 4);
}

TEST(Trainer, BadStepsAreSkippedThenRolledBack) {
  std::string dir = test::fresh_dir("train", "spike");
  Recipe r = tiny_recipe(dir);
  r.stability.policy = "rollback";
  r.stability.max_bad_steps = 2;
  TrainOptions opt;
  opt.quiet = true;
  opt.stop_after_steps = 6;
  train(r, opt);
  // Resume with an absurd learning rate: the first update wrecks the weights, the next steps'
  // losses spike, they are skipped, and after two the run rolls back to the last checkpoint.
  r.optimizer.lr = 500;
  opt.stop_after_steps = 5;
  TrainSummary s = train(r, opt);
  std::ifstream in(r.run_dir + "/metrics.jsonl");
  std::string line;
  int bad = 0, rollbacks = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "bad_step") ++bad;
    if (j.value("event", "") == "rollback") ++rollbacks;
  }
  EXPECT_GE(bad, 1);
  EXPECT_GE(rollbacks, 1);
  EXPECT_EQ(s.steps, 11);
}

// Shards written by the data pipeline feed the trainer through the prefetching Loader; the loader
// cursor goes into checkpoints, so an interrupted run resumes bit-exactly here too.
TEST(Trainer, TrainsFromShardsAndResumesExactly) {
  std::string dir = test::fresh_dir("train", "shards");
  fs::create_directories(dir + "/data");
  Manifest m;
  m.vocab_size = 64;
  m.eos_id = 1;
  Rng rng(3);
  for (const char* split : {"train", "val"}) {
    ShardWriter w({dir + "/data", split, 4096, 0, 64});
    for (int d = 0; d < (std::string(split) == "train" ? 60 : 12); ++d) {
      std::vector<uint32_t> doc;
      uint32_t a = uint32_t(rng.next_u64() % 64);
      for (int i = 0; i < 200; ++i) doc.push_back(a = rng.uniform() < 0.9 ? (a * 5 + 3) % 64 : uint32_t(rng.next_u64() % 64));
      doc.push_back(1);
      w.add_document(doc, "synthetic");
    }
    m.splits[split] = w.finish();
  }
  write_manifest(dir + "/data", m);

  Recipe r = tiny_recipe(dir);
  r.data.train = dir + "/data";
  r.data.val = "";
  TrainOptions quiet;
  quiet.quiet = true;
  TrainSummary straight = train(r, quiet);
  EXPECT_EQ(straight.steps, r.schedule.total_steps);
  EXPECT_TRUE(std::isfinite(straight.final_val_loss));
  auto straight_losses = losses_of(r.run_dir + "/metrics.jsonl");

  r.run_dir = dir + "/run2";
  TrainOptions half = quiet;
  half.stop_after_steps = 5;
  train(r, half);
  TrainSummary resumed = train(r, quiet);
  EXPECT_EQ(losses_of(r.run_dir + "/metrics.jsonl"), straight_losses);
  EXPECT_EQ(resumed.final_weights_hash, straight.final_weights_hash);
}

// A phased curriculum from the recipe: two shard datasets, phase 1 at seq_len 16 on one of
// them, phase 2 at seq_len 32 on a mixture with a new RoPE theta and a lower LR, documents
// resetting attention and CCA state. The switch happens at the exact token budget, and a run
// stopped before the boundary resumes across it bit-exactly.
TEST(Trainer, PhasedMixtureSwitchesAtTheBudgetAndResumesExactly) {
  std::string dir = test::fresh_dir("train", "phases");
  test::write_synthetic_shard_datasets(dir);
  Recipe r = tiny_recipe(dir);
  r.data.reset_at_document_boundary = true;
  r.data.datasets = {{"a", dir + "/a"}, {"b", dir + "/b"}};
  // 8 sequences per step: phase 1 = 5 steps x 8 x 16 tokens, then phase 2 to the end.
  r.phases = {{"short", 5 * 8 * 16, 16, {{"a", 1.0}}, 0, 1.0}, {"long", 0, 32, {{"a", 1.0}, {"b", 3.0}}, 5e4, 0.5}};
  r.schedule.kind = "constant";
  r.schedule.warmup_steps = 0;
  TrainOptions quiet;
  quiet.quiet = true;
  TrainSummary straight = train(r, quiet);
  EXPECT_EQ(straight.steps, 12);
  EXPECT_EQ(straight.tokens, 5 * 8 * 16 + 7 * 8 * 32);
  std::vector<nlohmann::json> recs;
  std::ifstream in(r.run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) recs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(recs.size(), 12u);
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i]["phase"], i < 5 ? "short" : "long") << "step " << i + 1;
    EXPECT_EQ(recs[i]["seq_len"], i < 5 ? 16 : 32);
    EXPECT_NEAR(recs[i]["lr"].get<double>(), i < 5 ? 1e-2 : 5e-3, 1e-12);
  }
  // The resolved recipe in the run directory keeps the phases.
  EXPECT_EQ(parse_recipe(read_file(r.run_dir + "/recipe.toml"), "recipe.toml").phases, r.phases);

  auto straight_losses = losses_of(r.run_dir + "/metrics.jsonl");
  r.run_dir = dir + "/run2";
  TrainOptions half = quiet;
  half.stop_after_steps = 4;
  train(r, half);
  TrainSummary resumed = train(r, quiet);
  EXPECT_EQ(losses_of(r.run_dir + "/metrics.jsonl"), straight_losses);
  EXPECT_EQ(resumed.final_weights_hash, straight.final_weights_hash);

  // Documents resetting or not is a different function: the losses change.
  r.run_dir = dir + "/run3";
  r.data.reset_at_document_boundary = false;
  train(r, quiet);
  EXPECT_NE(losses_of(r.run_dir + "/metrics.jsonl"), straight_losses);
}

}  // namespace
}  // namespace zaya
