// Writing token shards (.zshard, see shard_format.h) and the `zaya data prepare` pipeline:
// corpus files -> parallel tokenisation (order preserved) -> EOS-terminated documents ->
// rolling shards of about a target size -> manifest.json. Output is byte-for-byte
// deterministic: the same inputs, tokenizer and options give identical files regardless of
// the thread count (no timestamps, no absolute output paths, fixed order).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "data/shard_reader.h"

namespace zaya {

// CRC-32C of the tokenizer's bytes: the file itself, or for a directory the file
// load_tokenizer would pick (tokenizer.json, else tokenizer.model). Throws naming the path.
uint32_t tokenizer_file_hash(const std::string& path);

// The deterministic train/val split: document number `index` (0-based, in input order,
// counting every document read including skipped empty ones) goes to val when
// splitmix64(index) / 2^64 < val_fraction.
bool is_val_document(uint64_t index, double val_fraction);

// Writes one split as rolling shards DIR/PREFIX-00000.zshard, PREFIX-00001.zshard, ...
// A shard is closed before a document that would take it past `target_bytes` (the whole
// file: header, tokens, index); documents are never split, so a document larger than the
// target gets a shard of its own. Files are written via a temporary name and renamed.
class ShardWriter {
 public:
  struct Options {
    std::string dir;
    std::string prefix = "train";
    uint64_t target_bytes = 256ull << 20;
    uint32_t tokenizer_hash = 0;
    uint64_t vocab_size = 0;
    bool loss_mask = false;  // every document comes with a loss mask (format version 2)
  };
  explicit ShardWriter(Options options);
  ~ShardWriter();  // removes a half-written temporary file if finish() was not reached
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends one document (its tokens, EOS included). `source` names the input file for the
  // manifest's per-shard source list. Throws if a token id is >= vocab size. With
  // Options::loss_mask, `mask` holds one byte per token (1 = a training target, 0 = context);
  // without it, `mask` must be empty.
  void add_document(std::span<const uint32_t> tokens, const std::string& source,
                    std::span<const uint8_t> mask = {});
  // Closes the last shard and returns the split's manifest entry.
  ManifestSplit finish();

 private:
  void open_shard();
  void close_shard();
  Options opt_;
  ManifestSplit split_;
  int fd_ = -1;
  std::string tmp_path_, path_;
  uint64_t shard_tokens_ = 0;
  uint32_t tokens_crc_ = 0;
  std::vector<uint64_t> index_;
  std::vector<uint8_t> mask_;  // the open shard's loss mask (written after the index)
  std::vector<std::string> sources_;
  std::vector<uint8_t> buf_;
};

// Writes DIR/manifest.json (atomically, via a temporary file), formatted deterministically.
void write_manifest(const std::string& dir, const Manifest& manifest);

struct PrepareProgress {
  uint64_t bytes_read = 0, bytes_total = 0;  // input file bytes done / in all (compressed for .gz / .zst)
  uint64_t documents = 0, tokens = 0;
  double seconds = 0;
  bool done = false;
};

struct PrepareOptions {
  std::string tokenizer;                 // tokenizer.json / .model / directory
  std::vector<std::string> inputs;       // files or glob patterns
  std::string out_dir;
  std::string text_field = "text";       // JSONL field holding the document
  // Supervised fine-tuning: both set = each JSONL record holds a prompt and a completion; the
  // document is prompt + completion + EOS and only the completion and EOS are training targets
  // (the shards carry a loss mask). Both empty = plain documents from text_field.
  std::string prompt_field, completion_field;
  // Chat records (both set): each JSONL record's message list (messages_field) rendered by the chat
  // template (a built-in's name or a TOML file, chat_template.h); the assistant's replies and the
  // tokens that end them are the only targets.
  std::string messages_field, chat_template;
  uint64_t shard_bytes = 256ull << 20;   // target shard size
  double val_fraction = 0.0;             // 0 = no validation split
  int threads = 0;                       // tokeniser threads; 0 = hardware concurrency
  size_t batch_bytes = 1 << 20;          // text per work item
  std::function<void(const PrepareProgress&)> progress;  // called at most ~10 times a second
};

struct PrepareResult {
  Manifest manifest;
  uint64_t documents = 0, skipped = 0, tokens = 0;
  uint64_t target_tokens = 0;  // supervised fine-tuning data: tokens whose loss mask is 1
};

// Runs the whole pipeline. Stale PREFIX-NNNNN.zshard files of earlier runs in out_dir are
// removed so the directory holds exactly what the manifest lists.
PrepareResult prepare_shards(const PrepareOptions& options);

}  // namespace zaya
