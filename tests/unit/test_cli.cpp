// End-to-end CLI tests: run build/bin/zaya as a user would and check the fixed contracts
// (score's JSON, generate's greedy stream) and that bad input exits non-zero with a clear error.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "../common/small_tokenizer.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "io/safetensors.h"
#include "model/model_io.h"
#include "test_helpers.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int status;
  std::string output;
};

CommandResult run(const std::string& args) {
  std::string cmd = std::string(ZAYA_BINARY_DIR) + "/bin/zaya " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("zaya_cli_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(Cli, ScoreWritesTheFixedContract) {
  const std::string fx = test::source_path("tests/fixtures/gqa2_sliding_identity_untied");
  const std::string out = temp_path("score.json");
  auto r = run("score --model " + fx + " --ids-file " + fx + "/ids.json --out " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(out);
  auto j = nlohmann::json::parse(f);
  auto ids = nlohmann::json::parse(std::ifstream(fx + "/ids.json"));
  const size_t B = ids.size(), T = ids[0].size();
  SafeTensorsSet exp = SafeTensorsSet::open_file(fx + "/expected.safetensors");
  float ref_loss;
  exp.read_f32("loss", &ref_loss);
  EXPECT_NEAR(j["loss"].get<double>(), ref_loss, 1e-5 * std::fabs(ref_loss));
  ASSERT_EQ(j["logits"].size(), B);
  ASSERT_EQ(j["logits"][0].size(), T);
  const size_t V = j["logits"][0][0].size();
  std::vector<float> logits, ref(B * T * V);
  for (auto& b : j["logits"])
    for (auto& t : b)
      for (auto& v : t) logits.push_back(v.get<float>());
  ASSERT_EQ(logits.size(), ref.size());
  exp.read_f32("logits", ref.data());
  EXPECT_LT(test::max_rel_err(logits.data(), ref.data(), ref.size()), 1e-5);
  const auto* ee = exp.find("experts");
  const int32_t* ref_experts = reinterpret_cast<const int32_t*>(ee->file->data(*ee->info));
  const size_t L = j["experts"].size();
  ASSERT_EQ(L * B * T, ee->info->numel());
  for (size_t l = 0; l < L; ++l)
    for (size_t b = 0; b < B; ++b)
      for (size_t t = 0; t < T; ++t)
        ASSERT_EQ(j["experts"][l][b][t].get<int32_t>(), ref_experts[(l * B + b) * T + t]);
}

TEST(Cli, ScoreGradsMatchTheTwin) {
  const std::string fx = test::source_path("tests/fixtures/bf16_mha_halflayer");
  const std::string grads = temp_path("grads.safetensors");
  auto r = run("score --model " + fx + " --ids-file " + fx + "/ids.json --out " + temp_path("s.json") + " --grads " + grads);
  ASSERT_EQ(r.status, 0) << r.output;
  SafeTensorsSet got = SafeTensorsSet::open_file(grads), ref = SafeTensorsSet::open_file(fx + "/grads.safetensors");
  EXPECT_EQ(got.names(), ref.names());
  for (const std::string& name : ref.names()) {
    const size_t n = ref.find(name)->info->numel();
    std::vector<float> a(n), b(n);
    got.read_f32(name, a.data());
    ref.read_f32(name, b.data());
    EXPECT_LT(test::max_rel_err(a.data(), b.data(), n), 1e-4) << name;
  }
}

// Greedy decoding by full forwards over the growing sequence, stopping at EOS, with OpenAI's
// penalties: a generated token's logit drops by frequency x its count + presence once seen.
// The ids as `zaya generate --ids` prints them.
std::string manual_greedy(Model& m, std::vector<int32_t> seq, int steps, float frequency, float presence) {
  std::vector<int> count(static_cast<size_t>(m.config().vocab_size), 0);
  std::string printed;
  for (int i = 0; i < steps; ++i) {
    std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
    ForwardOutputs out;
    out.logits = logits.data();
    out.last_only = true;
    m.forward(seq.data(), 1, int64_t(seq.size()), nullptr, out);
    for (size_t j = 0; j < logits.size(); ++j)
      if (count[j] > 0) logits[j] -= frequency * float(count[j]) + presence;
    int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (next == m.config().eos_token_ids[0]) break;
    printed += (i ? " " : "") + std::to_string(next);
    ++count[size_t(next)];
    seq.push_back(next);
  }
  return printed;
}

TEST(Cli, GenerateGreedyMatchesAManualDecodeLoop) {
  const std::string fx = test::source_path("tests/fixtures/tiny_gqa4_zero");
  auto r = run("generate --model " + fx + " --ids 3,9,27 --max-tokens 6 --temperature 0");
  ASSERT_EQ(r.status, 0) << r.output;
  auto be = make_cpu_backend();
  auto m = load_model(fx, *be);
  const std::string expect = manual_greedy(*m, {3, 9, 27}, 6, 0.0f, 0.0f);
  EXPECT_EQ(r.output.substr(0, expect.size()), expect) << r.output;

  // With penalties (on this model they change the output: plain greedy repeats tokens).
  r = run("generate --model " + fx +
          " --ids 3,9,27 --max-tokens 12 --temperature 0 --frequency-penalty 1.5 --presence-penalty 0.5");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string penalised = manual_greedy(*m, {3, 9, 27}, 12, 1.5f, 0.5f);
  EXPECT_NE(penalised, manual_greedy(*m, {3, 9, 27}, 12, 0.0f, 0.0f));
  EXPECT_EQ(r.output.substr(0, penalised.size()), penalised) << r.output;
  r = run("generate --model " + fx + " --ids 3,9,27 --presence-penalty 3");
  EXPECT_NE(r.status, 0) << r.output;
}

TEST(Cli, BadInputExitsNonZeroWithAClearMessage) {
  const std::string fx = test::source_path("tests/fixtures/tiny_gqa4_zero");
  const std::string ragged = temp_path("ragged.json");
  std::ofstream(ragged) << "[[1,2,3],[4,5]]";
  auto r = run("score --model " + fx + " --ids-file " + ragged + " --out " + temp_path("x.json"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("sequence 1 has 2 tokens but sequence 0 has 3"), std::string::npos) << r.output;

  r = run("generate --model " + fx + " --ids 1,x,3");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("'x' is not a token id"), std::string::npos) << r.output;

  r = run("generate --model " + fx + " --ids 1,9999");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("outside the vocabulary"), std::string::npos) << r.output;

  r = run("score --model " + fx + " --ids-file " + fx + "/ids.json --out " + temp_path("y.json") + " --backend tpu");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("unknown backend 'tpu'"), std::string::npos) << r.output;

#ifndef ZAYA_CUDA
  r = run("train --backend cuda --set run_dir=" + temp_path("gpu_run"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("built without CUDA"), std::string::npos) << r.output;
#endif

  r = run("info --model /nonexistent/dir");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("/nonexistent/dir/config.json"), std::string::npos) << r.output;
}

TEST(Cli, TokenizeMatchesHuggingFaceIds) {
  // The first golden line of a few categories, through the CLI with the Gemma-3 tokenizer
  // (each run loads the 33 MB tokenizer.json; the library test covers every golden line).
  const std::string tok = test::gemma_tokenizer_dir();
  ASSERT_TRUE(fs::exists(tok + "/tokenizer.json")) << "run scripts/setup.sh to fetch the tokenizer";
  std::ifstream golden(test::source_path("tests/fixtures/tokenizer/gemma3_golden.jsonl"));
  std::string line;
  std::set<std::string> seen;
  int checked = 0;
  while (std::getline(golden, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string cat = j["cat"].get<std::string>();
    if (cat != "prose" && cat != "cjk" && cat != "emoji" && cat != "whitespace") continue;
    if (!j.contains("text") || j.value("special", false) || !seen.insert(cat).second) continue;
    const std::string in = temp_path("text_" + std::to_string(checked) + ".txt"), out = in + ".json";
    std::ofstream(in, std::ios::binary) << j["text"].get<std::string>();
    auto r = run("tokenize --tokenizer " + tok + " --input " + in + " --out " + out);
    ASSERT_EQ(r.status, 0) << r.output;
    auto ids = nlohmann::json::parse(std::ifstream(out))["ids"];
    EXPECT_EQ(ids, j["ids"]) << j["text"];
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST(Cli, TrainExportScoreRoundTrip) {
  // Train a few steps through the CLI on synthetic data, export the checkpoint to HF layout,
  // and check the export loads with the core loader (same parameters) and scores.
  const std::string dir = temp_path("train");
  fs::create_directories(dir);
  TokenFile f;
  f.vocab_size = 64;
  f.documents = 1;
  for (int i = 0; i < 5000; ++i) f.tokens.push_back(uint32_t((i * 7 + i / 3) % 64));
  write_token_file(dir + "/train.bin", f);
  const std::string sets = " --set model.preset=zaya-tiny --set data.train=" + dir + "/train.bin --set data.val=" +
                           " --set data.tokenizer= --set data.seq_len=16 --set batch.micro_batch=2 --set batch.global_batch=4" +
                           " --set schedule.total_steps=4 --set schedule.warmup_steps=1 --set eval.every=0" +
                           " --set checkpoint.every=2 --set run_dir=" + dir + "/run";
  auto r = run("train" + sets);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("steps             4"), std::string::npos) << r.output;
  r = run("ckpt inspect " + dir + "/run/checkpoints");
  EXPECT_EQ(r.status, 0) << r.output;
  r = run("export --checkpoint " + dir + "/run/checkpoints --out " + dir + "/hf --dtype f32");
  ASSERT_EQ(r.status, 0) << r.output;
  auto be = make_cpu_backend();
  auto exported = load_model(dir + "/hf", *be);
  auto trained = load_model(dir + "/run/model", *be);
  ASSERT_EQ(exported->layout().total, trained->layout().total);
  EXPECT_TRUE(std::equal(exported->params(), exported->params() + exported->layout().total, trained->params()));
  std::ofstream(dir + "/ids.json") << "[[1,2,3,4,5,6],[7,8,9,10,11,12]]";
  r = run("score --model " + dir + "/hf --ids-file " + dir + "/ids.json --out " + dir + "/score.json");
  EXPECT_EQ(r.status, 0) << r.output;
  // An unknown recipe key is an error that names it.
  r = run("train --set optimizer.lrr=1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("optimizer.lrr"), std::string::npos) << r.output;
}

TEST(Cli, SupervisedFineTuningFromPromptCompletionRecords) {
  // As a user would: prompt/completion JSONL -> masked shards -> `zaya train RECIPE` (the recipe
  // as the first argument) -> `zaya eval` of the completions.
  const std::string dir = temp_path("sft");
  fs::create_directories(dir);
  const std::string tok = test::train_small_tokenizer(dir + "/tok");
  {
    std::ofstream out(dir + "/qa.jsonl");
    for (int i = 0; i < 200; ++i)
      out << nlohmann::json{{"prompt", i % 2 ? "The cat sat on the" : "A dog ran in the"},
                            {"completion", i % 2 ? " mat." : " park."}}
                 .dump()
          << "\n";
  }
  auto r = run("data prepare --tokenizer " + tok + " --input " + dir + "/qa.jsonl --out " + dir +
               "/shards --prompt-field prompt --completion-field completion --val-fraction 0.2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("200 prompt/completion records"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("loss mask: "), std::string::npos) << r.output;
  std::ofstream(dir + "/sft.toml")
      << "run_dir = \"" << dir << "/run\"\n[model]\npreset = \"zaya-tiny\"\n"
      << "[data]\ntrain = \"" << dir << "/shards\"\ntokenizer = \"\"\nseq_len = 16\n"
      << "[batch]\nmicro_batch = 2\nglobal_batch = 4\n"
      << "[schedule]\ntotal_steps = 3\nwarmup_steps = 1\n"
      << "[checkpoint]\nevery = 0\n[eval]\nevery = 3\nbatches = 2\nsample_tokens = 0\n";
  r = run("train " + dir + "/sft.toml");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("the loss counts completions only"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("steps             3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("unigram baseline"), std::string::npos) << r.output;  // none for shards
  r = run("eval --model " + dir + "/run/model --data " + dir + "/shards --seq-len 16");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("completions only"), std::string::npos) << r.output;
  // The records scored straight from the JSONL equal their prepared shards (every record in val).
  r = run("data prepare --tokenizer " + tok + " --input " + dir + "/qa.jsonl --out " + dir +
          "/all --prompt-field prompt --completion-field completion --val-fraction 1");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run("eval --model " + dir + "/run/model --data " + dir + "/all --seq-len 16 --out " + dir +
          "/shards.json");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run("eval --model " + dir + "/run/model --tokenizer " + tok + " --data " + dir +
          "/qa.jsonl --prompt-field prompt --completion-field completion --seq-len 16 --out " + dir +
          "/jsonl.json");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json from_shards = nlohmann::json::parse(std::ifstream(dir + "/shards.json"));
  const nlohmann::json from_jsonl = nlohmann::json::parse(std::ifstream(dir + "/jsonl.json"));
  EXPECT_EQ(from_jsonl.at("tokens"), from_shards.at("tokens"));
  // Completions only: each record's completion tokens and its EOS.
  const auto small = load_tokenizer(tok);
  const int64_t want_scored =
      100 * int64_t(small->encode(" mat.").size() + 1) + 100 * int64_t(small->encode(" park.").size() + 1);
  EXPECT_EQ(from_jsonl.at("tokens").get<int64_t>(), want_scored);
  EXPECT_DOUBLE_EQ(from_jsonl.at("loss").get<double>(), from_shards.at("loss").get<double>());
  EXPECT_EQ(from_jsonl.at("documents").get<int64_t>(), 200);
  // Each record alone (as training with document resets sees it) scores the same tokens.
  r = run("eval --model " + dir + "/run/model --data " + dir +
          "/all --seq-len 16 --reset-at-document-boundary --out " + dir + "/reset.json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("each document a fresh sequence"), std::string::npos) << r.output;
  const nlohmann::json reset = nlohmann::json::parse(std::ifstream(dir + "/reset.json"));
  EXPECT_EQ(reset.at("tokens"), from_shards.at("tokens"));
  EXPECT_NE(reset.at("loss").get<double>(), from_shards.at("loss").get<double>());
  EXPECT_EQ(reset.at("reset_at_document_boundary"), true);
  // The JSONL records with resets score as their shards do (the text path's document starts).
  r = run("eval --model " + dir + "/run/model --tokenizer " + tok + " --data " + dir +
          "/qa.jsonl --prompt-field prompt --completion-field completion --seq-len 16 "
          "--reset-at-document-boundary"
          " --out " +
          dir + "/reset_jsonl.json");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json reset_jsonl = nlohmann::json::parse(std::ifstream(dir + "/reset_jsonl.json"));
  EXPECT_EQ(reset_jsonl.at("tokens"), reset.at("tokens"));
  EXPECT_DOUBLE_EQ(reset_jsonl.at("loss").get<double>(), reset.at("loss").get<double>());
  // A flat token file records no document boundaries: refused, saying why.
  TokenFile flat;
  flat.vocab_size = 320;
  flat.documents = 1;
  for (int i = 0; i < 100; ++i) flat.tokens.push_back(uint32_t(i % 300));
  write_token_file(dir + "/flat.bin", flat);
  r = run("eval --model " + dir + "/run/model --data " + dir +
          "/flat.bin --seq-len 16 --reset-at-document-boundary");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("needs document boundaries"), std::string::npos) << r.output;
  // The recipe once as an argument and once with --recipe is refused (two values for one option).
  r = run("train " + dir + "/sft.toml --recipe " + dir + "/sft.toml");
  EXPECT_NE(r.status, 0) << r.output;
}

TEST(Cli, SupervisedFineTuningOfChats) {
  // As a user would: chat JSONL (OpenAI message lists) -> shards rendered by a chat template ->
  // `zaya train` -> `zaya eval` of the replies, from the shards and from the JSONL alike.
  const std::string dir = temp_path("sft_chat");
  fs::create_directories(dir);
  const std::string tok = test::train_small_tokenizer(dir + "/tok");
  {
    std::ofstream out(dir + "/chats.jsonl");
    for (int i = 0; i < 100; ++i)
      out << nlohmann::json{{"messages",
                             {{{"role", "user"},
                               {"content", i % 2 ? "The cat sat on the" : "A dog ran in the"}},
                              {{"role", "assistant"}, {"content", i % 2 ? "mat." : "park."}}}}}
                 .dump()
          << "\n";
  }
  const std::string chat_options = " --messages-field messages --chat-template plain";
  auto r = run("data prepare --tokenizer " + tok + " --input " + dir + "/chats.jsonl --out " + dir +
               "/shards --val-fraction 1" + chat_options);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("100 chat records (0 with no reply skipped)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("are reply targets"), std::string::npos) << r.output;
  r = run("data prepare --tokenizer " + tok + " --input " + dir + "/chats.jsonl --out " + dir +
          "/train --val-fraction 0" + chat_options);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ofstream(dir + "/sft.toml") << "run_dir = \"" << dir << "/run\"\n[model]\npreset = \"zaya-tiny\"\n"
                                   << "[data]\ntrain = \"" << dir
                                   << "/train\"\ntokenizer = \"\"\nseq_len = 16\n"
                                   << "[batch]\nmicro_batch = 2\nglobal_batch = 4\n"
                                   << "[schedule]\ntotal_steps = 2\nwarmup_steps = 1\n"
                                   << "[checkpoint]\nevery = 0\n[eval]\nevery = 0\nsample_tokens = 0\n";
  r = run("train " + dir + "/sft.toml");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(
      r.output.find("fine-tuning of chats (template plain): the loss counts the assistant's replies only"),
      std::string::npos)
      << r.output;
  r = run("eval --model " + dir + "/run/model --data " + dir + "/shards --seq-len 16 --out " + dir +
          "/shards.json");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run("eval --model " + dir + "/run/model --tokenizer " + tok + " --data " + dir +
          "/chats.jsonl --seq-len 16 --out " + dir + "/jsonl.json" + chat_options);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("chat records, template plain"), std::string::npos) << r.output;
  const nlohmann::json from_shards = nlohmann::json::parse(std::ifstream(dir + "/shards.json"));
  const nlohmann::json from_jsonl = nlohmann::json::parse(std::ifstream(dir + "/jsonl.json"));
  // The replies only: each reply's tokens and the EOS that ends it.
  const auto small = load_tokenizer(tok);
  const int64_t want_scored =
      50 * int64_t(small->encode("mat.").size() + 1) + 50 * int64_t(small->encode("park.").size() + 1);
  EXPECT_EQ(from_jsonl.at("tokens").get<int64_t>(), want_scored);
  EXPECT_EQ(from_shards.at("tokens").get<int64_t>(), want_scored);
  EXPECT_DOUBLE_EQ(from_jsonl.at("loss").get<double>(), from_shards.at("loss").get<double>());
  // A template the tokenizer cannot carry, and a template that is neither built in nor a file.
  r = run("data prepare --tokenizer " + tok + " --input " + dir + "/chats.jsonl --out " + dir +
          "/bad --messages-field messages --chat-template chatml");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("is not one token of this tokenizer"), std::string::npos) << r.output;
  // `zaya chat`: stdin lines are user messages, each turn's prompt the conversation so far
  // (ChatSession's own test checks that a turn prefills only its new message).
  std::ofstream(dir + "/lines.txt") << "The cat sat on the\nA dog ran in the\n/reset\nThe cat sat on the\n";
  r = run("chat --model " + dir + "/run/model --tokenizer " + tok +
          " --chat-template plain --temperature 0 --max-tokens 4 < " + dir + "/lines.txt");
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<std::pair<int64_t, int64_t>> turns;  // (prompt tokens, prefilled) per turn
  for (size_t at = r.output.find("[zaya] "); at != std::string::npos; at = r.output.find("[zaya] ", at + 1)) {
    long long prompt = 0, prefilled = 0;
    if (std::sscanf(r.output.c_str() + at, "[zaya] %lld prompt tokens (%lld prefilled", &prompt,
                    &prefilled) == 2)
      turns.emplace_back(prompt, prefilled);
  }
  ASSERT_EQ(turns.size(), 3u) << r.output;
  EXPECT_EQ(turns[0].first, turns[0].second);             // the first turn runs its whole prompt
  EXPECT_GT(turns[1].first, turns[0].first) << r.output;  // the conversation so far, and more
  EXPECT_EQ(r.output.find("> "), std::string::npos) << r.output;  // no prompt for piped input
  EXPECT_EQ(turns[2], turns[0]) << r.output;  // after /reset, the first turn again
  EXPECT_NE(r.output.find("the conversation starts over"), std::string::npos) << r.output;
  // A turn that does not fit the context is reported and the chat goes on (exit status 1 at the
  // end); unknown commands are not sent to the model.
  std::ofstream(dir + "/long.txt")
      << "The cat sat on the mat and a dog ran in the park\n/help\n/reset\ncat\n";
  r = run("chat --model " + dir + "/run/model --tokenizer " + tok +
          " --chat-template plain --temperature 0 --max-tokens 2 --context 24 < " + dir + "/long.txt");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("[zaya] error: chat: the conversation ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("leaves no room for a reply in the context of 24 positions"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("unknown command /help"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("prefilled"), std::string::npos) << r.output;  // "cat" still got its turn
  r = run("serve --model " + dir + "/run/model --tokenizer " + tok + " --port 0 --chat-template nonesuch");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("'nonesuch' is neither a built-in chat template"), std::string::npos) << r.output;
}

TEST(Cli, InitThenInfoShowsParameterCounts) {
  const std::string dir = temp_path("init");
  auto r = run("init --preset zaya-tiny --out " + dir + " --seed 3");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run("info --model " + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("active/token"), std::string::npos) << r.output;
  r = run("info --preset zaya1-base");
  EXPECT_NE(r.output.find("8.84B"), std::string::npos) << r.output;
  // Training state: weights + gradients + one Muon momentum (most tensors) or two AdamW moments,
  // so between 3 and 4 times the f32 weights.
  auto gib_after = [&](const std::string& key) {
    const size_t at = r.output.find(key);
    return at == std::string::npos ? -1.0 : std::stod(r.output.substr(at + key.size()));
  };
  const double weights = gib_after("f32 "), state = gib_after("training state   ");
  ASSERT_GT(weights, 30.0) << r.output;
  EXPECT_GT(state, 3.0 * weights) << r.output;
  EXPECT_LT(state, 4.0 * weights) << r.output;
}

}  // namespace
}  // namespace zaya
