// `zaya generate`: prefill the prompt, then decode token by token with the incremental
// state, streaming text as it is produced; stops at EOS or --max-tokens.
#include <chrono>
#include <cstdio>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "model/model_io.h"
#include "model_source.h"
#include "serve/sampling.h"

namespace zaya::cli {

namespace {

struct GenerateOptions {
  std::string model_dir, prompt, ids, tokenizer;
  int64_t max_tokens = 64;
  float temperature = 0.8f;
  int64_t top_k = 40;
  float top_p = 0.95f;
  uint64_t seed = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_generate(const GenerateOptions& o) {
  if (o.prompt.empty() == o.ids.empty()) fail("generate", "pass exactly one of --prompt TEXT or --ids 1,2,3");
  auto be = make_cpu_backend();
  auto model = load_model(o.model_dir, *be);
  const ModelConfig& c = model->config();
  auto tok = find_tokenizer(o.tokenizer, o.model_dir);
  std::vector<int32_t> prompt;
  if (!o.ids.empty()) {
    prompt = parse_id_list(o.ids);
  } else {
    if (!tok) fail("generate", "--prompt needs a tokenizer, and " + o.model_dir + " has no tokenizer.json or tokenizer.model",
                   "pass --tokenizer PATH or use --ids");
    prompt = tok->encode(o.prompt, /*add_special=*/true);
  }
  if (prompt.empty()) fail("generate", "the prompt encodes to no tokens");
  const int64_t ctx = int64_t(prompt.size()) + o.max_tokens;
  if (ctx > c.max_position_embeddings)
    fail("generate", "prompt + --max-tokens = " + std::to_string(ctx) + " exceeds max_position_embeddings " +
                         std::to_string(c.max_position_embeddings));

  DecodeState state(c, *be, 1, ctx);
  std::vector<float> logits(size_t(c.vocab_size));
  ForwardOutputs out;
  out.logits = logits.data();
  out.last_only = true;
  auto t0 = std::chrono::steady_clock::now();
  model->forward(prompt.data(), 1, int64_t(prompt.size()), &state, out);
  const double prefill_s = seconds_since(t0);

  SamplingParams sp{o.temperature, o.top_k, o.top_p};
  Rng rng(o.seed);
  std::vector<int32_t> generated;
  std::string printed;
  if (tok && !o.prompt.empty()) std::printf("%s", o.prompt.c_str());
  std::fflush(stdout);
  auto t1 = std::chrono::steady_clock::now();
  int64_t decoded = 0;
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    int32_t next = sample_token(logits.data(), c.vocab_size, sp, rng);
    bool eos = false;
    for (int64_t e : c.eos_token_ids) eos |= next == e;
    if (eos) break;
    generated.push_back(next);
    if (tok) {
      std::string text = tok->decode(generated, /*skip_special=*/true);
      // Hold back an incomplete UTF-8 sequence (decoded as U+FFFD at the end).
      bool partial = text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
      if (!partial && text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
        std::printf("%s", text.c_str() + printed.size());
        printed = text;
      }
    } else {
      std::printf("%s%d", i ? " " : "", next);
    }
    std::fflush(stdout);
    if (i + 1 == o.max_tokens) break;
    model->forward(&next, 1, 1, &state, out);
    ++decoded;
  }
  const double decode_s = seconds_since(t1);
  std::printf("\n");
  std::fprintf(stderr, "[zaya] prompt %zu tokens in %.3fs (%.1f tok/s); generated %zu tokens, %.1f tok/s decode\n",
               prompt.size(), prefill_s, double(prompt.size()) / prefill_s, generated.size(),
               decoded > 0 ? double(decoded) / decode_s : 0.0);
}

}  // namespace

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt, streaming as it goes");
  static GenerateOptions o;
  cmd->add_option("--model", o.model_dir, "Model directory")->required();
  cmd->add_option("--prompt", o.prompt, "Prompt text (needs a tokenizer)");
  cmd->add_option("--ids", o.ids, "Prompt as comma-separated token ids");
  cmd->add_option("--tokenizer", o.tokenizer, "tokenizer.json or .model (default: the model directory's)");
  cmd->add_option("--max-tokens", o.max_tokens, "Tokens to generate")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o.temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", o.top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Sampling seed")->capture_default_str();
  cmd->callback([] { run_generate(o); });
}

}  // namespace zaya::cli
