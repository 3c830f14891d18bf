// Reading token shards (.zshard, see shard_format.h and docs/formats.md) and shard datasets
// (a directory with manifest.json). Opening validates the header, the section bounds and the
// whole document index; every malformed input is a zaya::Error naming the file and the field,
// and no accessor can read outside the mapping (out-of-range requests throw).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/shard_format.h"

namespace zaya {

enum class ShardVerify {
  Structure,  // header, header CRC, section bounds, document index (O(documents))
  Full,       // also the tokens and index CRCs and every token id < vocab size (O(tokens))
};

// Validates a whole shard image held in memory and returns its header. `source` names the
// file in errors. Used by ShardReader::open and by the fuzzer; reads only bytes[0, size).
ShardHeader parse_shard(const uint8_t* bytes, size_t size, const std::string& source,
                        ShardVerify verify = ShardVerify::Structure);

// One memory-mapped shard.
class ShardReader {
 public:
  static std::unique_ptr<ShardReader> open(const std::string& path, ShardVerify verify = ShardVerify::Structure);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return header_; }
  uint64_t tokens() const { return header_.token_count; }
  uint64_t documents() const { return header_.document_count; }
  // All tokens of the shard, contiguous (the mapping itself; no copy).
  std::span<const uint32_t> token_span() const { return {tokens_, size_t(header_.token_count)}; }
  // The document index: documents() + 1 offsets, first 0, last tokens().
  std::span<const uint64_t> index() const { return {index_, size_t(header_.document_count + 1)}; }
  // Tokens of document d (including its trailing EOS). Throws if d >= documents().
  std::span<const uint32_t> document(uint64_t d) const;
  // Tokens [offset, offset + n). Throws if the range leaves the shard.
  std::span<const uint32_t> tokens(uint64_t offset, uint64_t n) const;
  // CRC-32C of the whole file (reads every byte; compare with the manifest's checksum).
  uint32_t file_crc() const;
  // The loss mask (format version 2, flag bit 0): one byte per token, nonzero where the token
  // is a training target. Empty when the shard has none (every token is a target).
  bool has_loss_mask() const { return mask_ != nullptr; }
  std::span<const uint8_t> loss_mask_span() const {
    return mask_ ? std::span<const uint8_t>(mask_, size_t(header_.token_count)) : std::span<const uint8_t>();
  }

 private:
  ShardReader() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  ShardHeader header_;
  const uint32_t* tokens_ = nullptr;
  const uint64_t* index_ = nullptr;
  const uint8_t* mask_ = nullptr;
};

// manifest.json of a shard directory.
struct ManifestShard {
  std::string file;  // plain file name inside the directory
  uint64_t bytes = 0;
  uint32_t checksum = 0;  // CRC-32C of the whole file
  uint64_t tokens = 0;
  uint64_t documents = 0;
  std::vector<std::string> sources;  // input files that contributed documents, in input order
};

struct ManifestSplit {
  uint64_t tokens = 0;
  uint64_t documents = 0;
  std::vector<ManifestShard> shards;
};

struct ManifestSource {
  std::string path;
  uint64_t documents = 0;  // documents read (including skipped empty ones)
  uint64_t skipped = 0;    // empty documents dropped
};

struct Manifest {
  uint32_t version = kManifestVersion;
  std::string tokenizer_path;
  uint32_t tokenizer_hash = 0;
  uint64_t vocab_size = 0;
  int64_t eos_id = -1;
  std::string text_field = "text";
  double val_fraction = 0.0;
  uint64_t shard_bytes = 0;  // target shard size
  // Supervised fine-tuning data (`zaya data prepare --prompt-field P --completion-field C`):
  // every shard carries a loss mask, prompts are context and completions are targets.
  bool loss_mask = false;
  std::string prompt_field, completion_field;
  // Chat data (`zaya data prepare --messages-field F --chat-template T`), instead of the two above.
  std::string messages_field, chat_template;
  std::vector<ManifestSource> sources;
  std::map<std::string, ManifestSplit> splits;  // "train", "val"
};

// Reads and validates DIR/manifest.json (structure only; shards are checked when opened).
Manifest read_manifest(const std::string& dir);

// All shards of one split of a shard directory, addressed by global token offset and global
// document number.
class ShardDataset {
 public:
  struct Options {
    std::string split = "train";
    std::optional<uint32_t> expected_tokenizer_hash;  // checked against manifest and shard headers
    ShardVerify verify = ShardVerify::Structure;      // Full also checks each file's manifest CRC
  };
  static ShardDataset open(const std::string& dir, const Options& options);
  static ShardDataset open(const std::string& dir) { return open(dir, Options{}); }

  const Manifest& manifest() const { return manifest_; }
  const std::string& split() const { return split_; }
  uint64_t tokens() const { return total_tokens_; }
  uint64_t documents() const { return total_documents_; }
  uint64_t vocab_size() const { return manifest_.vocab_size; }
  size_t shard_count() const { return shards_.size(); }
  const ShardReader& shard(size_t i) const { return *shards_[i]; }

  // The token at a global offset. Throws if offset >= tokens().
  uint32_t token(uint64_t offset) const;
  // Copies tokens [offset, offset + n) into dst, crossing shard boundaries. Throws if the range
  // leaves the dataset.
  void read(uint64_t offset, uint64_t n, uint32_t* dst) const;
  // Document d of the split (documents never cross shards). Throws if d >= documents().
  std::span<const uint32_t> document(uint64_t d) const;
  // Global token offset of document d's first token. Throws if d >= documents().
  uint64_t document_start(uint64_t d) const;
  // Whether the split carries a loss mask (the manifest says so and every shard has one).
  bool has_loss_mask() const { return manifest_.loss_mask; }
  // Copies the loss mask of tokens [offset, offset + n) into dst (1 = a training target; all 1
  // without a mask). Throws if the range leaves the dataset.
  void read_loss_mask(uint64_t offset, uint64_t n, uint8_t* dst) const;

 private:
  size_t shard_of_doc(uint64_t d) const;
  size_t shard_of_token(uint64_t offset) const;
  // Calls piece(shard, offset in the shard, count, tokens done before it) for the pieces of
  // global tokens [offset, offset + n), in order. Throws naming `what` if the range leaves the
  // split.
  void for_each_piece(
      uint64_t offset, uint64_t n, const char* what,
      const std::function<void(const ShardReader&, uint64_t, uint64_t, uint64_t)>& piece) const;
  std::string dir_, split_;
  Manifest manifest_;
  std::vector<std::unique_ptr<ShardReader>> shards_;
  std::vector<uint64_t> token_starts_;  // shard i holds global tokens [starts[i], starts[i+1])
  std::vector<uint64_t> doc_starts_;
  uint64_t total_tokens_ = 0, total_documents_ = 0;
};

}  // namespace zaya
