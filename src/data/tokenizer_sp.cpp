// SentencePiece .model wrapper. Invalid UTF-8 is replaced by U+FFFD before encoding;
// add_special prepends BOS (and appends nothing), as Llama-style SentencePiece setups do.
// decode follows SentencePiece: control tokens (bos/eos/pad) never produce text.
#include "data/tokenizer_sp.h"

#include <fstream>

#include <sentencepiece_processor.h>

#include "core/error.h"
#include "data/tokenizer_utf8.h"

namespace zaya {

namespace {

class SpTokenizer final : public Tokenizer {
 public:
  explicit SpTokenizer(const std::string& path) : path_(path) {
    if (!std::ifstream(path, std::ios::binary))
      fail("tokenizer", path + ": cannot open file", "check the path");
    auto status = sp_.Load(path);
    if (!status.ok())
      fail("tokenizer", path + ": not a valid SentencePiece model: " + status.ToString());
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::string clean;
    if (!tok::utf8_valid(text)) {
      clean = tok::utf8_sanitize(text);
      text = clean;
    }
    std::vector<int> ids;
    auto status = sp_.Encode(std::string(text), &ids);
    if (!status.ok()) fail("tokenizer", path_ + ": encode failed: " + status.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 1);
    if (add_special && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::vector<int> in;
    in.reserve(ids.size());
    const int n = sp_.GetPieceSize();
    for (int32_t id : ids) {
      if (id < 0 || id >= n) continue;
      if (skip_special && sp_.IsControl(id)) continue;
      in.push_back(id);
    }
    std::string text;
    auto status = sp_.Decode(in, &text);
    if (!status.ok()) fail("tokenizer", path_ + ": decode failed: " + status.ToString());
    return text;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }

  int32_t token_to_id(std::string_view token) const override {
    int id = sp_.PieceToId(std::string(token));
    if (id == sp_.unk_id() && sp_.IdToPiece(id) != token) return -1;
    return id;
  }

  std::string id_to_token(int32_t id) const override {
    if (id < 0 || id >= sp_.GetPieceSize()) return {};
    return sp_.IdToPiece(id);
  }

  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sp_tokenizer(const std::string& path) {
  return std::make_unique<SpTokenizer>(path);
}

}  // namespace zaya
