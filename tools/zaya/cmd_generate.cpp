// `zaya generate`: prefill the prompt, then decode token by token with the incremental
// state, streaming text as it is produced; stops at EOS or --max-tokens.
#include <chrono>
#include <cstdio>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "model/model_io.h"
#include "model_source.h"
#include "serve/completion_text.h"
#include "serve/generate.h"

namespace zaya::cli {

namespace {

struct GenerateOptions {
  std::string model_dir, prompt, ids, tokenizer, backend = "cpu";
  int64_t max_tokens = 64;
  float temperature = 0.8f;
  int64_t top_k = 40;
  float top_p = 0.95f;
  float presence_penalty = 0, frequency_penalty = 0;
  uint64_t seed = 0;
};

void run_generate(const GenerateOptions& o) {
  if (o.prompt.empty() == o.ids.empty()) fail("generate", "pass exactly one of --prompt TEXT or --ids 1,2,3");
  auto be = make_backend(o.backend);
  auto model = load_model(o.model_dir, *be);
  be->set_weights_frozen(true);  // inference: a GPU converts each weight to bf16 once
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
  // Text streams as the server's does (serve/completion_text.h): decoded over the prompt's tail
  // + generated ids so spacing at the seam is right, incomplete UTF-8 held back until whole.
  // A prompt given as --ids has no text to continue: the generated ids are decoded on their own.
  // Without a tokenizer ids are printed instead.
  const bool text_out = tok != nullptr;
  CompletionText text(
      tok.get(), o.prompt.empty() ? std::vector<int32_t>{} : id_tail(prompt, CompletionText::kContextTail),
      {});
  if (text_out && !o.prompt.empty()) std::printf("%s", o.prompt.c_str());
  std::fflush(stdout);
  SamplingParams sp{o.temperature, o.top_k, o.top_p};
  sp.presence_penalty = o.presence_penalty;
  sp.frequency_penalty = o.frequency_penalty;
  int64_t printed_ids = 0;
  GenerateStats st = generate(*model, prompt, o.max_tokens, sp, o.seed, [&](int32_t next, const float*) {
    if (text_out)
      std::printf("%s", text.push(next).text.c_str());
    else
      std::printf("%s%d", printed_ids++ > 0 ? " " : "", next);
    std::fflush(stdout);
    return true;
  });
  if (text_out) std::printf("%s", text.finish().c_str());
  std::printf("\n");
  std::fprintf(stderr, "[zaya] prompt %lld tokens in %.3fs (%.1f tok/s); generated %lld tokens, %.1f tok/s decode%s\n",
               (long long)st.prompt_tokens, st.prefill_seconds, double(st.prompt_tokens) / st.prefill_seconds,
               (long long)st.generated, st.decode_steps > 0 ? double(st.decode_steps) / st.decode_seconds : 0.0,
               st.stopped_at_eos ? " (stopped at EOS)" : "");
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
  cmd->add_option("--presence-penalty", o.presence_penalty,
                  "Subtracted from the logit of every token already generated (OpenAI's presence_penalty)")
      ->capture_default_str()
      ->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", o.frequency_penalty,
                  "Times a token's count so far, subtracted from its logit (OpenAI's frequency_penalty)")
      ->capture_default_str()
      ->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--seed", o.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--backend", o.backend, "cpu, or cuda in a GPU build")->capture_default_str();
  cmd->callback([] { run_generate(o); });
}

}  // namespace zaya::cli
