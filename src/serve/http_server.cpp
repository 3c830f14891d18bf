// Routes, request logging and the server's life cycle (see http_server.h). Request parsing
// lives in completion_request.cpp, response bodies in api_json.cpp, generation in
// completion_engine.cpp; this file wires them to httplib.
#include "serve/http_server.h"

#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "serve/api_error.h"
#include "serve/api_json.h"
#include "serve/best_of.h"
#include "serve/chat_json.h"
#include "serve/completion_engine.h"
#include "serve/completion_request.h"
#include "serve/metrics.h"

namespace zaya {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// What the request log line reports. httplib runs a request's handler, its streamed content
// and the logger on one worker thread, so a thread-local record follows each request.
struct RequestLog {
  bool started = false;
  Clock::time_point start;
  int64_t prompt_tokens = -1, generated = -1;
  std::string note;  // finish reason or error message
};
thread_local RequestLog t_log;

void reply_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void reply_error(httplib::Response& res, int status, const std::string& type, const std::string& message) {
  reply_json(res, status, error_body(message, type));
  t_log.note = message;
}

// Runs a handler, turning every exception into a JSON error: ApiError keeps its status, anything
// else is the server's fault (500). Nothing a client sends can escape as a crash.
template <class F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) {
    try {
      f(req, res);
    } catch (const ApiError& e) {
      reply_error(res, e.status(), e.type(), e.what());
    } catch (const std::exception& e) {
      reply_error(res, 500, "server_error", std::string("internal error: ") + e.what());
    }
  };
}

// A POST handler f(req, res, body) that reads its body itself: httplib's own reading refuses
// form-encoded bodies over 8 KiB (the content type `curl -d` sends), which a JSON API should not
// care about. A body that cannot be read keeps httplib's status (413 past the size limit).
template <class F>
httplib::Server::HandlerWithContentReader guarded_post(F f) {
  return [f](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
    std::string body;
    if (!read([&](const char* data, size_t n) {
          body.append(data, n);
          return true;
        })) {
      if (res.status < 400) res.status = 400;
      return;
    }
    guarded([&](const httplib::Request& r, httplib::Response& s) { f(r, s, body); })(req, res);
  };
}

std::string count_or_dash(int64_t n) { return n < 0 ? "-" : std::to_string(n); }

// The route a request counts under in the metrics: one of the server's, or "other" (so that
// requests for arbitrary paths cannot grow the label set).
std::string route_label(const std::string& path) {
  for (const char* route : {"/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions",
                            "/tokenize", "/detokenize"})
    if (path == route) return route;
  return "other";
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct HttpServer::Impl {
  Impl(Model& m, const Tokenizer* t, ServerOptions o)
      : tok(t),
        opt(std::move(o)),
        engine(m, t,
               EngineOptions{opt.max_queue, opt.compute_threads, opt.max_batch, opt.prefill_chunk,
                             opt.context, opt.keep_bytes}),
        limits{m.config().vocab_size, engine.context()},
        created(unix_now()) {
    if (!opt.chat_template.empty()) {
      if (!tok)
        fail("serve", "--chat-template " + opt.chat_template + " needs a tokenizer, and the server has none",
             "pass --tokenizer PATH, or keep tokenizer.json or tokenizer.model in the model directory");
      chat = std::make_unique<ChatFormat>(load_chat_template(opt.chat_template), *tok);
    }
    std::random_device rd;
    rng.seed((uint64_t(rd()) << 32) ^ rd());
    id_salt = rng();
  }

  const Tokenizer* tok;
  ServerOptions opt;
  std::unique_ptr<ChatFormat> chat;  // with --chat-template
  CompletionEngine engine;  // before limits, which take its context
  ModelLimits limits;
  httplib::Server svr;
  std::thread listener;
  int port = -1;
  int64_t created;
  std::atomic<bool> started{false}, listen_ended{false};
  std::mutex stop_mu;
  std::atomic<bool> stopped{false};
  std::mutex rng_mu;
  std::mt19937_64 rng;
  uint64_t id_salt = 0;
  std::atomic<uint64_t> completions{0};
  std::mutex counts_mu;
  HttpRequestCounts http_counts;  // guarded by counts_mu

  uint64_t random_seed() {
    std::lock_guard lk(rng_mu);
    return rng();
  }
  std::string new_completion_id(const char* prefix = "cmpl") {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", prefix, (unsigned long long)id_salt,
                  (unsigned long long)(++completions & 0xffffffffull));
    return buf;
  }

  void set_up_routes();
  // How a response is shaped: /v1/completions' text completions, or /v1/chat/completions' chat
  // completions (include_usage: a streamed chat ends with a chunk carrying the usage).
  struct ResponseShape {
    bool chat = false, include_usage = false;
  };
  void completions_handler(const std::string& body, httplib::Response& res);
  void chat_handler(const std::string& body, httplib::Response& res);
  void run_jobs(const CompletionRequest& request, const std::vector<std::vector<int32_t>>& prompts,
                const std::vector<int32_t>& end_ids, ResponseShape shape, httplib::Response& res);
  void stream(std::vector<CompletionJob>& jobs, const CompletionMeta& meta, CompletionUsage usage,
              ResponseShape shape, httplib::DataSink& sink);
  const Tokenizer& tokenizer_or_400(const char* endpoint) const;
};

const Tokenizer& HttpServer::Impl::tokenizer_or_400(const char* endpoint) const {
  if (!tok)
    invalid_request(std::string(endpoint) + ": this server has no tokenizer; start it with --tokenizer PATH");
  return *tok;
}

void HttpServer::Impl::completions_handler(const std::string& body, httplib::Response& res) {
  const CompletionRequest request = parse_completion_request(parse_json_body(body), limits);
  run_jobs(request, completion_prompt_ids(request, tok, limits), {}, ResponseShape{}, res);
}

void HttpServer::Impl::chat_handler(const std::string& body, httplib::Response& res) {
  const ChatCompletionRequest request =
      parse_chat_completion_request(parse_json_body(body), limits, chat.get());
  const std::vector<std::vector<int32_t>> prompts{request.completion.prompts[0].ids};
  run_jobs(request.completion, prompts, {chat->end_of_reply_id()}, ResponseShape{true, request.include_usage},
           res);
}

// Queues a request's completions and answers with their results, whole or streamed.
void HttpServer::Impl::run_jobs(const CompletionRequest& request,
                                const std::vector<std::vector<int32_t>>& prompts,
                                const std::vector<int32_t>& end_ids, ResponseShape shape,
                                httplib::Response& res) {
  // Choice i * n + j: prompt i, sample j (seed + j, so choice 0 is what n = 1 gives). With
  // best_of > n, candidate j of prompt i samples with seed + j and the n likeliest are kept.
  const uint64_t seed = request.seed ? *request.seed : random_seed();
  const bool ranked = request.best_of > request.n;
  auto jobs = std::make_shared<std::vector<CompletionJob>>();
  CompletionUsage usage;
  for (const std::vector<int32_t>& prompt : prompts) {
    usage.prompt_tokens += int64_t(prompt.size());
    for (int64_t j = 0; j < request.best_of; ++j) {
      CompletionJob job;
      job.prompt = prompt;
      job.max_tokens = request.max_tokens;
      job.sampling = request.sampling;
      job.seed = seed + uint64_t(j);
      job.stop = request.stop;
      job.end_ids = end_ids;
      job.text_alone = shape.chat;  // a reply's content, as the chat template tokenises it back
      job.echo = request.echo;
      job.logprobs = request.logprobs;
      job.score = ranked;
      jobs->push_back(std::move(job));
    }
  }
  t_log.prompt_tokens = usage.prompt_tokens;
  const CompletionMeta meta{new_completion_id(shape.chat ? "chatcmpl" : "cmpl"), unix_now(), opt.model_id};
  if (!request.stream) {
    std::vector<CompletionEngine::Ticket> tickets = engine.submit(std::move(*jobs));  // decoded together
    std::vector<CompletionResult> results;
    for (CompletionEngine::Ticket& ticket : tickets) {
      results.push_back(engine.wait(ticket));
      usage.completion_tokens += int64_t(results.back().ids.size());  // every candidate's tokens
    }
    if (ranked) results = keep_best_of(std::move(results), request.best_of, request.n);
    t_log.generated = usage.completion_tokens;
    t_log.note = results.size() == 1 ? results[0].finish_reason : std::to_string(results.size()) + " choices";
    reply_json(
        res, 200,
        shape.chat ? chat_completion_body(meta, results, usage) : completion_body(meta, results, usage));
    return;
  }
  // The status line goes out before generation starts: answer a full queue now, while a 503
  // can still be sent (run() re-checks; a later failure arrives as an error event).
  if (!engine.accepting())
    throw ApiError(503, "unavailable_error", "the server is busy or shutting down; retry later");
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // reverse proxies: pass events through unbuffered
  res.set_chunked_content_provider("text/event-stream",
                                   [this, jobs, meta, usage, shape](size_t, httplib::DataSink& sink) {
                                     stream(*jobs, meta, usage, shape, sink);
                                     return true;
                                   });
}

// Writes a request's choices, one after the other, as Server-Sent Events: a chunk per generated
// token (its ids, the text it released and its logprobs; an echo comes first), a final chunk
// per choice with its finish_reason (the request's last one also carries the usage), then
// [DONE]. The choices are decoded together; a later one's chunks wait until the ones before it
// are written. A client that goes away cancels every choice at its next token.
void HttpServer::Impl::stream(std::vector<CompletionJob>& jobs, const CompletionMeta& meta,
                              CompletionUsage usage, ResponseShape shape, httplib::DataSink& sink) {
  bool open = true;
  auto send = [&](const std::string& event) { return open = open && sink.write(event.data(), event.size()); };
  // A chat stream that ends with a usage chunk carries "usage": null on every chunk before it.
  auto chat_event = [&](json chunk) {
    if (shape.include_usage) chunk["usage"] = nullptr;
    return sse_event(chunk);
  };
  try {
    t_log.generated = 0;
    const size_t choices = jobs.size();
    std::vector<CompletionEngine::Ticket> tickets = engine.submit(std::move(jobs));
    for (size_t i = 0; i < choices && open; ++i) {
      const int64_t index = int64_t(i);
      if (shape.chat) send(chat_event(chat_role_chunk_body(meta, index)));
      const CompletionResult r = engine.wait(tickets[i], [&](const CompletionChunk& c) {
        return send(shape.chat ? chat_event(chat_chunk_body(meta, index, c))
                               : sse_event(completion_chunk_body(meta, index, c)));
      });
      usage.completion_tokens += int64_t(r.ids.size());
      t_log.generated = usage.completion_tokens;
      t_log.note = choices == 1 ? r.finish_reason : std::to_string(i + 1) + " choices";
      const bool last = i + 1 == choices;
      send(shape.chat ? chat_event(chat_final_chunk_body(meta, index, r))
                      : sse_event(completion_final_chunk_body(meta, index, r, last ? &usage : nullptr)));
      if (shape.chat && last && shape.include_usage) send(sse_event(chat_usage_chunk_body(meta, usage)));
    }
  } catch (const ApiError& e) {
    t_log.note = e.what();
    send(sse_event(error_body(e.what(), e.type())));
  } catch (const std::exception& e) {
    t_log.note = std::string("internal error: ") + e.what();
    send(sse_event(error_body(t_log.note, "server_error")));
  }
  send("data: [DONE]\n\n");
  if (!open) t_log.note += t_log.note.empty() ? "client went away" : " (client went away)";
  sink.done();
}

void HttpServer::Impl::set_up_routes() {
  svr.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    t_log = RequestLog{};
    t_log.started = true;
    t_log.start = Clock::now();
    return httplib::Server::HandlerResponse::Unhandled;
  });

  svr.Get("/health", guarded([this](const httplib::Request&, httplib::Response& res) {
            const EngineStats st = engine.stats();
            reply_json(res, 200,
                       {{"status", "ok"},
                        {"running", st.running},
                        {"waiting", st.waiting},
                        {"completions", st.completions}});
          }));

  svr.Get(
      "/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
        HttpRequestCounts counts;
        {
          std::lock_guard lk(counts_mu);
          counts = http_counts;
        }
        const ServerShape shape{opt.max_batch, engine.context(), engine.decode_state_bytes(), opt.keep_bytes};
        res.status = 200;
        res.set_content(prometheus_text(engine.stats(), counts, shape),
                        "text/plain; version=0.0.4; charset=utf-8");
      }));

  svr.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
            reply_json(res, 200,
                       models_body(opt.model_id, created, limits.context_length, limits.vocab_size,
                                   opt.chat_template));
          }));

  svr.Post("/v1/completions",
           guarded_post([this](const httplib::Request&, httplib::Response& res, const std::string& body) {
             completions_handler(body, res);
           }));

  svr.Post("/v1/chat/completions",
           guarded_post([this](const httplib::Request&, httplib::Response& res, const std::string& body) {
             chat_handler(body, res);
           }));

  svr.Post("/tokenize",
           guarded_post([this](const httplib::Request&, httplib::Response& res, const std::string& body) {
             const Tokenizer& t = tokenizer_or_400("tokenize");
             const TokenizeRequest r = parse_tokenize_request(parse_json_body(body));
             reply_json(res, 200, {{"ids", t.encode(r.text, r.add_special)}});
           }));

  svr.Post("/detokenize",
           guarded_post([this](const httplib::Request&, httplib::Response& res, const std::string& body) {
             const Tokenizer& t = tokenizer_or_400("detokenize");
             const DetokenizeRequest r = parse_detokenize_request(parse_json_body(body), t.vocab_size());
             reply_json(res, 200, {{"text", t.decode(r.ids, r.skip_special)}});
           }));

  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"})
    svr.Get(path, [path](const httplib::Request&, httplib::Response& res) {
      res.set_header("Allow", "POST");
      reply_error(res, 405, "invalid_request_error", std::string(path) + " takes POST with a JSON body");
    });

  // Errors httplib answers itself (unknown route, oversized body, malformed request) get the
  // same JSON shape; a handler's own error body is left alone.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                    httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string type = "invalid_request_error", message;
    switch (res.status) {
      case 404:
        type = "not_found_error";
        message = "no route for " + req.method + " " + req.path +
                  "; the routes are GET /health, GET /metrics, GET /v1/models, POST /v1/completions, POST "
                  "/v1/chat/completions, POST /tokenize, POST /detokenize";
        break;
      case 413:
        message = "request body: larger than " + std::to_string(opt.max_body_bytes) + " bytes";
        break;
      case 400:
        message = "the HTTP request could not be read (malformed, or a body without a length)";
        break;
      default:
        type = res.status >= 500 ? "server_error" : "invalid_request_error";
        message = "HTTP status " + std::to_string(res.status);
    }
    reply_error(res, res.status, type, message);
    return httplib::Server::HandlerResponse::Handled;
  }));

  // Handlers catch everything themselves; this is the backstop.
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(res, 500, "server_error", "internal error: " + what);
  });

  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    {
      std::lock_guard lk(counts_mu);
      ++http_counts.requests[{route_label(req.path), res.status}];
      if (t_log.prompt_tokens > 0) http_counts.prompt_tokens += t_log.prompt_tokens;
      if (t_log.generated > 0) http_counts.generated_tokens += t_log.generated;
    }
    if (opt.log_requests) {
      char seconds[32] = "-";
      if (t_log.started)
        std::snprintf(seconds, sizeof seconds, "%.3fs",
                      std::chrono::duration<double>(Clock::now() - t_log.start).count());
      std::string line = req.method + " " + req.path + " " + std::to_string(res.status) +
                         " prompt_tokens=" + count_or_dash(t_log.prompt_tokens) +
                         " generated_tokens=" + count_or_dash(t_log.generated) + " " + seconds;
      if (!t_log.note.empty()) line += " " + t_log.note;
      log::info(line);
    }
    t_log = RequestLog{};
  });
}

HttpServer::HttpServer(Model& model, const Tokenizer* tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, tokenizer, std::move(options))) {
  Impl& s = *impl_;
  const size_t threads = size_t(std::max(1, s.opt.http_threads));
  s.svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.svr.set_payload_max_length(s.opt.max_body_bytes);
  s.svr.set_tcp_nodelay(true);  // streamed chunks are small: send each at once
  s.svr.set_keep_alive_max_count(100);
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently share its connections; only SO_REUSEADDR (restart while old sockets linger) is kept.
  s.svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s.set_up_routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& s = *impl_;
  if (s.started || s.listener.joinable() || s.stopped) fail("serve", "the server was already started");
  // A client that disconnects mid-response must not kill the process: writes then fail instead.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  errno = 0;
  const int port = s.opt.port == 0 ? s.svr.bind_to_any_port(s.opt.host)
                                   : (s.svr.bind_to_port(s.opt.host, s.opt.port) ? s.opt.port : -1);
  const int bind_errno = errno;
  if (port <= 0)
    fail("serve",
         "cannot listen on " + s.opt.host + ":" + std::to_string(s.opt.port) +
             (bind_errno ? std::string(": ") + std::strerror(bind_errno) : std::string()),
         "another process may hold the port (pick another with --port, or --port 0 for any free one), or the "
         "host is not an address of this machine");
  s.port = port;
  s.listener = std::thread([&s] {
    s.svr.listen_after_bind();
    s.listen_ended = true;
  });
  // stop() must find the accept loop running (httplib ignores a stop() that comes earlier).
  while (!s.svr.is_running() && !s.listen_ended) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (s.listen_ended) {
    s.listener.join();
    fail("serve", "the HTTP listener on " + url() + " stopped at once");
  }
  s.started = true;
}

int HttpServer::port() const { return impl_->port; }

int64_t HttpServer::decode_state_bytes() const { return impl_->engine.decode_state_bytes(); }

EngineStats HttpServer::engine_stats() const { return impl_->engine.stats(); }

std::string HttpServer::url() const {
  const std::string& h = impl_->opt.host;
  return "http://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" +
         std::to_string(impl_->port);
}

bool HttpServer::running() const { return impl_->started && !impl_->listen_ended && !impl_->stopped; }

void HttpServer::stop() {
  Impl& s = *impl_;
  std::lock_guard lk(s.stop_mu);
  if (s.stopped) return;
  s.stopped = true;
  s.engine.shutdown();  // first, so that handlers waiting on the model return
  if (s.listener.joinable()) {
    if (!s.listen_ended) s.svr.stop();
    s.listener.join();
  }
}

}  // namespace zaya
