// `zaya data prepare`: tokenises corpus files into bundled token shards (.zshard) with a
// manifest; `zaya data stats`: counts, document-length histogram and top tokens of a shard
// directory. The work lives in src/data (shard_writer, data_stats).
#include <unistd.h>

#include <algorithm>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "ckpt/checksum.h"
#include "core/error.h"
#include "data/data_stats.h"
#include "data/phase_report.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"
#include "train/recipe.h"
#include "train/train_data.h"

namespace zaya::cli {

namespace {

std::string human_count(double v) {
  char b[32];
  if (v >= 1e9) std::snprintf(b, sizeof b, "%.2fB", v / 1e9);
  else if (v >= 1e6) std::snprintf(b, sizeof b, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

// A one-line progress bar on stderr: redrawn in place on a terminal, a line every few
// seconds otherwise (logs stay readable).
class ProgressBar {
 public:
  ProgressBar() : tty_(::isatty(2) != 0) {}
  void operator()(const PrepareProgress& p) {
    if (!tty_ && !p.done && p.seconds - last_line_ < 5.0) return;
    last_line_ = p.seconds;
    const double mb = double(p.bytes_read) / 1e6, total = double(p.bytes_total) / 1e6;
    const double frac = p.bytes_total ? std::min(1.0, double(p.bytes_read) / double(p.bytes_total)) : 1.0;
    const int width = 30, filled = int(std::lround(frac * width));
    std::string bar(size_t(filled), '=');
    if (filled < width) bar += '>' + std::string(size_t(width - filled - 1), ' ');
    std::fprintf(stderr, "%s[%s] %5.1f%% %.1f/%.1f MB %.1f MB/s %s docs %s tokens%s", tty_ ? "\r" : "", bar.c_str(),
                 100.0 * frac, mb, total, p.seconds > 0 ? mb / p.seconds : 0.0, human_count(double(p.documents)).c_str(),
                 human_count(double(p.tokens)).c_str(), tty_ && !p.done ? "\033[K" : "\n");
    std::fflush(stderr);
  }

 private:
  bool tty_;
  double last_line_ = -1e9;
};

}  // namespace

void add_data_prepare(CLI::App* data) {
  auto* prep = data->add_subcommand("prepare", "Tokenise .txt/.jsonl(.gz/.zst) files into token shards (.zshard)");
  static PrepareOptions opt;
  static double shard_mb = 256;
  prep->add_option("--tokenizer", opt.tokenizer, "tokenizer.json, .model, or a directory holding one")->required();
  prep->add_option("--input", opt.inputs, "Input files or quoted globs (.txt, .jsonl, optionally .gz/.zst)")
      ->required();
  prep->add_option("--out", opt.out_dir, "Output directory (shards + manifest.json)")->required();
  prep->add_option("--text-field", opt.text_field, "JSONL field holding the document text")->capture_default_str();
  prep->add_option(
      "--prompt-field", opt.prompt_field,
      "Supervised fine-tuning (with --completion-field): JSONL field holding the prompt (or an array: "
      "a conversation's prompts), context only");
  prep->add_option(
      "--completion-field", opt.completion_field,
      "Supervised fine-tuning (with --prompt-field): JSONL field holding the completion (or an array: "
      "the conversation's replies), the only training targets");
  prep->add_option(
      "--messages-field", opt.messages_field,
      "Supervised fine-tuning of chats (with --chat-template): JSONL field holding a message list "
      "[{\"role\", \"content\"}, ...]; the assistant's replies are the only training targets");
  prep->add_option("--chat-template", opt.chat_template,
                   "With --messages-field: how messages become tokens, a built-in (chatml, gemma, llama3, "
                   "plain) or a TOML template file; serve the model with the same one");
  prep->add_option("--shard-size-mb", shard_mb, "Target shard size in MB (MiB)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  prep->add_option("--val-fraction", opt.val_fraction, "Fraction of documents held out for validation")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  prep->add_option("--threads", opt.threads, "Tokeniser threads (0: all cores)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  prep->callback([] {
    opt.shard_bytes = uint64_t(std::llround(shard_mb * 1024.0 * 1024.0));
    auto bar = std::make_shared<ProgressBar>();
    opt.progress = [bar](const PrepareProgress& p) { (*bar)(p); };
    PrepareResult r = prepare_shards(opt);
    const bool chat = !opt.messages_field.empty(), sft = chat || !opt.completion_field.empty();
    std::printf("wrote %s: %llu %s (%llu %s skipped), %llu tokens\n", opt.out_dir.c_str(),
                (unsigned long long)r.documents,
                chat  ? "chat records"
                : sft ? "prompt/completion records"
                      : "documents",
                (unsigned long long)r.skipped,
                chat  ? "with no reply"
                : sft ? "with no completion"
                      : "empty",
                (unsigned long long)r.tokens);
    if (sft)
      std::printf("  loss mask: %llu of the %llu tokens are %s targets (%.1f%%); %s are context only\n",
                  (unsigned long long)r.target_tokens, (unsigned long long)r.tokens,
                  chat ? "reply" : "completion",
                  r.tokens ? 100.0 * double(r.target_tokens) / double(r.tokens) : 0.0,
                  chat ? "the other messages and the template's text" : "prompts");
    for (const auto& [name, split] : r.manifest.splits)
      std::printf("  %-5s %zu shards, %llu documents, %llu tokens\n", name.c_str(), split.shards.size(),
                  (unsigned long long)split.documents, (unsigned long long)split.tokens);
  });

  auto* stats = data->add_subcommand(
      "stats", "Token and document statistics of a shard directory, or a recipe's mixture-weighted totals per phase");
  static std::string dir, tokenizer, recipe_path;
  static size_t top = 20;
  stats->add_option("dir", dir, "Directory written by `zaya data prepare`");
  stats->add_option("--recipe", recipe_path, "Training recipe: tokens per phase and dataset ([[phases]])");
  stats->add_option("--tokenizer", tokenizer, "Tokenizer to decode the top tokens (default: the manifest's)");
  stats->add_option("--top", top, "How many top tokens to list")->capture_default_str();
  stats->callback([] {
    if (dir.empty() && recipe_path.empty()) fail("data", "zaya data stats needs a shard directory or --recipe FILE");
    if (!recipe_path.empty()) {
      Recipe r = resolve_recipe(recipe_path, {});
      std::vector<PhaseSpec> phases = recipe_phases(r);
      if (phases.empty()) fail("data", recipe_path + ": the recipe reads a flat token file; no phases or shards to report");
      // The open-ended last phase runs to the end of the schedule (batch ramp not counted).
      int64_t steps_left = r.schedule.total_steps;
      for (const PhaseSpec& p : phases)
        if (p.tokens > 0) steps_left -= p.tokens / (r.batch.global_batch * p.seq_len);
      const int64_t last = std::max<int64_t>(0, steps_left) * r.batch.global_batch * phases.back().seq_len;
      std::printf("%s: %zu phase%s, global batch %lld sequences, %lld steps\n", recipe_path.c_str(), phases.size(),
                  phases.size() == 1 ? "" : "s", (long long)r.batch.global_batch, (long long)r.schedule.total_steps);
      std::fputs(format_phase_mixture(phases, phase_mixture(phases, last), last).c_str(), stdout);
      if (dir.empty()) return;
    }
    std::vector<SplitStats> s = compute_data_stats(dir, top);
    const Manifest m = read_manifest(dir);
    std::unique_ptr<Tokenizer> tok;
    std::string tpath = tokenizer.empty() ? m.tokenizer_path : tokenizer;
    std::error_code ec;
    if (!tpath.empty() && std::filesystem::exists(tpath, ec)) {
      if (tokenizer_file_hash(tpath) != m.tokenizer_hash)
        std::fprintf(stderr, "zaya: warning: %s differs from the tokenizer the shards were made with; not decoding\n",
                     tpath.c_str());
      else
        tok = load_tokenizer(tpath);
    }
    std::printf("%s (tokenizer %s, crc32c %s, vocab %llu)\n", dir.c_str(), m.tokenizer_path.c_str(),
                checksum_hex(m.tokenizer_hash).c_str(), (unsigned long long)m.vocab_size);
    std::fputs(format_data_stats(s, tok.get()).c_str(), stdout);
  });
}

}  // namespace zaya::cli
