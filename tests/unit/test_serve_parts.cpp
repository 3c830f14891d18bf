// The inference server's pure pieces, without HTTP or a model: completion text (UTF-8
// hold-back, stop sequences, echoed prompt pieces), request validation, the logit adjustments
// (penalties, bias) and token log-probabilities. The server end to end is test_serve.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_utf8.h"
#include "serve/best_of.h"
#include "serve/completion_request.h"
#include "serve/completion_text.h"
#include "serve/logprobs.h"
#include "serve/sampling.h"

namespace zaya {
namespace {

using json = nlohmann::json;
// A tokenizer whose ids are fixed pieces of text, decoded as real tokenizers do: the bytes
// joined, an invalid or incomplete UTF-8 sequence shown as U+FFFD.
class PieceTokenizer final : public Tokenizer {
 public:
  explicit PieceTokenizer(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  std::vector<int32_t> encode(std::string_view, bool) const override { return {}; }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s;
    for (int32_t id : ids) s += pieces_.at(size_t(id));
    return tok::utf8_sanitize(s);
  }
  int64_t vocab_size() const override { return int64_t(pieces_.size()); }
  int32_t token_to_id(std::string_view) const override { return -1; }
  std::string id_to_token(int32_t id) const override { return pieces_.at(size_t(id)); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return -1; }

 private:
  std::vector<std::string> pieces_;
};

TEST(ServeText, AStopSequenceAcrossTokensIsHeldBackThenCut) {
  PieceTokenizer tok({"<p>", "Hel", "lo", " wor", "ld"});
  CompletionText t(&tok, {0}, {"lo w"});
  EXPECT_EQ(t.push(1).text, "He");  // "l" might start "lo w"
  auto s = t.push(2);
  EXPECT_EQ(s.text, "l");  // "lo" might too
  EXPECT_FALSE(s.stop);
  s = t.push(3);
  EXPECT_EQ(s.text, "");
  EXPECT_TRUE(s.stop);
  EXPECT_EQ(t.text(), "Hel");
  EXPECT_EQ(t.push(4).text, "");  // nothing after a stop
  EXPECT_EQ(t.finish(), "");
}

TEST(ServeText, HeldBackTextIsReleasedWhenItIsNotAStop) {
  PieceTokenizer tok({"ab", "x", "y", "q"});
  CompletionText t(&tok, {}, {"xyz"});
  EXPECT_EQ(t.push(0).text, "ab");
  EXPECT_EQ(t.push(1).text, "");
  EXPECT_EQ(t.push(2).text, "");
  EXPECT_EQ(t.push(3).text, "xyq");
  EXPECT_EQ(t.push(1).text, "");
  EXPECT_EQ(t.finish(), "x");  // the end: a partial stop is just text
  EXPECT_EQ(t.text(), "abxyqx");
}

TEST(ServeText, IncompleteUtf8WaitsForItsLastByte) {
  PieceTokenizer tok({"a", "\xE6\x97", "\xA5", "b"});
  CompletionText t(&tok, {}, {});
  EXPECT_EQ(t.push(0).text, "a");
  EXPECT_EQ(t.push(1).text, "");  // decodes as U+FFFD for now
  EXPECT_EQ(t.push(2).text, "\xE6\x97\xA5");
  EXPECT_EQ(t.push(1).text, "");
  EXPECT_EQ(t.finish(), "\xEF\xBF\xBD");  // generation ended mid-character
  EXPECT_EQ(t.text(), "a\xE6\x97\xA5\xEF\xBF\xBD");
}

TEST(ServeText, TheSeamWithTheContextKeepsItsSpacing) {
  PieceTokenizer tok({"Hello", " world", "!"});
  CompletionText t(&tok, {0}, {});
  EXPECT_EQ(t.push(1).text, " world");
  EXPECT_EQ(t.push(2).text, "!");
  CompletionText none(nullptr, {0}, {"x"});
  EXPECT_EQ(none.push(1).text, "");
  EXPECT_EQ(none.finish(), "");
}

TEST(ServeText, PromptPiecesConcatenateToTheDecodeAcrossBlocks) {
  // "\xE2\x82" + "\xAC" is the euro sign split over two ids; alone, the first is invalid.
  PieceTokenizer tok({"<p>", "Hel", "lo", " wor", "ld", "\xE2\x82", "\xAC", "!"});
  std::mt19937 rng(3);
  std::vector<int32_t> ids = {0};
  while (ids.size() < 700) {
    const int32_t id = int32_t(rng() % 8);
    ids.push_back(id);
    if (id == 5 && rng() % 4 != 0) ids.push_back(6);
  }
  const std::vector<std::string> pieces = prompt_pieces(&tok, ids);
  ASSERT_EQ(pieces.size(), ids.size());
  std::string joined;
  for (const std::string& p : pieces) joined += p;
  EXPECT_EQ(joined, tok.decode(ids, true));
  EXPECT_EQ(pieces[1], tok.decode({ids[1]}, true)) << "an ASCII piece is its own text";
  EXPECT_EQ(prompt_pieces(nullptr, ids), std::vector<std::string>(ids.size()));

  const std::vector<int32_t> context = {0, 1};
  EXPECT_EQ(alternative_token_text(&tok, context, 2), "lo");
  EXPECT_EQ(alternative_token_text(&tok, context, 8), "token_id:8");
  EXPECT_EQ(alternative_token_text(nullptr, context, 2), "token_id:2");
}

TEST(ServeRequest, DefaultsAndFields) {
  const ModelLimits limits{512, 1024};
  CompletionRequest r = parse_completion_request(json{{"prompt", {1, 2, 3}}}, limits);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].is_text);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.echo);
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_FALSE(r.sampling.adjusts_logits());
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_FALSE(r.seed);
  EXPECT_FALSE(r.stream);
  r = parse_completion_request(json::parse(R"({"prompt": "hi", "max_tokens": 5, "temperature": 0, "top_k": 3,
      "top_p": 0.5, "seed": 18446744073709551615, "stop": "\n", "stream": true, "n": 1, "model": "x",
      "user": "u", "logprobs": null, "suffix": null, "best_of": null, "echo": null})"),
                               limits);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_text);
  EXPECT_EQ(r.prompts[0].text, "hi");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.seed, std::optional<uint64_t>(18446744073709551615ull));
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.best_of, r.n);  // null: the default, n
  // best_of defaults to n, and may exceed it when not streaming.
  EXPECT_EQ(parse_completion_request(json{{"prompt", "hi"}, {"n", 4}}, limits).best_of, 4);
  r = parse_completion_request(json{{"prompt", "hi"}, {"n", 2}, {"best_of", 5}}, limits);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 5);
  // The OpenAI fields for scoring and sampling several choices.
  r = parse_completion_request(json::parse(R"({"prompt": ["a", [4, 5]], "n": 3, "best_of": 3, "logprobs": 5,
      "echo": true, "max_tokens": 0, "presence_penalty": -0.5, "frequency_penalty": 1.25,
      "logit_bias": {"7": -100, "0": 2.5}})"),
                               limits);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_TRUE(r.prompts[0].is_text);
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.best_of, 3);
  EXPECT_EQ(r.logprobs, 5);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_EQ(r.sampling.presence_penalty, -0.5f);
  EXPECT_EQ(r.sampling.frequency_penalty, 1.25f);
  std::vector<std::pair<int32_t, float>> bias = r.sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{0, 2.5f}, {7, -100.0f}}));
  // Prompt + max_tokens must fit the context, with the prompt's own length known.
  r = parse_completion_request(json{{"prompt", {1, 2, 3}}, {"max_tokens", 1021}}, limits);
  EXPECT_EQ(completion_prompt_ids(r, nullptr, limits), (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  r.max_tokens = 1022;
  EXPECT_THROW(completion_prompt_ids(r, nullptr, limits), ApiError);
  // A prompt that fills the context can only be scored (max_tokens 0), not continued.
  r = parse_completion_request(json{{"prompt", std::vector<int32_t>(1024, 1)}, {"max_tokens", 0}}, limits);
  EXPECT_EQ(completion_prompt_ids(r, nullptr, limits).at(0).size(), 1024u);
  r.max_tokens = 1;
  try {
    completion_prompt_ids(r, nullptr, limits);
    ADD_FAILURE() << "a full-context prompt with max_tokens 1 was accepted";
  } catch (const ApiError& e) {
    EXPECT_STREQ(e.what(),
                 "prompt: 1024 tokens leave no room to generate in the model's context length 1024");
  }
  r.prompts[0].ids.push_back(1);
  r.max_tokens = 0;
  EXPECT_THROW(completion_prompt_ids(r, nullptr, limits), ApiError);
}

TEST(ServeSampling, AdjustLogitsFollowsOpenAIsFormula) {
  SamplingParams p;
  EXPECT_FALSE(p.adjusts_logits());
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.logit_bias = {{0, 3.0f}, {2, -100.0f}};
  EXPECT_TRUE(p.adjusts_logits());
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f};
  adjust_logits(logits.data(), 4, p, {2, 0, 1, 3});
  // logit - frequency * count - presence * (count > 0) + bias
  EXPECT_EQ(logits, (std::vector<float>{1.0f - 1.0f - 0.25f + 3.0f, 2.0f, 3.0f - 0.5f - 0.25f - 100.0f,
                                        4.0f - 1.5f - 0.25f}));
  EXPECT_THROW(adjust_logits(logits.data(), 4, p, {}), Error);  // penalties need the counts
  p.logit_bias = {{4, 1.0f}};
  EXPECT_THROW(adjust_logits(logits.data(), 4, p, {0, 0, 0, 0}), Error);
}

TEST(ServeSampling, TokenLogprobIsALogSoftmaxWithItsBestAlternatives) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -50.0f};
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  const TokenLogprob lp = token_logprob(logits.data(), 5, 2, 3);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // a tie goes to the lower id
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 2);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  EXPECT_NEAR(lp.top[2].second, lp.logprob, 1e-7);
  EXPECT_EQ(token_logprob(logits.data(), 5, 4, 0).top.size(), 0u);
  EXPECT_NEAR(token_logprob(logits.data(), 5, 4, 0).logprob, -50.0 - std::log(z), 1e-5);
  EXPECT_EQ(token_logprob(logits.data(), 5, 0, 99).top.size(), 5u);
  EXPECT_THROW(token_logprob(logits.data(), 5, 5, 1), Error);
}

// A finished candidate with the given log-probability sum over `tokens` scored tokens; its id
// names it.
CompletionResult candidate(int32_t name, double logprob_sum, int64_t tokens) {
  CompletionResult r;
  r.ids = {name};
  r.logprob_sum = logprob_sum;
  r.scored_tokens = tokens;
  return r;
}

std::vector<int32_t> names(const std::vector<CompletionResult>& results) {
  std::vector<int32_t> out;
  for (const CompletionResult& r : results) out.push_back(r.ids.at(0));
  return out;
}

TEST(ServeBestOf, KeepsEachPromptsLikeliestPerTokenFirst) {
  // Means: 10: -1.0, 11: -0.5, 12: -2.0, 13: -0.5 (a tie with 11, which comes first);
  // 20: -3.0, 21: none (no token scored: last), 22: -0.25, 23: -4.0, 24: NaN (last too).
  std::vector<CompletionResult> all = {candidate(10, -3.0, 3), candidate(11, -2.0, 4), candidate(12, -2.0, 1),
                                       candidate(13, -1.5, 3), candidate(20, -6.0, 2), candidate(21, 0.0, 0),
                                       candidate(22, -1.0, 4), candidate(23, -4.0, 1)};
  EXPECT_DOUBLE_EQ(mean_token_logprob(all[1]), -0.5);
  EXPECT_EQ(mean_token_logprob(all[5]), -INFINITY);
  EXPECT_EQ(mean_token_logprob(candidate(24, NAN, 2)), -INFINITY);
  // The mean, not the sum: 11 (sum -2 over 4) beats 10 (sum -3 over 3) and 12 (sum -2 over 1).
  EXPECT_EQ(names(keep_best_of(all, 4, 2)), (std::vector<int32_t>{11, 13, 22, 20}));
  EXPECT_EQ(names(keep_best_of(all, 4, 4)), (std::vector<int32_t>{11, 13, 10, 12, 22, 20, 23, 21}));
  EXPECT_EQ(names(keep_best_of(all, 4, 1)), (std::vector<int32_t>{11, 22}));
  // Groups of 2: (10, 11), (12, 13), (20, 21), (22, 23).
  EXPECT_EQ(names(keep_best_of(all, 2, 1)), (std::vector<int32_t>{11, 13, 20, 22}));
  EXPECT_EQ(names(keep_best_of(all, 8, 3)), (std::vector<int32_t>{22, 11, 13}));
  // A NaN candidate ranks with the unscored ones, after every finite mean.
  std::vector<CompletionResult> with_nan = {candidate(30, NAN, 2), candidate(31, -9.0, 1),
                                            candidate(32, 0.0, 0)};
  EXPECT_EQ(names(keep_best_of(with_nan, 3, 3)), (std::vector<int32_t>{31, 30, 32}));
  // The kept results are whole: their other fields travel with them.
  all[3].text = "thirteen";
  EXPECT_EQ(keep_best_of(all, 4, 2)[1].text, "thirteen");
  EXPECT_THROW(keep_best_of(all, 3, 1), Error);  // 8 candidates are not groups of 3
  EXPECT_THROW(keep_best_of(all, 2, 3), Error);  // n > best_of
}

}  // namespace
}  // namespace zaya
