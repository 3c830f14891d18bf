// Tokenizers: Hugging Face tokenizer.json (BPE with byte fallback, normalizers,
// pre-tokenizers, added/special tokens, decoders) and SentencePiece .model files.
// Both sit behind one interface so the CLI, data pipeline and server do not care which.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zaya {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes UTF-8 text. Invalid UTF-8 bytes are treated as U+FFFD. add_special adds the
  // tokenizer's configured special tokens (e.g. BOS) as its post-processor says.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special = false) const = 0;
  // Decodes ids to UTF-8 text; skip_special drops special/control tokens.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t token_to_id(std::string_view token) const = 0;  // -1 if absent
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
};

// Loads a tokenizer from a path: a tokenizer.json file, a SentencePiece .model file, or a
// directory containing tokenizer.json or tokenizer.model. Throws zaya::Error naming the file.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace zaya
