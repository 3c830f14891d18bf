// The HTTP server's test fixture, shared by test_serve.cpp and test_serve_choices.cpp: a tiny
// random model and a small SentencePiece tokenizer trained here, the server in-process on a free
// port, an httplib client, and the references the tests check replies against (generate() and
// the model's log-softmax over a whole sequence).
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/tiny_serve_model.h"
#include "data/tokenizer.h"
#include "data/tokenizer_train.h"
#include "model/model_io.h"
#include "serve/generate.h"
#include "serve/http_server.h"
#include "serve/sampling.h"

namespace zaya::serve_test {

using json = nlohmann::json;
namespace fs = std::filesystem;

using test::kPrompt;
using test::tiny_model;

inline fs::path make_temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("zaya_serve_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A SentencePiece BPE vocabulary small enough for zaya-tiny's 512 ids (pad 0, eos 1, bos 2,
// unk 3, as the model's EOS id 1 expects).
inline std::unique_ptr<Tokenizer> train_small_tokenizer(const fs::path& dir) {
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

inline Reply to_reply(const httplib::Result& r) {
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
inline std::vector<std::string> sse_data(const std::string& raw) {
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
    so.chat_template = "plain";  // POST /v1/chat/completions (test_serve_chat.cpp)
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

}  // namespace zaya::serve_test
