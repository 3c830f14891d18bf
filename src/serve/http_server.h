// The HTTP inference server (`zaya serve`, docs/serving.md): cpp-httplib underneath, JSON in
// and out, OpenAI-compatible /v1/completions with Server-Sent Events streaming, /v1/models,
// /health, Prometheus /metrics, /tokenize, /detokenize, one log line per request, and a clean
// start and stop.
// Owns the httplib::Server and the CompletionEngine that serialises generation; the model and
// tokenizer belong to the caller. httplib stays inside http_server.cpp.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "data/tokenizer.h"
#include "model/model.h"
#include "serve/completion_engine.h"

namespace zaya {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                // 0: any free port (port() says which)
  std::string model_id = "zaya";  // the id /v1/models and every completion report
  // Every open connection holds an HTTP thread while it lasts, and so does a completion waiting
  // for the model: keep max_queue well below http_threads so /health still gets an answer.
  int http_threads = 32;
  size_t max_queue = 16;                     // completions that may wait for the model; more get a 503
  int64_t max_batch = 8;                     // completions decoded together (continuous batching)
  int64_t prefill_chunk = 256;               // prompt positions prefilled between two decode steps
  int64_t context = 0;                       // positions per completion served (0: the model's)
  int64_t keep_bytes = int64_t(1) << 30;     // finished completions' states kept for next turns
  int compute_threads = 0;                   // OpenMP threads for the model (0 = OpenMP's default)
  size_t max_body_bytes = size_t(16) << 20;  // larger request bodies get a 413
  bool log_requests = true;                  // one line per request on the zaya log (stderr)
  // POST /v1/chat/completions renders messages with this chat template (a built-in's name or a
  // TOML file, data/chat_template.h); empty: that route answers 400. Needs a tokenizer.
  std::string chat_template;
};

class HttpServer {
 public:
  // The model (weights frozen) and the tokenizer (may be null: token ids only) must outlive
  // the server.
  HttpServer(Model& model, const Tokenizer* tokenizer, ServerOptions options);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and serves on a background thread; returns once requests are accepted.
  // Throws zaya::Error when it cannot bind.
  void start();
  int port() const;         // the bound port, after start()
  std::string url() const;  // "http://host:port"
  bool running() const;     // accepting connections
  // Bytes of decode state (KV caches, conv and value states) the engine holds for its batch.
  int64_t decode_state_bytes() const;
  EngineStats engine_stats() const;  // what the completion engine has done so far
  // Stops accepting, cancels the running generation, fails queued ones with 503 and waits
  // for every handler to finish. Idempotent; safe from any thread but a handler's.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zaya
