// `zaya serve`: loads a model once and serves it over HTTP (src/serve/http_server.h,
// docs/serving.md) until SIGINT or SIGTERM, then stops cleanly.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "commands.h"
#include "core/error.h"
#include "core/log.h"
#include "model/model_io.h"
#include "model_source.h"
#include "serve/http_server.h"

namespace zaya::cli {

namespace {

struct ServeCliOptions {
  std::string model_dir, tokenizer, host = "127.0.0.1", backend = "cpu", chat_template;
  int port = 8080, threads = 0, http_threads = 32;
  size_t max_queue = 16;
  int64_t batch = 8, prefill_chunk = 256, context = 0, keep_mib = 1024;
};

// The id clients see: the model directory's name ("runs/x/model/" -> "model").
std::string model_id_of(const std::string& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().empty() ? std::string("zaya") : p.filename().string();
}

void run_serve(const ServeCliOptions& o) {
  // SIGINT and SIGTERM are taken here with sigtimedwait, not by a handler: block them before
  // any thread starts (threads inherit the mask), so none of them is interrupted.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto be = make_backend(o.backend);
  auto model = load_model(o.model_dir, *be);
  be->set_weights_frozen(true);  // inference: a GPU converts each weight to bf16 once
  auto tok = find_tokenizer(o.tokenizer, o.model_dir);
  const ModelConfig& c = model->config();
  if (tok && tok->vocab_size() > c.vocab_size)
    log::warn("the tokenizer has " + std::to_string(tok->vocab_size()) + " tokens but the model " +
              std::to_string(c.vocab_size) +
              ": text that encodes to ids past the model's vocabulary is rejected");

  if (o.max_queue + 1 >= size_t(o.http_threads))
    log::warn(
        "--max-queue " + std::to_string(o.max_queue) + " with --http-threads " +
        std::to_string(o.http_threads) +
        ": completions waiting for the model can hold every HTTP thread, and /health then waits behind them");
  ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.model_id = model_id_of(o.model_dir);
  so.http_threads = o.http_threads;
  so.max_queue = o.max_queue;
  so.compute_threads = o.threads;
  so.max_batch = o.batch;
  so.prefill_chunk = o.prefill_chunk;
  so.context = o.context;
  so.keep_bytes = o.keep_mib << 20;
  so.chat_template = o.chat_template;
  HttpServer server(*model, tok.get(), so);
  server.start();
  char batch_line[200];
  std::snprintf(
      batch_line, sizeof batch_line,
      "decoding up to %lld completions together; their decode states take %.1f MiB (--batch and --context "
      "lower it)",
      (long long)o.batch, double(server.decode_state_bytes()) / double(1 << 20));
  log::info(batch_line);
  log::info(o.keep_mib > 0
                ? "keeping the states of prompts and finished completions, up to " +
                      std::to_string(o.keep_mib) +
                      " MiB, so that the same prompt again runs nothing and a conversation's next turn "
                      "prefills only its new message (--keep-mib)"
                : "keeping no states (--keep-mib 0): every prompt runs whole, but for the choices of one "
                  "prompt prefilled together");
  log::info("serving '" + so.model_id + "' (vocab " + std::to_string(c.vocab_size) + ", context " +
            std::to_string(o.context > 0 ? o.context : c.max_position_embeddings) + ", backend " + o.backend +
            ", " +
            (tok ? "tokenizer with " + std::to_string(tok->vocab_size()) + " tokens"
                 : "no tokenizer: token-id prompts only") +
            ", " +
            (o.chat_template.empty() ? std::string("no chat template: /v1/chat/completions answers 400")
                                     : "chat template " + o.chat_template) +
            ")");
  std::printf("zaya serve: listening on %s\n", server.url().c_str());
  std::fflush(stdout);

  int sig = 0;
  while (sig <= 0 && server.running()) {
    const timespec poll{0, 200 * 1000 * 1000};
    sig = sigtimedwait(&stop_signals, nullptr, &poll);
  }
  if (sig <= 0) {
    server.stop();
    fail("serve", "the HTTP listener on " + server.url() + " stopped unexpectedly");
  }
  log::info(std::string("received ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
            ": shutting down (a second signal exits at once)");
  std::thread([stop_signals] {
    int again = 0;
    if (sigwait(&stop_signals, &again) == 0) std::_Exit(128 + again);
  }).detach();
  server.stop();
  const EngineStats st = server.engine_stats();
  auto count = [](int64_t n, const std::string& one, const std::string& many) {
    return std::to_string(n) + " " + (n == 1 ? one : many);
  };
  char mean_batch[32];
  std::snprintf(mean_batch, sizeof mean_batch, "%.2f",
                st.decode_steps ? double(st.decoded_tokens) / double(st.decode_steps) : 0.0);
  log::info("stopped after " + count(st.completions, "completion", "completions") + "; " +
            count(st.decoded_tokens, "token", "tokens") + " decoded in " +
            count(st.decode_steps, "step", "steps") + " (mean batch " + mean_batch +
            "); prompts prefilled in " + count(st.prefill_chunks, "pass", "passes") + " (" +
            count(st.prefill_positions, "position", "positions") + ", up to " +
            count(st.peak_prefill_group, "prompt", "prompts") + " in one pass); " +
            count(st.prefills_reused, "completion", "completions") +
            " ran no prompt position (a kept state or another choice held the whole prompt); " +
            count(st.prefill_positions_reused, "prompt position", "prompt positions") +
            " not run again (a prompt extending a kept one); " +
            count(st.finished_continued, "completion", "completions") +
            " continued a finished completion (a conversation's next turn)");
}

}  // namespace

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve a model over HTTP (OpenAI-compatible completions)");
  static ServeCliOptions o;
  cmd->add_option("--model", o.model_dir, "Model directory")->required();
  cmd->add_option("--tokenizer", o.tokenizer, "tokenizer.json or .model (default: the model directory's)");
  cmd->add_option("--host", o.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o.port, "Port to listen on; 0 = any free port (the URL is printed)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--backend", o.backend, "cpu, or cuda in a GPU build")->capture_default_str();
  cmd->add_option("--threads", o.threads, "Compute threads for the model (0 = all cores)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--http-threads", o.http_threads,
                  "Connections handled at once (each open connection holds one)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option(
         "--batch", o.batch,
         "Completions decoded together (continuous batching); each holds a context-long decode state")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1024)));
  cmd->add_option("--prefill-chunk", o.prefill_chunk,
                  "Prompt positions prefilled between two decode steps of the running completions (new "
                  "prompts run together, up to this many positions per pass)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--context", o.context,
                  "Positions (prompt + generated) per completion; 0 = the model's max_position_embeddings. "
                  "Every decode state is this long")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--keep-mib", o.keep_mib,
                  "MiB of decode states kept, of prompts and finished completions, so that the same "
                  "prompt again runs nothing and a conversation's next turn, which sends the reply back, "
                  "prefills only its new message (least recently used first out); 0 = none")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  cmd->add_option("--chat-template", o.chat_template,
                  "How POST /v1/chat/completions turns messages into a prompt: a built-in (chatml, gemma, "
                  "llama3, plain) or a TOML template file; use the one the model was fine-tuned with");
  cmd->add_option("--max-queue", o.max_queue, "Completions that may wait for the model; more get HTTP 503")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->callback([] { run_serve(o); });
}

}  // namespace zaya::cli
