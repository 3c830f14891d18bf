// `zaya chat`: talk to a model in the terminal. Each line read from stdin is a user message; the
// reply streams to stdout, rendered and stopped by the chat template the model was fine-tuned
// with (serve/chat_session.h: a turn prefills only its new message). "/reset" starts over and
// "/exit" (or the end of input) ends; one line per turn on stderr says what ran. A turn that
// fails (a conversation that no longer fits the context) is reported and the chat goes on; the
// exit status is then 1.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "data/chat_template.h"
#include "model/model_io.h"
#include "model_source.h"
#include "serve/chat_session.h"

namespace zaya::cli {

namespace {

struct ChatOptions {
  std::string model_dir, tokenizer, chat_template, system, backend = "cpu";
  int64_t max_tokens = 256, context = 0, top_k = 40;
  float temperature = 0.8f, top_p = 0.95f;
  uint64_t seed = 0;
};

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Returns false when a turn failed (each failure is reported and the chat goes on).
bool run_chat(const ChatOptions& o) {
  if (!(o.temperature >= 0)) fail("chat", "--temperature must be >= 0 (0 = greedy)");
  if (!(o.top_p > 0 && o.top_p <= 1)) fail("chat", "--top-p must be in (0, 1]");
  auto be = make_backend(o.backend);
  auto model = load_model(o.model_dir, *be);
  be->set_weights_frozen(true);
  auto tok = find_tokenizer(o.tokenizer, o.model_dir);
  if (!tok)
    fail("chat", o.model_dir + " has no tokenizer.json or tokenizer.model, and a chat needs one",
         "pass --tokenizer PATH");
  const ChatFormat format(load_chat_template(o.chat_template), *tok);
  ChatSession session(*model, *tok, format, o.context);
  if (!o.system.empty()) session.add("system", o.system);
  // The "> " prompt goes to stderr, so that a transcript redirected from stdout holds replies only.
  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive)
    std::fprintf(stderr,
                 "[zaya] chatting with %s (template %s, context %lld); /reset starts over, /exit ends\n",
                 o.model_dir.c_str(), o.chat_template.c_str(), (long long)session.context());
  SamplingParams sampling{o.temperature, o.top_k, o.top_p};
  uint64_t seed = o.seed;
  bool all_ok = true;
  std::string line;
  for (;;) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) {
      if (interactive) std::fputs("\n", stderr);
      break;
    }
    line = trimmed(line);
    if (line.empty()) continue;
    if (line == "/exit") break;
    if (line == "/reset") {
      session.reset();
      std::fprintf(stderr, "[zaya] the conversation starts over\n");
      continue;
    }
    if (line[0] == '/' && line.find(' ') == std::string::npos) {
      std::fprintf(stderr, "[zaya] unknown command %s: /reset starts over, /exit ends\n", line.c_str());
      continue;
    }
    bool streamed = false;
    try {
      const ChatSession::Turn t =
          session.say(line, sampling, seed++, o.max_tokens, [&](const std::string& piece) {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
            streamed = true;
          });
      std::printf("\n");
      std::fflush(stdout);
      std::fprintf(
          stderr, "[zaya] %lld prompt tokens (%lld prefilled, %.3fs), %zu reply tokens (%.1f tok/s), %s\n",
          (long long)t.prompt_tokens, (long long)t.prefilled, t.prefill_seconds, t.ids.size(),
          t.decode_seconds > 0 ? double(t.ids.size()) / t.decode_seconds : 0.0, t.finish_reason.c_str());
    } catch (const Error& e) {
      if (streamed) std::printf("\n");
      std::fflush(stdout);
      std::fprintf(stderr, "[zaya] error: %s\n", e.what());
      all_ok = false;
    }
  }
  return all_ok;
}

}  // namespace

void add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "chat", "Talk to a model: each stdin line is a user message, replies stream to stdout");
  static ChatOptions o;
  cmd->add_option("--model", o.model_dir, "Model directory")->required();
  cmd->add_option(
         "--chat-template", o.chat_template,
         "How messages become tokens: a built-in (chatml, gemma, llama3, plain) or a TOML file; the one "
         "the model was fine-tuned with")
      ->required();
  cmd->add_option("--tokenizer", o.tokenizer, "tokenizer.json or .model (default: the model directory's)");
  cmd->add_option("--system", o.system, "A system message that starts the conversation");
  cmd->add_option("--max-tokens", o.max_tokens, "Tokens per reply at most")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--context", o.context, "Positions the conversation may use (0: the model's)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", o.temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", o.top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Sampling seed of the first reply (the next ones add 1 each)")
      ->capture_default_str();
  cmd->add_option("--backend", o.backend, "cpu, or cuda in a GPU build")->capture_default_str();
  cmd->callback([] {
    if (!run_chat(o)) throw CLI::RuntimeError(1);  // a turn failed: said above, and the exit status says so
  });
}

}  // namespace zaya::cli
