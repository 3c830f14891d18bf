// `zaya serve`: the HTTP inference server in-process on a free port (a tiny random model and a
// small SentencePiece tokenizer trained here), driven with httplib::Client and checked against
// generate() called directly; and the real binary started, queried and stopped with SIGTERM.
// Choices, scoring and sampling controls over HTTP (logprobs, echo, n, best_of, penalties) are
// test_serve_choices.cpp, on the same fixture (serve_http_fixture.h). The engine on its own
// (queue, continuous batching, chunked prefill) is test_serve_engine.cpp; the pieces without
// HTTP (completion text, request validation, logit adjustments, logprobs) are test_serve_parts.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/tiny_serve_model.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_train.h"
#include "data/tokenizer_utf8.h"
#include "model/model_io.h"
#include "serve/completion_engine.h"
#include "serve/completion_request.h"
#include "serve/completion_run.h"
#include "serve/completion_text.h"
#include "serve/generate.h"
#include "serve/http_server.h"
#include "serve/logprobs.h"
#include "serve/sampling.h"
#include "serve_http_fixture.h"

extern char** environ;

namespace zaya {
namespace {

using namespace serve_test;

TEST_F(ServeHttp, HealthAndModels) {
  Reply h = get("/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body.at("status"), "ok");
  EXPECT_EQ(h.body.at("running"), 0);
  EXPECT_EQ(h.body.at("waiting"), 0);
  // The engine's count of finished completions goes up by one per completion.
  const int64_t before = h.body.at("completions").get<int64_t>();
  ASSERT_EQ(post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 2}}).status, 200);
  EXPECT_EQ(get("/health").body.at("completions").get<int64_t>(), before + 1);
  Reply m = get("/v1/models");
  ASSERT_EQ(m.status, 200) << m.raw;
  EXPECT_EQ(m.body.at("object"), "list");
  ASSERT_EQ(m.body.at("data").size(), 1u);
  EXPECT_EQ(m.body["data"][0].at("id"), "tiny-test");
  EXPECT_EQ(m.body["data"][0].at("object"), "model");
  EXPECT_EQ(m.body["data"][0].at("context_length"), model_->config().max_position_embeddings);
}

TEST_F(ServeHttp, GreedyCompletionReturnsTheIdsGenerateReturns) {
  const int64_t max_tokens = 12;
  const std::vector<int32_t> expect = reference(kPrompt, max_tokens, {0.0f, 0, 1.0f}, 0);
  ASSERT_FALSE(expect.empty());
  Reply r =
      post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", max_tokens}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body.at("object"), "text_completion");
  EXPECT_EQ(r.body.at("model"), "tiny-test");
  EXPECT_EQ(r.body.at("id").get<std::string>().rfind("cmpl-", 0), 0u);
  const json& choice = r.body.at("choices").at(0);
  EXPECT_EQ(ids_of(choice), expect);
  EXPECT_EQ(choice.at("finish_reason"), int64_t(expect.size()) == max_tokens ? "length" : "stop");
  EXPECT_EQ(r.body.at("usage"), json({{"prompt_tokens", kPrompt.size()},
                                      {"completion_tokens", expect.size()},
                                      {"total_tokens", kPrompt.size() + expect.size()}}));
  // The text is the decode of prompt + generated past the decoded prompt.
  std::vector<int32_t> all = kPrompt;
  all.insert(all.end(), expect.begin(), expect.end());
  const std::string head = tok_->decode(kPrompt, true), full = tok_->decode(all, true);
  ASSERT_EQ(full.compare(0, head.size(), head), 0);
  EXPECT_EQ(choice.at("text"), full.substr(head.size()));
}

TEST_F(ServeHttp, TextPromptIsEncodedWithTheTokenizer) {
  const std::string prompt = "The quick brown fox";
  const std::vector<int32_t> ids = tok_->encode(prompt, true);
  const std::vector<int32_t> expect = reference(ids, 10, {0.0f, 0, 1.0f}, 0);
  Reply r = post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0.0}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(ids_of(r.body["choices"][0]), expect);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], ids.size());
  // A one-element batch is the same prompt.
  Reply b = post("/v1/completions", json{{"prompt", {prompt}}, {"max_tokens", 10}, {"temperature", 0.0}});
  ASSERT_EQ(b.status, 200) << b.raw;
  EXPECT_EQ(ids_of(b.body["choices"][0]), expect);
}

TEST_F(ServeHttp, SeededSamplingIsReproducible) {
  const SamplingParams sp{0.9f, 50, 0.95f};
  json body = {{"prompt", kPrompt}, {"max_tokens", 16}, {"temperature", 0.9}, {"top_k", 50}, {"top_p", 0.95}};
  body["seed"] = 7;
  Reply a = post("/v1/completions", body), b = post("/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.raw;
  ASSERT_EQ(b.status, 200) << b.raw;
  EXPECT_EQ(ids_of(a.body["choices"][0]), reference(kPrompt, 16, sp, 7));
  EXPECT_EQ(a.body["choices"][0], b.body["choices"][0]);
  body["seed"] = 8;
  Reply c = post("/v1/completions", body);
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(ids_of(c.body["choices"][0]), reference(kPrompt, 16, sp, 8));
  EXPECT_NE(ids_of(c.body["choices"][0]), ids_of(a.body["choices"][0]));
}

TEST_F(ServeHttp, StreamedChunksConcatenateToTheWholeCompletion) {
  for (const json& prompt : {json("The quick brown fox"), json(kPrompt)}) {
    json body = {{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0.8}, {"seed", 3}};
    Reply whole = post("/v1/completions", body);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    const json& choice = whole.body["choices"][0];
    Streamed s = stream(body);
    EXPECT_EQ(s.ids, ids_of(choice)) << prompt;
    EXPECT_EQ(s.text, choice.at("text").get<std::string>()) << prompt;
    EXPECT_EQ(s.finish_reason, choice.at("finish_reason"));
    EXPECT_EQ(s.usage, whole.body.at("usage"));
    EXPECT_GE(s.chunks, ids_of(choice).size() + 1);  // one chunk per token, then the final one

    // A stop sequence that begins with the text's last character holds that character back
    // to the end, where only the final flush can deliver it.
    const std::string text = choice.at("text");
    ASSERT_FALSE(text.empty()) << prompt;
    const size_t last = tok::utf8_prev_start(text, text.size());
    body["stop"] = text.substr(last) + "<never generated>";
    Reply held = post("/v1/completions", body);
    ASSERT_EQ(held.status, 200) << held.raw;
    EXPECT_EQ(held.body["choices"][0]["text"], text);
    EXPECT_EQ(held.body["choices"][0]["finish_reason"], choice.at("finish_reason"));
    Streamed hs = stream(body);
    EXPECT_EQ(hs.text, text) << prompt;
    EXPECT_EQ(hs.ids, ids_of(choice));
  }
}

TEST_F(ServeHttp, StopSequenceCutsTheTextAndFinishesWithStop) {
  json body = {{"prompt", "Mixture of experts"}, {"max_tokens", 40}, {"temperature", 0.8}, {"seed", 1}};
  Reply whole = post("/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const std::string text = whole.body["choices"][0]["text"];
  const std::vector<int32_t> all_ids = ids_of(whole.body["choices"][0]);
  // A stop sequence from the middle of that text: two ASCII characters, at their first place.
  size_t at = std::string::npos;
  for (size_t i = text.size() / 3; i + 2 <= text.size() && at == std::string::npos; ++i)
    if ((unsigned char)text[i] < 0x80 && (unsigned char)text[i + 1] < 0x80 && text[i] != ' ')
      at = text.find(text.substr(i, 2));
  ASSERT_NE(at, std::string::npos) << "no ASCII pair in the generated text: " << text;
  const std::string stop = text.substr(at, 2);
  for (const json& stop_field : {json(stop), json({"never-generated", stop})}) {
    body["stop"] = stop_field;
    Reply r = post("/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.raw;
    const json& choice = r.body["choices"][0];
    EXPECT_EQ(choice.at("text"), text.substr(0, at)) << "stop " << stop_field;
    EXPECT_EQ(choice.at("finish_reason"), "stop");
    // The ids end with the token that completed the stop sequence: a prefix of the full run.
    const std::vector<int32_t> ids = ids_of(choice);
    ASSERT_LE(ids.size(), all_ids.size());
    EXPECT_TRUE(std::equal(ids.begin(), ids.end(), all_ids.begin()));
    EXPECT_EQ(r.body["usage"]["completion_tokens"], ids.size());
    Streamed s = stream(body);
    EXPECT_EQ(s.text, text.substr(0, at));
    EXPECT_EQ(s.ids, ids);
    EXPECT_EQ(s.finish_reason, "stop");
  }
}

TEST_F(ServeHttp, BadRequestsAre400NamingTheField) {
  const json ok = {{"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0}};
  auto with = [&](const char* key, const json& value) {
    json b = ok;
    b[key] = value;
    return b.dump();
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": [1, 2", "request body: malformed JSON: parse error at line 1"},
      {"", "request body: expected a JSON object, got an empty body"},
      {"{\"prompt\": [1e999]}", "request body: malformed JSON: number overflow parsing '1e999'"},
      {"[1, 2]", "request body: expected a JSON object, got [1,2]"},
      {"{}", "prompt: required"},
      {with("prompt", 5), "prompt: expected a string or an array of token ids, got 5"},
      {with("prompt", json::array()), "prompt: expected a non-empty array of token ids"},
      {with("prompt", {1, "x"}), "prompt[1]: expected a token id (a non-negative integer), got \"x\""},
      {with("prompt", {1, -4}), "prompt[1]: expected a token id (a non-negative integer), got -4"},
      {with("prompt", {1, 512}), "prompt[1]: token id 512 is outside the vocabulary [0, 512)"},
      {with("prompt", {"a", 7}), "prompt[1]: expected a string or an array of token ids, got 7"},
      {with("prompt", {{1, 2}, json::array()}), "prompt[1]: expected a non-empty array of token ids"},
      {with("prompt", {{1, 2}, {3, 600}}), "prompt[1][1]: token id 600 is outside the vocabulary [0, 512)"},
      {with("max_tokens", -3), "max_tokens: expected an integer >= 0 (0: no generation), got -3"},
      {with("max_tokens", "16"), "max_tokens: expected an integer >= 0 (0: no generation), got \"16\""},
      {with("max_tokens", 2.5), "max_tokens: expected an integer >= 0 (0: no generation), got 2.5"},
      {with("max_tokens", 1022),
       "max_tokens: the prompt (5 tokens) + max_tokens (1022) exceeds the model's "
       "context length 1024; ask for at most 1019"},
      {with("temperature", -1), "temperature: expected a number >= 0"},
      {with("temperature", "hot"), "temperature: expected a number >= 0 (0 = greedy), got \"hot\""},
      {with("top_p", 0), "top_p: expected a number in (0, 1], got 0"},
      {with("top_p", 1.5), "top_p: expected a number in (0, 1], got 1.5"},
      {with("top_k", -2), "top_k: expected an integer >= 0 (0 = off), got -2"},
      {with("seed", -1), "seed: expected a non-negative integer, got -1"},
      {with("stop", 5), "stop: expected a string or an array of strings, got 5"},
      {with("stop", {"a", ""}), "stop[1]: expected a non-empty string, got \"\""},
      {with("stop", {"a", "b", "c", "d", "e"}), "stop: at most 4 sequences are allowed, got 5"},
      {with("stream", "yes"), "stream: expected true or false, got \"yes\""},
      {with("n", 0), "n: expected an integer in [1, 128], got 0"},
      {with("n", 1.5), "n: expected an integer in [1, 128], got 1.5"},
      {json{{"prompt", std::vector<std::vector<int>>(3, {1, 2})}, {"n", 50}}.dump(),
       "prompt: 3 prompts x n = 50 make 150 choices; at most 128 are allowed per request"},
      {with("best_of", 0), "best_of: expected an integer in [n = 1, 128], got 0"},
      {with("best_of", 129), "best_of: expected an integer in [n = 1, 128], got 129"},
      {with("best_of", "2"), "best_of: expected an integer in [n = 1, 128], got \"2\""},
      {json{{"prompt", kPrompt}, {"n", 3}, {"best_of", 2}}.dump(),
       "best_of: expected an integer in [n = 3, 128], got 2"},
      {json{{"prompt", std::vector<std::vector<int>>(3, {1, 2})}, {"n", 2}, {"best_of", 50}}.dump(),
       "best_of: 3 prompts x best_of = 50 make 150 completions to generate; at most 128 are allowed per "
       "request"},
      {json{{"prompt", kPrompt}, {"best_of", 2}, {"stream", true}}.dump(),
       "best_of: the likeliest choices are known only once every candidate has finished, so streaming "
       "needs best_of = n (1), got 2"},
      {with("logprobs", 21), "logprobs: expected an integer in [0, 20] (alternatives per token), got 21"},
      {with("logprobs", true), "logprobs: expected an integer in [0, 20] (alternatives per token), got true"},
      {with("echo", "yes"), "echo: expected true or false, got \"yes\""},
      {with("presence_penalty", 2.5), "presence_penalty: expected a number in [-2, 2], got 2.5"},
      {with("frequency_penalty", "x"), "frequency_penalty: expected a number in [-2, 2], got \"x\""},
      {with("logit_bias", {1, 2}),
       "logit_bias: expected an object mapping token ids (as strings) to numbers"},
      {with("logit_bias", {{"abc", 1}}), "logit_bias: key \"abc\" is not a token id"},
      {with("logit_bias", {{"-1", 1}}), "logit_bias: key \"-1\" is not a token id"},
      {with("logit_bias", {{"512", 1}}),
       "logit_bias[\"512\"]: token id 512 is outside the vocabulary [0, 512)"},
      {with("logit_bias", {{"5", 101}}), "logit_bias[\"5\"]: expected a number in [-100, 100], got 101"},
      {with("suffix", "tail"), "suffix: not supported by this server, got \"tail\""},
  };
  for (const auto& [body, message] : cases) {
    Reply r = post("/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body;
    ASSERT_TRUE(r.body.is_object()) << body << " -> " << r.raw;
    EXPECT_EQ(r.body["error"]["type"], "invalid_request_error") << body;
    const std::string got = r.body["error"].value("message", "");
    EXPECT_NE(got.find(message), std::string::npos) << body << "\n  got: " << got << "\n  want: " << message;
  }
  // Streaming requests are validated before the stream starts: a real 400, not an event.
  json bad_stream = ok;
  bad_stream["stream"] = true;
  bad_stream["max_tokens"] = -1;
  Reply s = post("/v1/completions", bad_stream);
  EXPECT_EQ(s.status, 400) << s.raw;
  EXPECT_EQ(s.body["error"]["message"], "max_tokens: expected an integer >= 0 (0: no generation), got -1");

  // Tokenize and detokenize validate too.
  Reply t = post("/tokenize", json{{"text", 5}});
  EXPECT_EQ(t.status, 400);
  EXPECT_EQ(t.body["error"]["message"], "text: expected a string, got 5");
  Reply d = post("/detokenize", json{{"ids", {1, -1}}});
  EXPECT_EQ(d.status, 400);
  EXPECT_EQ(d.body["error"]["message"], "ids[1]: expected a token id (a non-negative integer), got -1");
  d = post("/detokenize", json{{"ids", {5000}}});
  EXPECT_EQ(d.status, 400);
  EXPECT_EQ(d.body["error"]["message"], "ids[0]: token id 5000 is outside the vocabulary [0, 400)");

  // `curl -d` labels JSON as a form; a body past httplib's 8 KiB form limit is still read.
  json padded = ok;
  padded["padding"] = std::string(20000, 'x');
  Reply form =
      to_reply(client()->Post("/v1/completions", padded.dump(), "application/x-www-form-urlencoded"));
  EXPECT_EQ(form.status, 200) << form.raw;

  // Unknown fields are ignored, as OpenAI does; and after all that the model still serves.
  Reply good = post("/v1/completions", with("some_future_field", {{"x", 1}}));
  ASSERT_EQ(good.status, 200) << good.raw;
  EXPECT_EQ(ids_of(good.body["choices"][0]), reference(kPrompt, 4, {0.0f, 0, 1.0f}, 0));
}

// GET /metrics: Prometheus text whose counters move with what the server does: a completion
// (3 tokens, EOS banned, so 2 decode steps) adds one finished completion, one first-token time,
// one decode-step time, its tokens and one 200 for /v1/completions; an unknown path counts as
// "other".
TEST_F(ServeHttp, MetricsFollowWhatTheServerDid) {
  auto metrics = [&] {
    auto r = client()->Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    std::map<std::string, double> values;
    if (!r) return values;
    EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u);
    std::istringstream lines(r->body);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] == '#') continue;
      const size_t space = line.rfind(' ');
      values[line.substr(0, space)] = std::stod(line.substr(space + 1));
    }
    return values;
  };
  const std::string ok = "zaya_http_requests_total{route=\"/v1/completions\",code=\"200\"}",
                    other = "zaya_http_requests_total{route=\"other\",code=\"404\"}";
  std::map<std::string, double> before = metrics();
  const Reply r =
      post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 3}, {"logit_bias", {{"1", -100}}}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(get("/no/such/route").status, 404);
  // The request and token counters are kept by httplib's logger, which runs after the reply has
  // gone out, so a scrape on another connection may come just before them: read again until the
  // last request's count shows, for up to 10 s.
  std::map<std::string, double> after = metrics();
  for (int tries = 0; tries < 200 && (after[other] - before[other] < 1 || after[ok] - before[ok] < 1);
       ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = metrics();
  }
  EXPECT_EQ(after["zaya_completions_total"] - before["zaya_completions_total"], 1);
  EXPECT_EQ(after["zaya_completions_total"], get("/health").body.at("completions").get<double>());
  EXPECT_EQ(
      after["zaya_time_to_first_token_seconds_count"] - before["zaya_time_to_first_token_seconds_count"], 1);
  EXPECT_EQ(
      after["zaya_time_per_decode_step_seconds_count"] - before["zaya_time_per_decode_step_seconds_count"],
      1);
  EXPECT_EQ(after["zaya_decoded_tokens_total"] - before["zaya_decoded_tokens_total"], 2);
  EXPECT_EQ(after[ok] - before[ok], 1);
  EXPECT_EQ(after[other] - before[other], 1);
  EXPECT_EQ(after["zaya_generated_tokens_total"] - before["zaya_generated_tokens_total"], 3);
  EXPECT_EQ(after["zaya_prompt_tokens_total"] - before["zaya_prompt_tokens_total"], double(kPrompt.size()));
  EXPECT_GT(after["zaya_decode_state_bytes"], 0);
  EXPECT_EQ(after["zaya_time_to_first_token_seconds_bucket{le=\"+Inf\"}"],
            after["zaya_time_to_first_token_seconds_count"]);
}

TEST_F(ServeHttp, UnknownRoutesAndWrongMethodsGetJsonErrors) {
  Reply r = get("/v2/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body["error"]["type"], "not_found_error");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("GET /v2/nothing"), std::string::npos);
  r = get("/v1/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.body["error"]["message"], "/v1/completions takes POST with a JSON body");
}

TEST_F(ServeHttp, ConcurrentCompletionsMatchSequentialOnes) {
  const json a = {{"prompt", kPrompt}, {"max_tokens", 24}, {"temperature", 0}};
  const json b = {
      {"prompt", "A tokenizer turns text"}, {"max_tokens", 24}, {"temperature", 1.0}, {"seed", 99}};
  Reply seq_a = post("/v1/completions", a), seq_b = post("/v1/completions", b);
  ASSERT_EQ(seq_a.status, 200);
  ASSERT_EQ(seq_b.status, 200);
  Reply par_a, par_b;
  Streamed par_s;
  {
    std::thread ta([&] { par_a = post("/v1/completions", a); });
    std::thread tb([&] { par_b = post("/v1/completions", b); });
    std::thread ts([&] { par_s = stream(b); });
    ta.join();
    tb.join();
    ts.join();
  }
  ASSERT_EQ(par_a.status, 200) << par_a.raw;
  ASSERT_EQ(par_b.status, 200) << par_b.raw;
  EXPECT_EQ(par_a.body["choices"][0], seq_a.body["choices"][0]);
  EXPECT_EQ(par_b.body["choices"][0], seq_b.body["choices"][0]);
  EXPECT_EQ(par_s.ids, ids_of(seq_b.body["choices"][0]));
  EXPECT_EQ(par_s.text, seq_b.body["choices"][0]["text"]);
}

TEST_F(ServeHttp, ClientLeavingMidStreamLeavesTheServerWorking) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = json{{"prompt", kPrompt}, {"max_tokens", 1000}, {"temperature", 1.0}, {"stream", true}}.dump();
  size_t received = 0;
  req.content_receiver = [&](const char*, size_t n, uint64_t, uint64_t) {
    received += n;
    return false;  // hang up after the first piece
  };
  auto c = client();
  c->send(req);
  EXPECT_GT(received, 0u);
  Reply r = post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(ids_of(r.body["choices"][0]), reference(kPrompt, 4, {0.0f, 0, 1.0f}, 0));
}

TEST_F(ServeHttp, TokenizeAndDetokenizeRoundTrip) {
  const std::string text = "Mixture of experts models route each token to a few experts.";
  Reply t = post("/tokenize", json{{"text", text}});
  ASSERT_EQ(t.status, 200) << t.raw;
  const std::vector<int32_t> ids = t.body.at("ids");
  EXPECT_EQ(ids, tok_->encode(text, true));
  EXPECT_EQ(ids.front(), tok_->bos_id());
  Reply plain = post("/tokenize", json{{"text", text}, {"add_special", false}});
  EXPECT_EQ(plain.body.at("ids").get<std::vector<int32_t>>(), tok_->encode(text, false));
  Reply d = post("/detokenize", json{{"ids", ids}});
  ASSERT_EQ(d.status, 200) << d.raw;
  EXPECT_EQ(d.body.at("text"), text);
}

TEST(ServeHttpNoTokenizer, TokenIdsWorkAndTextNeedsATokenizer) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  ServerOptions so;
  so.port = 0;
  so.log_requests = false;
  so.max_body_bytes = 4096;
  HttpServer server(*model, nullptr, so);
  server.start();
  httplib::Client c("127.0.0.1", server.port());
  auto big = c.Post("/v1/completions", json{{"prompt", kPrompt}, {"pad", std::string(5000, 'x')}}.dump(),
                    "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_NE(big->body.find("request body: larger than 4096 bytes"), std::string::npos) << big->body;
  auto r = c.Post("/v1/completions", json{{"prompt", "hello"}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("prompt: a text prompt needs a tokenizer"), std::string::npos) << r->body;
  r = c.Post("/v1/completions", json{{"prompt", kPrompt}, {"stop", "x"}}.dump(), "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("stop: stop sequences are matched against decoded text"), std::string::npos)
      << r->body;
  r = c.Post("/tokenize", json{{"text", "hello"}}.dump(), "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("tokenize: this server has no tokenizer"), std::string::npos) << r->body;
  r = c.Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 3}, {"temperature", 0}}.dump(),
             "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  json body = json::parse(r->body);
  EXPECT_EQ(body["choices"][0]["text"], "");
  EXPECT_EQ(body["choices"][0]["token_ids"].size(), body["usage"]["completion_tokens"]);
  server.stop();
  EXPECT_FALSE(server.running());
  EXPECT_FALSE(c.Get("/health"));  // nothing listens any more
}

TEST(ServeHttpStart, ABusyPortIsAClearError) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  ServerOptions so;
  so.port = 0;
  so.log_requests = false;
  HttpServer first(*model, nullptr, so);
  first.start();
  so.port = first.port();
  HttpServer second(*model, nullptr, so);
  try {
    second.start();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(so.port)),
              std::string::npos)
        << e.what();
  }
}

// The real binary: prints its URL for --port 0, serves, logs each request and exits 0 on SIGTERM.
TEST(ServeCli, PrintsItsUrlServesAndStopsOnSigterm) {
  const fs::path dir = make_temp_dir("cli");
  {
    auto be = make_cpu_backend();
    auto model = tiny_model(*be);
    save_model(*model, (dir / "model").string());
  }
  int out_pipe[2];
  ASSERT_EQ(pipe(out_pipe), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
  const std::string log_path = (dir / "stderr.log").string();
  posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const std::string binary = std::string(ZAYA_BINARY_DIR) + "/bin/zaya", model_dir = (dir / "model").string();
  std::vector<std::string> args = {binary,      "serve", "--model",    model_dir, "--port",          "0",
                                   "--threads", "1",     "--batch",    "3",       "--prefill-chunk", "2",
                                   "--context", "100",   "--keep-mib", "64"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, binary.c_str(), &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(out_pipe[1]);
  // The first line of stdout names the URL.
  std::string line;
  char ch;
  while (read(out_pipe[0], &ch, 1) == 1 && ch != '\n') line += ch;
  const std::string prefix = "zaya serve: listening on http://127.0.0.1:";
  ASSERT_EQ(line.rfind(prefix, 0), 0u) << "stdout: " << line;
  const int port = std::stoi(line.substr(prefix.size()));
  EXPECT_GT(port, 0);
  httplib::Client c("127.0.0.1", port);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto r = c.Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 3}, {"temperature", 0}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto bad =
      c.Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", -3}}.dump(), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "model");
  EXPECT_EQ(json::parse(models->body)["data"][0]["context_length"], 100);  // --context
  auto too_long =
      c.Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 96}}.dump(), "application/json");
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400) << too_long->body;
  kill(pid, SIGTERM);
  int status = -1;
  for (int i = 0; i < 300 && waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (!WIFEXITED(status)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "zaya serve did not exit within 30 s of SIGTERM";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0);
  close(out_pipe[0]);
  std::ifstream log_file(log_path);
  const std::string log((std::istreambuf_iterator<char>(log_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("POST /v1/completions 200 prompt_tokens=5 generated_tokens="), std::string::npos) << log;
  EXPECT_NE(log.find("POST /v1/completions 400"), std::string::npos) << log;
  EXPECT_NE(log.find("max_tokens: expected an integer >= 0 (0: no generation), got -3"), std::string::npos)
      << log;
  EXPECT_NE(log.find("received SIGTERM"), std::string::npos) << log;
  EXPECT_NE(log.find("decoding up to 3 completions together"), std::string::npos) << log;
  EXPECT_NE(log.find("keeping the states of prompts and finished completions, up to 64 MiB"),
            std::string::npos)
      << log;
  // One completion of 3 tokens (the bad request never reached the engine): the first token comes
  // from the prefill of its 5-token prompt (3 passes of at most 2 positions), two from decode steps.
  EXPECT_NE(
      log.find("stopped after 1 completion; 2 tokens decoded in 2 steps (mean batch 1.00); prompts "
               "prefilled in 3 passes (5 positions, up to 1 prompt in one pass); 0 completions ran no prompt "
               "position (a kept state or another choice held the whole prompt); 0 prompt positions not run "
               "again (a prompt extending a kept one); 0 completions continued a finished completion (a "
               "conversation's next turn)"),
      std::string::npos)
      << log;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zaya
