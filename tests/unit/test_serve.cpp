// `zaya serve`: the HTTP inference server in-process on a free port (a tiny random model and a
// small SentencePiece tokenizer trained here), driven with httplib::Client and checked against
// generate() called directly; and the real binary started, queried and stopped with SIGTERM.
// The engine on its own (queue, continuous batching, chunked prefill) is test_serve_engine.cpp;
// the pieces without HTTP (completion text, request validation, logit adjustments, logprobs)
// are test_serve_parts.cpp.
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

extern char** environ;

namespace zaya {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using test::kPrompt;
using test::tiny_model;

fs::path make_temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("zaya_serve_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A SentencePiece BPE vocabulary small enough for zaya-tiny's 512 ids (pad 0, eos 1, bos 2,
// unk 3, as the model's EOS id 1 expects).
std::unique_ptr<Tokenizer> train_small_tokenizer(const fs::path& dir) {
  const std::vector<std::string> sentences = {
      "The quick brown fox jumps over the lazy dog.",
      "Mixture of experts models route each token to a few experts.",
      "A tokenizer turns text into integer ids and back again.",
      "Training runs for many steps with a warmup and a cosine decay.",
      "Numbers like 12345 and 3.14159 appear in text, too.",
      "Servers answer requests one at a time when the model is single.",
  };
  const std::string corpus = (dir / "corpus.txt").string();
  {
    std::ofstream out(corpus);
    for (int r = 0; r < 60; ++r)
      for (size_t i = 0; i < sentences.size(); ++i)
        out << sentences[(i + size_t(r)) % sentences.size()] << "\n";
  }
  TokenizerTrainOptions opt;
  opt.vocab_size = 400;
  opt.character_coverage = 1.0;
  train_sentencepiece({corpus}, (dir / "tok").string(), opt);
  return load_tokenizer((dir / "tok.model").string());
}

struct Reply {
  int status = 0;
  std::string raw, content_type;
  json body;  // parsed when the reply is JSON
};

Reply to_reply(const httplib::Result& r) {
  Reply out;
  if (!r) {
    ADD_FAILURE() << "no HTTP response: " << httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.raw = r->body;
  out.content_type = r->get_header_value("Content-Type");
  if (out.content_type.rfind("application/json", 0) == 0) out.body = json::parse(r->body, nullptr, false);
  return out;
}

// A Server-Sent Events body: the data of each event, in order.
std::vector<std::string> sse_data(const std::string& raw) {
  std::vector<std::string> events;
  size_t i = 0;
  while (i < raw.size()) {
    size_t end = raw.find("\n\n", i);
    if (end == std::string::npos) end = raw.size();
    std::string event = raw.substr(i, end - i);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << "not an SSE data line: " << event;
    events.push_back(event.substr(std::min(event.size(), size_t(6))));
    i = end + 2;
  }
  return events;
}

class ServeHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(make_temp_dir("http"));
    tok_ = train_small_tokenizer(*dir_).release();
    be_ = make_cpu_backend().release();
    model_ = tiny_model(*be_).release();
    be_->set_weights_frozen(true);
    ref_be_ = make_cpu_backend().release();
    ref_ = tiny_model(*ref_be_).release();  // the same weights, for generate() called directly
    ServerOptions so;
    so.port = 0;
    so.model_id = "tiny-test";
    so.log_requests = false;
    server_ = new HttpServer(*model_, tok_, so);
    server_->start();
  }
  static void TearDownTestSuite() {
    server_->stop();
    delete server_;
    delete ref_;
    delete ref_be_;
    delete model_;
    delete be_;
    delete tok_;
    fs::remove_all(*dir_);
    delete dir_;
  }

  static std::unique_ptr<httplib::Client> client() {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    c->set_read_timeout(120, 0);
    return c;
  }
  static Reply post(const std::string& path, const std::string& body) {
    return to_reply(client()->Post(path.c_str(), body, "application/json"));
  }
  static Reply post(const std::string& path, const json& body) { return post(path, body.dump()); }
  static Reply get(const std::string& path) { return to_reply(client()->Get(path.c_str())); }

  // generate() on the reference model: the ids the server must return.
  static std::vector<int32_t> reference(const std::vector<int32_t>& prompt, int64_t max_tokens,
                                        const SamplingParams& sp, uint64_t seed) {
    std::vector<int32_t> ids;
    generate(*ref_, prompt, max_tokens, sp, seed, [&](int32_t id, const float*) {
      ids.push_back(id);
      return true;
    });
    return ids;
  }

  // log-softmax of the reference model's logits over `ids` run as one fresh sequence (no decode
  // state, no chunks): row t predicts ids[t + 1].
  static std::vector<std::vector<double>> reference_log_softmax(const std::vector<int32_t>& ids) {
    const int64_t V = ref_->config().vocab_size, T = int64_t(ids.size());
    std::vector<float> logits(size_t(T * V));
    ForwardOutputs out;
    out.logits = logits.data();
    ref_->forward(ids.data(), 1, T, nullptr, out);
    std::vector<std::vector<double>> rows(size_t(T), std::vector<double>(static_cast<size_t>(V)));
    for (int64_t t = 0; t < T; ++t) {
      const float* l = logits.data() + t * V;
      const double mx = *std::max_element(l, l + V);
      double sum = 0;
      for (int64_t j = 0; j < V; ++j) sum += std::exp(double(l[j]) - mx);
      for (int64_t j = 0; j < V; ++j) rows[size_t(t)][size_t(j)] = double(l[j]) - mx - std::log(sum);
    }
    return rows;
  }

  // A choice's logprobs against rows of reference_log_softmax: token j of the logprobs is
  // predicted by row first_row + j (a null first entry, an echoed prompt's first token, is
  // skipped); its alternatives are that row's likeliest entries. The tokens concatenate to the
  // text, at their text offsets. Returns how many chosen tokens were not their row's likeliest.
  static int check_logprobs(const json& choice, const std::vector<int32_t>& ids, int64_t first_row,
                            const std::vector<std::vector<double>>& rows, size_t top_n) {
    const json& lp = choice.at("logprobs");
    EXPECT_TRUE(lp.is_object()) << choice;
    if (!lp.is_object()) return 0;
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      EXPECT_EQ(lp.at(key).size(), ids.size()) << key;
    std::string joined;
    int not_likeliest = 0;
    for (size_t j = 0; j < ids.size() && j < lp["tokens"].size(); ++j) {
      EXPECT_EQ(lp["text_offset"][j], joined.size()) << j;
      joined += lp["tokens"][j].get<std::string>();
      const int64_t row = first_row + int64_t(j);
      if (row < 0) {
        EXPECT_TRUE(lp["token_logprobs"][j].is_null());
        EXPECT_TRUE(lp["top_logprobs"][j].is_null());
        continue;
      }
      const std::vector<double>& r = rows.at(size_t(row));
      EXPECT_NEAR(lp["token_logprobs"][j].get<double>(), r[size_t(ids[j])], 1e-4) << "token " << j;
      std::vector<double> best = r;
      std::sort(best.begin(), best.end(), std::greater<>());
      const json& top = lp["top_logprobs"][j];
      EXPECT_GE(top.size(), 1u);
      EXPECT_LE(top.size(), top_n);
      double top_max = -1e30;
      for (const auto& [name, value] : top.items()) {
        top_max = std::max(top_max, value.get<double>());
        EXPECT_GE(value.get<double>(), best[top_n - 1] - 1e-4) << "alternative " << name << " at token " << j;
      }
      EXPECT_NEAR(top_max, best[0], 1e-4) << "token " << j;
      not_likeliest += r[size_t(ids[j])] < best[0] - 1e-6;
    }
    EXPECT_EQ(joined, choice.at("text").get<std::string>());
    return not_likeliest;
  }

  static std::vector<int32_t> ids_of(const json& choice) {
    return choice.at("token_ids").get<std::vector<int32_t>>();
  }

  // The streamed completion, reassembled: concatenated texts and ids, the finish_reason and
  // usage of the last chunk; checks the framing (chunks, then [DONE]) on the way.
  struct Streamed {
    std::string text;
    std::vector<int32_t> ids;
    json finish_reason, usage;
    json token_logprobs = json::array();  // the chunks' logprobs.token_logprobs, concatenated
    size_t chunks = 0;
  };
  static Streamed stream(json body) {
    body["stream"] = true;
    Reply r = post("/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.content_type.rfind("text/event-stream", 0), 0u) << r.content_type;
    std::vector<std::string> events = sse_data(r.raw);
    Streamed s;
    EXPECT_GE(events.size(), 2u) << r.raw;
    if (events.size() < 2) return s;
    EXPECT_EQ(events.back(), "[DONE]");
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      json chunk = json::parse(events[i]);
      EXPECT_EQ(chunk.at("object"), "text_completion");
      const json& choice = chunk.at("choices").at(0);
      s.text += choice.at("text").get<std::string>();
      for (int32_t id : ids_of(choice)) s.ids.push_back(id);
      if (!choice.at("logprobs").is_null())
        for (const json& lp : choice["logprobs"].at("token_logprobs")) s.token_logprobs.push_back(lp);
      const bool last = i + 2 == events.size();
      EXPECT_EQ(choice.at("finish_reason").is_null(), !last) << events[i];
      if (last) {
        s.finish_reason = choice.at("finish_reason");
        s.usage = chunk.at("usage");
      }
      ++s.chunks;
    }
    return s;
  }

  static inline fs::path* dir_ = nullptr;
  static inline Tokenizer* tok_ = nullptr;
  static inline Backend* be_ = nullptr;
  static inline Model* model_ = nullptr;
  static inline Backend* ref_be_ = nullptr;
  static inline Model* ref_ = nullptr;
  static inline HttpServer* server_ = nullptr;
};

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
  std::vector<std::string> args = {binary,      "serve", "--model", model_dir, "--port",          "0",
                                   "--threads", "1",     "--batch", "3",       "--prefill-chunk", "2",
                                   "--context", "100"};
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
  // One completion of 3 tokens (the bad request never reached the engine): the first token comes
  // from the prefill of its 5-token prompt (3 chunks of at most 2), two from decode steps.
  EXPECT_NE(
      log.find("stopped after 1 completion; 2 tokens decoded in 2 steps (mean batch 1.00); prompts "
               "prefilled in 3 chunks (5 positions); 0 completions reused the prefill of the same prompt "
               "before them; 0 prompt positions not run again"),
      std::string::npos)
      << log;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zaya
