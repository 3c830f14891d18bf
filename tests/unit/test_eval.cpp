// `zaya eval`'s library (src/eval/): windowed perplexity against log-softmax over full logits,
// the token streams read from token files, text and shard directories, multiple-choice scores
// against the same log-softmax, and the CLI end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/small_tokenizer.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "eval/eval_data.h"
#include "eval/multiple_choice.h"
#include "eval/perplexity.h"
#include "model/config.h"
#include "model/model.h"
#include "model/model_io.h"
#include "test_helpers.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;

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
  const std::string dir = test::fresh_dir("eval", "bin");
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
  const std::string gemma = test::gemma_tokenizer_dir() + "/tokenizer.json";
  ASSERT_TRUE(fs::exists(gemma)) << "run scripts/setup.sh (it fetches the Gemma-3 tokenizer)";
  auto tok = load_tokenizer(gemma);
  const std::string dir = test::fresh_dir("eval", "text");
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
  const std::string dir = test::fresh_dir("eval", "nomanifest");
  try {
    load_eval_tokens({dir}, nullptr, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without manifest.json"), std::string::npos) << e.what();
  }
}

// One id per byte (id = byte + 3) after BOS 1; EOS 2. Context + choice encodes to the two
// encodings joined, so a choice's continuation is exactly its bytes.
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int32_t bos = 1, int32_t eos = 2) : bos_(bos), eos_(eos) {}
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<int32_t> ids;
    if (add_special && bos_ >= 0) ids.push_back(bos_);
    for (unsigned char c : text) ids.push_back(int32_t(c) + 3);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s;
    for (int32_t id : ids)
      if (id >= 3) s += char(id - 3);
    return s;
  }
  int64_t vocab_size() const override { return 259; }
  int32_t token_to_id(std::string_view) const override { return -1; }
  std::string id_to_token(int32_t id) const override { return std::to_string(id); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }

 private:
  int32_t bos_, eos_;
};

std::vector<int32_t> byte_ids(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(int32_t(c) + 3);
  return ids;
}

// sum of log p(ids[t + 1] | ids[.. t]) for t + 1 >= from, from full logits of ids run alone.
double reference_continuation_logprob(Model& m, const std::vector<int32_t>& ids, int64_t from) {
  const int64_t V = m.config().vocab_size, T = int64_t(ids.size()) - 1;
  std::vector<float> logits(static_cast<size_t>(T * V));
  ForwardOutputs out;
  out.logits = logits.data();
  m.forward(ids.data(), 1, T, nullptr, out);
  double sum = 0;
  for (int64_t t = from - 1; t < T; ++t) {
    const float* row = &logits[size_t(t * V)];
    double mx = row[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
    sum += double(row[ids[size_t(t + 1)]]) - mx - std::log(z);
  }
  return sum;
}

TEST(EvalChoices, ContextWhitespaceMovesToTheChoice) {
  const ByteTokenizer tok;
  ChoiceTokens t = tokenize_choice(tok, "The sky is ", "blue");
  std::vector<int32_t> want = {1};
  for (int32_t id : byte_ids("The sky is blue")) want.push_back(id);
  EXPECT_EQ(t.ids, want);
  EXPECT_EQ(t.context_tokens, 11);  // BOS + "The sky is"
  EXPECT_EQ(t.choice_bytes, 5);     // " blue"
  t = tokenize_choice(tok, "", "abc");
  EXPECT_EQ(t.ids, (std::vector<int32_t>{1, 'a' + 3, 'b' + 3, 'c' + 3}));
  EXPECT_EQ(t.context_tokens, 1);
  // Without BOS an empty context starts from EOS; with neither it is an error, as is a choice
  // that adds nothing.
  EXPECT_EQ(tokenize_choice(ByteTokenizer(-1, 2), "", "a").ids, (std::vector<int32_t>{2, 'a' + 3}));
  EXPECT_THROW(tokenize_choice(ByteTokenizer(-1, -1), "", "a"), Error);
  EXPECT_THROW(tokenize_choice(tok, "context", ""), Error);
}

TEST_F(EvalPerplexity, MultipleChoiceScoresAreContinuationLogLikelihoods) {
  const ByteTokenizer tok;
  const int64_t window = model_->config().max_position_embeddings;
  std::vector<ChoiceQuestion> questions = {
      {"The capital of France is ", {"Paris", "Rome", "a very long answer indeed"}, 0},
      {"Two plus two", {" equals four", " is five"}, 1},
      {"", {"x", "yz", "abc", "q"}, 3},
      // Longer than the model's context: only the context's last tokens are kept.
      {std::string(size_t(window) + 40, 'a') + " then", {" b", " c"}, 0},
  };
  const MultipleChoiceResult r = evaluate_multiple_choice(*model_, tok, questions);
  ASSERT_EQ(r.questions, 4);
  EXPECT_EQ(r.choices, 11);
  EXPECT_EQ(r.truncated, 2);
  int64_t correct = 0, correct_norm = 0;
  for (size_t qi = 0; qi < questions.size(); ++qi) {
    const ChoiceQuestion& q = questions[qi];
    const QuestionResult& got = r.per_question[qi];
    ASSERT_EQ(got.choices.size(), q.choices.size());
    int64_t best = 0, best_norm = 0;
    std::vector<double> want(q.choices.size());
    for (size_t ci = 0; ci < q.choices.size(); ++ci) {
      const ChoiceTokens t = tokenize_choice(tok, q.context, q.choices[ci]);
      const int64_t first = std::max<int64_t>(0, int64_t(t.ids.size()) - 1 - window);
      const std::vector<int32_t> kept(t.ids.begin() + first, t.ids.end());
      want[ci] = reference_continuation_logprob(*model_, kept, t.context_tokens - first);
      EXPECT_NEAR(got.choices[ci].logprob, want[ci], 1e-4 * std::fabs(want[ci])) << qi << "/" << ci;
      EXPECT_EQ(got.choices[ci].tokens, int64_t(t.ids.size()) - t.context_tokens);
      EXPECT_EQ(got.choices[ci].bytes, t.choice_bytes);
      if (want[ci] > want[size_t(best)]) best = int64_t(ci);
      if (want[ci] / double(t.choice_bytes) >
          want[size_t(best_norm)] / double(got.choices[size_t(best_norm)].bytes))
        best_norm = int64_t(ci);
    }
    EXPECT_EQ(got.predicted, best) << qi;
    EXPECT_EQ(got.predicted_norm, best_norm) << qi;
    correct += best == q.answer;
    correct_norm += best_norm == q.answer;
  }
  EXPECT_EQ(r.correct, correct);
  EXPECT_EQ(r.correct_norm, correct_norm);
  EXPECT_DOUBLE_EQ(r.accuracy, double(correct) / 4);
  EXPECT_NEAR(r.accuracy_stderr, std::sqrt(r.accuracy * (1 - r.accuracy) / 3), 1e-12);
  // The answer decides what counts as right: point every answer at the prediction.
  for (size_t qi = 0; qi < questions.size(); ++qi) questions[qi].answer = r.per_question[qi].predicted;
  EXPECT_EQ(evaluate_multiple_choice(*model_, tok, questions).correct, 4);
  MultipleChoiceOptions two;
  two.max_questions = 2;
  EXPECT_EQ(evaluate_multiple_choice(*model_, tok, questions, two).questions, 2);
}

TEST_F(EvalPerplexity, MultipleChoiceShardsScoreEveryQuestionOnce) {
  // Data-parallel evaluation (the trainer's [eval] choices): shard s of 3 scores questions s,
  // s + 3, ...; each scores as in the whole run, and the shards' counts add up to the whole's.
  const ByteTokenizer tok;
  std::vector<ChoiceQuestion> questions;
  for (int i = 0; i < 7; ++i)
    questions.push_back({"question " + std::to_string(i) + ":", {" a", " bb", " ccc", " d"}, i % 4});
  const MultipleChoiceResult whole = evaluate_multiple_choice(*model_, tok, questions);
  ASSERT_EQ(whole.questions, 7);
  int64_t scored = 0, choices = 0, correct = 0, correct_norm = 0;
  for (int64_t shard = 0; shard < 3; ++shard) {
    MultipleChoiceOptions o;
    o.shard = shard;
    o.shards = 3;
    const MultipleChoiceResult part = evaluate_multiple_choice(*model_, tok, questions, o);
    ASSERT_EQ(part.questions, shard == 0 ? 3 : 2) << shard;
    ASSERT_EQ(part.per_question.size(), size_t(part.questions));
    for (int64_t k = 0; k < part.questions; ++k) {
      const QuestionResult& got = part.per_question[size_t(k)];
      const QuestionResult& want = whole.per_question[size_t(shard + 3 * k)];
      EXPECT_EQ(got.predicted, want.predicted) << shard << "/" << k;
      EXPECT_EQ(got.predicted_norm, want.predicted_norm) << shard << "/" << k;
      ASSERT_EQ(got.choices.size(), want.choices.size());
      for (size_t c = 0; c < got.choices.size(); ++c)
        EXPECT_DOUBLE_EQ(got.choices[c].logprob, want.choices[c].logprob) << shard << "/" << k << "/" << c;
    }
    scored += part.questions;
    choices += part.choices;
    correct += part.correct;
    correct_norm += part.correct_norm;
  }
  EXPECT_EQ(scored, whole.questions);
  EXPECT_EQ(choices, whole.choices);
  EXPECT_EQ(correct, whole.correct);
  EXPECT_EQ(correct_norm, whole.correct_norm);
  MultipleChoiceOptions missing;
  missing.shard = 3;
  missing.shards = 3;
  EXPECT_THROW(evaluate_multiple_choice(*model_, tok, questions, missing), Error);
}

TEST(EvalChoices, BadFilesAreErrorsNamingTheLineAndField) {
  const std::string dir = test::fresh_dir("eval", "choices");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"answer\": 0}\n\n[1]",
       ":3: expected a JSON object"},
      {"{\"context\": \"a\", \"choices\": [\"b\", \"c\"]", ":1: not JSON"},
      {"{\"choices\": [\"b\", \"c\"], \"answer\": 0}", ":1: no \"context\" field (--context-field names"},
      {"{\"context\": 5, \"choices\": [\"b\", \"c\"], \"answer\": 0}", ":1: \"context\": expected a string"},
      {"{\"context\": \"a\", \"choices\": [\"b\"], \"answer\": 0}",
       "\"choices\": expected an array of at least 2"},
      {"{\"context\": \"a\", \"choices\": [\"b\", 3], \"answer\": 0}",
       "\"choices\"[1]: expected a string, got 3"},
      {"{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"answer\": 2}",
       "\"answer\": expected the index of the right choice, an integer in [0, 2), got 2"},
      {"{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"answer\": \"b\"}", "got \"b\""},
      {"\n \n", "holds no questions"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir + "/q" + std::to_string(i) + ".jsonl";
    std::ofstream(path) << cases[i].first;
    try {
      load_choice_questions(path);
      ADD_FAILURE() << "accepted: " << cases[i].first;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find(cases[i].second), std::string::npos) << what << "\n  want: " << cases[i].second;
    }
  }
  // Renamed fields.
  const std::string path = dir + "/renamed.jsonl";
  std::ofstream(path) << "{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 1}\n";
  const std::vector<ChoiceQuestion> q = load_choice_questions(path, ChoiceFields{"ctx", "endings", "label"});
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].context, "a");
  EXPECT_EQ(q[0].choices, (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(q[0].answer, 1);
}

TEST(EvalCli, ScoresATokenFileAndWritesJson) {
  // The CLI's loss equals the library's on the same model and data.
  const std::string dir = test::fresh_dir("eval", "cli");
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

TEST(EvalCli, MultipleChoiceWritesTheLibrarysScores) {
  const std::string dir = test::fresh_dir("eval", "cli_choices");
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(5);
  save_model(m, dir + "/model", DType::F32);
  test::train_small_tokenizer(dir + "/model/tokenizer");
  std::ofstream(dir + "/q.jsonl")
      << "{\"context\": \"The cat sat on the\", \"choices\": [\" mat\", \" park\"], \"answer\": 0}\n"
      << "{\"context\": \"A dog ran in the \", \"choices\": [\"mat\", \"park\", \"south\"], \"answer\": 1}\n";
  const std::string cmd = std::string(ZAYA_BINARY_DIR) + "/bin/zaya eval --model " + dir +
                          "/model --choices " + dir + "/q.jsonl --out " + dir + "/out.json > " + dir +
                          "/log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/out.json"));
  auto tok = load_tokenizer(dir + "/model/tokenizer.model");
  const MultipleChoiceResult want =
      evaluate_multiple_choice(m, *tok, load_choice_questions(dir + "/q.jsonl"));
  EXPECT_EQ(j.at("questions"), 2);
  EXPECT_EQ(j.at("choices"), 5);
  EXPECT_DOUBLE_EQ(j.at("accuracy").get<double>(), want.accuracy);
  EXPECT_DOUBLE_EQ(j.at("accuracy_norm").get<double>(), want.accuracy_norm);
  ASSERT_EQ(j.at("predictions").size(), 2u);
  for (size_t q = 0; q < 2; ++q) {
    EXPECT_EQ(j["predictions"][q].at("predicted"), want.per_question[q].predicted);
    for (size_t c = 0; c < want.per_question[q].choices.size(); ++c)
      EXPECT_NEAR(j["predictions"][q]["logprobs"][c].get<double>(), want.per_question[q].choices[c].logprob,
                  1e-6);
  }
  // --data and --choices together, or neither, is refused.
  const std::string both = std::string(ZAYA_BINARY_DIR) + "/bin/zaya eval --model " + dir +
                           "/model --choices " + dir + "/q.jsonl --data x.bin > " + dir + "/log2 2>&1";
  EXPECT_NE(std::system(both.c_str()), 0);
  const std::string neither =
      std::string(ZAYA_BINARY_DIR) + "/bin/zaya eval --model " + dir + "/model > " + dir + "/log3 2>&1";
  EXPECT_NE(std::system(neither.c_str()), 0);
  std::ifstream log3(dir + "/log3");
  const std::string text((std::istreambuf_iterator<char>(log3)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("give --data (held-out loss and perplexity) or --choices"), std::string::npos) << text;
}

}  // namespace
}  // namespace zaya
