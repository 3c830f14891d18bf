// The HTTP server's choices, scoring and sampling controls, on the fixture of
// serve_http_fixture.h: logprobs (whole and streamed) against the model's log-softmax, echo
// scoring a prompt, batched prompts with n choices, best_of's ranking, and the penalties and
// logit bias.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "serve/sampling.h"
#include "serve_http_fixture.h"

namespace zaya {
namespace {

using namespace serve_test;

TEST_F(ServeHttp, LogprobsAreTheModelsLogSoftmaxWholeAndStreamed) {
  const std::string prompt = "The quick brown fox";
  // A hot temperature, so that the chosen tokens are mostly not the likeliest: the reported
  // logprob must be the chosen token's, not the top one's.
  json body = {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 1.5}, {"seed", 4}, {"logprobs", 3}};
  Reply r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choice = r.body["choices"][0];
  const std::vector<int32_t> generated = ids_of(choice);
  ASSERT_EQ(generated.size(), 12u) << choice;
  std::vector<int32_t> all = tok_->encode(prompt, true);
  const int64_t n = int64_t(all.size());
  all.insert(all.end(), generated.begin(), generated.end());
  EXPECT_GE(check_logprobs(choice, generated, n - 1, reference_log_softmax(all), 3), 6);
  // Streamed, each token's chunk carries the same logprob; the text still concatenates.
  Streamed st = stream(body);
  EXPECT_EQ(st.ids, generated);
  EXPECT_EQ(st.text, choice["text"]);
  EXPECT_EQ(st.token_logprobs, choice["logprobs"]["token_logprobs"]);
  // logprobs 0: the chosen tokens' logprobs with no alternatives.
  body["logprobs"] = 0;
  Reply z = post("/v1/completions", body);
  ASSERT_EQ(z.status, 200) << z.raw;
  EXPECT_EQ(z.body["choices"][0]["logprobs"]["token_logprobs"], choice["logprobs"]["token_logprobs"]);
  for (const json& top : z.body["choices"][0]["logprobs"]["top_logprobs"]) EXPECT_EQ(top, json::object());
  // Without logprobs the field is null, as OpenAI's.
  body.erase("logprobs");
  EXPECT_TRUE(post("/v1/completions", body).body["choices"][0].at("logprobs").is_null());
}

TEST_F(ServeHttp, EchoWithLogprobsScoresThePrompt) {
  // Longer than two prefill chunks of logits, so the scores cross chunk boundaries.
  std::string text;
  while (int64_t(tok_->encode(text, true).size()) < 2 * kPromptLogitsChunk + 20)
    text += "Mixture of experts models route each token to a few experts. ";
  const std::vector<int32_t> prompt = tok_->encode(text, true);
  const auto rows = reference_log_softmax(prompt);
  Reply r =
      post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 2}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choice = r.body["choices"][0];
  EXPECT_EQ(choice["text"], tok_->decode(prompt, true));
  EXPECT_EQ(choice["token_ids"], json::array());
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 0);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], prompt.size());
  check_logprobs(choice, prompt, -1, rows, 2);

  // The request lm-evaluation-harness sends to score continuations: a batch of id prompts,
  // echo, logprobs 1, one greedy token. Each choice scores its own prompt, then adds the token.
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 20);
  json batch = {
      {"prompt", {head, kPrompt}}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}, {"temperature", 0}};
  Reply b = post("/v1/completions", batch);
  ASSERT_EQ(b.status, 200) << b.raw;
  ASSERT_EQ(b.body["choices"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<int32_t>& p = i == 0 ? head : kPrompt;
    const json& c = b.body["choices"][i];
    EXPECT_EQ(c["index"], i);
    const std::vector<int32_t> next = reference(p, 1, {0.0f, 0, 1.0f}, 0);
    ASSERT_EQ(next.size(), 1u);
    EXPECT_EQ(ids_of(c), next);
    std::vector<int32_t> all = p;
    all.push_back(next[0]);
    // The greedy token is its row's likeliest: no token is "not the likeliest" but prompt ones.
    check_logprobs(c, all, -1, reference_log_softmax(all), 1);
    const std::string head_text = tok_->decode(p, true);
    EXPECT_EQ(c["text"].get<std::string>().compare(0, head_text.size(), head_text), 0) << c["text"];
  }
  // Streamed, the echo arrives first, as one chunk with the prompt's text and no ids.
  json one = {{"prompt", kPrompt}, {"max_tokens", 3}, {"echo", true}, {"temperature", 0}, {"stream", true}};
  Reply s = post("/v1/completions", one);
  ASSERT_EQ(s.status, 200) << s.raw;
  const json first = json::parse(sse_data(s.raw).at(0));
  EXPECT_EQ(first["choices"][0]["text"], tok_->decode(kPrompt, true));
  EXPECT_EQ(first["choices"][0]["token_ids"], json::array());
  one.erase("stream");
  EXPECT_EQ(stream(one).text, post("/v1/completions", one).body["choices"][0]["text"]);
}

TEST_F(ServeHttp, BatchedPromptsAndNGiveOneChoiceEach) {
  const std::string text = "Mixture of experts";
  const std::vector<std::vector<int32_t>> prompts = {tok_->encode(text, true), kPrompt};
  const SamplingParams sp{0.9f, 0, 1.0f};
  json body = {{"prompt", {text, kPrompt}}, {"n", 2}, {"max_tokens", 8}, {"temperature", 0.9}, {"seed", 5}};
  Reply r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 4u);
  int64_t completion_tokens = 0;
  std::map<int64_t, std::vector<int32_t>> expected;
  for (size_t i = 0; i < 2; ++i)
    for (size_t j = 0; j < 2; ++j) {
      const json& c = r.body["choices"][i * 2 + j];
      EXPECT_EQ(c["index"], i * 2 + j);
      // Choice j of a prompt samples with seed + j.
      expected[int64_t(i * 2 + j)] = reference(prompts[i], 8, sp, 5 + j);
      EXPECT_EQ(ids_of(c), expected[int64_t(i * 2 + j)]) << "prompt " << i << " sample " << j;
      completion_tokens += int64_t(ids_of(c).size());
    }
  EXPECT_NE(ids_of(r.body["choices"][0]), ids_of(r.body["choices"][1]));
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], prompts[0].size() + prompts[1].size());
  EXPECT_EQ(r.body["usage"]["completion_tokens"], completion_tokens);

  // Streamed: each event names its choice; each choice ends with its own finish_reason, and
  // only the request's last chunk carries the usage.
  body["stream"] = true;
  Reply s = post("/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  std::vector<std::string> events = sse_data(s.raw);
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::map<int64_t, std::vector<int32_t>> streamed;
  std::map<int64_t, std::string> texts;
  std::map<int64_t, int> finishes;
  for (size_t e = 0; e + 1 < events.size(); ++e) {
    const json chunk = json::parse(events[e]);
    const json& c = chunk["choices"].at(0);
    const int64_t index = c["index"];
    for (int32_t id : ids_of(c)) streamed[index].push_back(id);
    texts[index] += c["text"].get<std::string>();
    finishes[index] += !c["finish_reason"].is_null();
    EXPECT_EQ(chunk.contains("usage"), e + 2 == events.size()) << events[e];
    if (chunk.contains("usage")) {
      EXPECT_EQ(chunk["usage"], r.body["usage"]);
    }
  }
  EXPECT_EQ(streamed, expected);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(finishes[i], 1) << "choice " << i;
    EXPECT_EQ(texts[i], r.body["choices"][size_t(i)]["text"]) << "choice " << i;
  }
}

TEST_F(ServeHttp, BestOfReturnsTheCandidatesLikeliestPerToken) {
  // Candidate j samples with seed + j; the n kept are those whose sampled tokens (an EOS that
  // ended one included) have the highest mean log-probability under the model, best first.
  const int64_t n = 2, best_of = 5, max_tokens = 8;
  const int64_t P = int64_t(kPrompt.size());
  const int32_t eos = int32_t(ref_->config().eos_token_ids.at(0));
  // A bias towards EOS, so that some candidates end early: the bias steers the sampler only, and
  // the EOS is scored by the model's own log-probability.
  SamplingParams sp{1.5f, 0, 1.0f};
  sp.logit_bias = {{eos, 4.0f}};
  // The first seed whose best two are not simply candidates 0 and 1 (what n = 2 alone returns)
  // and where a candidate ends with an EOS.
  uint64_t seed = 0;
  std::vector<std::vector<int32_t>> candidates;
  std::vector<size_t> order;
  int64_t all_tokens = 0;
  for (uint64_t s = 20; s < 40 && seed == 0; ++s) {
    candidates.clear();
    std::vector<double> mean;
    all_tokens = 0;
    bool ended_by_eos = false;
    for (int64_t j = 0; j < best_of; ++j) {
      candidates.push_back(reference(kPrompt, max_tokens, sp, s + uint64_t(j)));
      const std::vector<int32_t>& ids = candidates.back();
      std::vector<int32_t> all = kPrompt;
      all.insert(all.end(), ids.begin(), ids.end());
      const std::vector<std::vector<double>> rows = reference_log_softmax(all);
      double sum = 0;
      for (size_t k = 0; k < ids.size(); ++k) sum += rows[size_t(P - 1) + k][size_t(ids[k])];
      int64_t scored = int64_t(ids.size());
      if (scored < max_tokens) {  // it ended with an EOS, which counts
        sum += rows.back()[size_t(eos)];
        ++scored;
        ended_by_eos = true;
      }
      mean.push_back(sum / double(scored));
      all_tokens += int64_t(ids.size());
    }
    order.assign(size_t(best_of), 0);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return mean[a] > mean[b]; });
    if (!(order[0] == 0 && order[1] == 1) && ended_by_eos) seed = s;
  }
  ASSERT_NE(seed, 0u) << "no seed in [20, 40) makes best_of differ from n with a candidate ending in EOS";
  json body = {{"prompt", kPrompt},  {"n", n},
               {"best_of", best_of}, {"max_tokens", max_tokens},
               {"temperature", 1.5}, {"seed", seed},
               {"logprobs", 1},      {"logit_bias", {{std::to_string(eos), 4.0}}}};
  Reply r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), size_t(n));
  for (int64_t k = 0; k < n; ++k) {
    const json& c = r.body["choices"][size_t(k)];
    EXPECT_EQ(c["index"], k);
    EXPECT_EQ(ids_of(c), candidates[order[size_t(k)]])
        << "choice " << k << " should be candidate " << order[size_t(k)];
    // Its logprobs are its own tokens', as without best_of.
    std::vector<int32_t> all = kPrompt;
    all.insert(all.end(), candidates[order[size_t(k)]].begin(), candidates[order[size_t(k)]].end());
    check_logprobs(c, candidates[order[size_t(k)]], P - 1, reference_log_softmax(all), 1);
  }
  // Every candidate's tokens were generated, and count.
  EXPECT_EQ(r.body["usage"]["completion_tokens"], all_tokens);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], P);
}

TEST_F(ServeHttp, PenaltiesAndLogitBiasChangeWhatIsSampled) {
  const SamplingParams greedy{0.0f, 0, 1.0f};
  const std::vector<int32_t> base = reference(kPrompt, 24, greedy, 0);
  ASSERT_EQ(base.size(), 24u);
  json body = {{"prompt", kPrompt}, {"max_tokens", 6}, {"temperature", 0}};
  // A large bias makes greedy decoding pick one token every time; -100 removes the likeliest.
  body["logit_bias"] = {{"57", 100}};
  Reply r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(ids_of(r.body["choices"][0]), std::vector<int32_t>(6, 57));
  body["logit_bias"] = {{std::to_string(base[0]), -100}};
  r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_NE(ids_of(r.body["choices"][0]).at(0), base[0]);
  // Penalties reach the sampler (their formula is checked on its own, ServeSampling): what
  // generate() gives with them, and the greedy run's repeats are gone.
  std::map<int32_t, int> repeats;
  for (int32_t id : base) ++repeats[id];
  ASSERT_LT(repeats.size(), base.size()) << "the greedy run repeats no token; pick another prompt";
  SamplingParams penalised = greedy;
  penalised.frequency_penalty = 2.0f;
  penalised.presence_penalty = 2.0f;
  body.erase("logit_bias");
  body["max_tokens"] = 24;
  body["frequency_penalty"] = 2;
  body["presence_penalty"] = 2;
  r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::vector<int32_t> got = ids_of(r.body["choices"][0]);
  EXPECT_EQ(got, reference(kPrompt, 24, penalised, 0));
  EXPECT_NE(got, base);
}

}  // namespace
}  // namespace zaya
