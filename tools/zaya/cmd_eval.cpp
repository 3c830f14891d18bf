// `zaya eval --model DIR --data PATH...`: held-out loss and perplexity of a model on a shard
// directory's split, a token file or text files (src/eval/). Text inputs also report bits per
// byte, which compares models with different tokenizers.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "eval/eval_data.h"
#include "eval/perplexity.h"
#include "model/model_io.h"
#include "model_source.h"

namespace zaya::cli {

namespace {

struct EvalCliOptions {
  std::string model_dir, tokenizer, backend = "cpu", out, split = "val", text_field = "text";
  std::vector<std::string> data;
  int64_t seq_len = 1024, batch = 4, max_tokens = 0;
};

void run_eval(const EvalCliOptions& o) {
  auto be = make_backend(o.backend);
  auto model = load_model(o.model_dir, *be);
  be->set_weights_frozen(true);
  auto tok = find_tokenizer(o.tokenizer, o.model_dir);
  EvalDataOptions dopt;
  dopt.split = o.split;
  dopt.text_field = o.text_field;
  const EvalTokens data = load_eval_tokens(o.data, tok.get(), dopt);
  const int64_t context = model->config().max_position_embeddings;
  if (context > 0 && o.seq_len > context)
    fail("eval", "--seq-len " + std::to_string(o.seq_len) + " exceeds the model's context (" +
                     std::to_string(context) + ")");
  std::fprintf(stderr, "[zaya] evaluating %s on %s: %zu tokens, %llu documents, windows of %lld tokens\n",
               o.model_dir.c_str(), data.description.c_str(), data.tokens.size(),
               (unsigned long long)data.documents, (long long)o.seq_len);
  PerplexityOptions po;
  po.seq_len = o.seq_len;
  po.batch = o.batch;
  po.max_tokens = o.max_tokens;
  const bool tty = isatty(2);
  po.progress = [tty](int64_t scored, int64_t total, double loss) {
    if (tty)
      std::fprintf(stderr, "\r\033[K%lld/%lld tokens | loss %.4f", (long long)scored, (long long)total, loss);
  };
  const PerplexityResult r = evaluate_perplexity(*model, data.tokens, po);
  if (tty) std::fprintf(stderr, "\r\033[K");
  std::printf("tokens scored     %lld (%lld windows of up to %lld)\n", (long long)r.scored_tokens,
              (long long)r.windows, (long long)o.seq_len);
  std::printf("loss              %.4f nats/token\n", r.loss);
  std::printf("perplexity        %.3f\n", r.perplexity);
  // Bits per byte only when every scored token belongs to the text whose bytes were counted.
  const bool whole_text = data.text_bytes > 0 && o.max_tokens == 0;
  const double bpb = whole_text ? r.loss_sum / std::log(2.0) / double(data.text_bytes) : 0;
  if (whole_text)
    std::printf("bits per byte     %.4f (%llu bytes of text)\n", bpb, (unsigned long long)data.text_bytes);
  std::printf("speed             %.0f tokens/s (%.2f s)\n", double(r.scored_tokens) / r.seconds, r.seconds);
  if (!o.out.empty()) {
    nlohmann::json j{
        {"model", o.model_dir},       {"data", data.description},  {"loss", r.loss},
        {"perplexity", r.perplexity}, {"tokens", r.scored_tokens}, {"windows", r.windows},
        {"seq_len", o.seq_len},       {"seconds", r.seconds},      {"documents", data.documents}};
    if (whole_text) j["bits_per_byte"] = bpb;
    std::ofstream f(o.out);
    f << j.dump(2) << '\n';
    if (!f) fail("eval", "cannot write " + o.out);
  }
}

}  // namespace

void add_eval(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("eval", "Held-out loss and perplexity on shards, a token file or text files");
  static EvalCliOptions o;
  cmd->add_option("--model", o.model_dir, "Model directory")->required();
  cmd->add_option("--data", o.data,
                  "A shard directory (zaya data prepare), a .bin token file, or .txt/.jsonl files and globs")
      ->required();
  cmd->add_option("--split", o.split, "Shard directories: the split to score")->capture_default_str();
  cmd->add_option("--text-field", o.text_field, "JSONL: the field holding the text")->capture_default_str();
  cmd->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json or .model for text (default: the model directory's)");
  cmd->add_option("--seq-len", o.seq_len, "Tokens of context per window")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", o.batch, "Windows per forward pass")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-tokens", o.max_tokens, "Score at most this many tokens (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--backend", o.backend, "cpu, or cuda in a GPU build")->capture_default_str();
  cmd->add_option("--out", o.out, "Also write the results as JSON here");
  cmd->callback([] { run_eval(o); });
}

}  // namespace zaya::cli
