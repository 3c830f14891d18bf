// HfTokenizer: ties the tokenizer.json stages together. encode: lenient UTF-8 -> split on
// raw added tokens -> normalize -> split on normalized added tokens -> pre-tokenize -> BPE ->
// post-process. decode: ids -> token strings -> decoder chain.
#include "data/tokenizer_hf.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <unordered_map>

#include "core/error.h"
#include "data/tokenizer_hf_added.h"
#include "data/tokenizer_hf_bpe.h"
#include "data/tokenizer_hf_json.h"
#include "data/tokenizer_hf_pipeline.h"
#include "data/tokenizer_utf8.h"

namespace zaya {

using nlohmann::json;
// The pipeline's parts (a using-declaration each, not a using-directive: this file may share
// a unity batch with others, whose names must not meet all of zaya::tok).
using tok::AddedMatch;
using tok::AddedMatcher;
using tok::AddedToken;
using tok::apply_decoders;
using tok::apply_normalizers;
using tok::apply_pre_tokenizers;
using tok::BpeModel;
using tok::DecStep;
using tok::NormStep;
using tok::parse_decoder;
using tok::parse_normalizer;
using tok::parse_post_processor;
using tok::parse_pre_tokenizer;
using tok::Piece;
using tok::PostTemplate;
using tok::PreTokStep;
using tok::StrIdMap;
using tok::utf8_sanitize;
using tok::utf8_valid;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("tokenizer", path + ": cannot open file", "check the path; run scripts/setup.sh to fetch data");
  const std::streamoff size = in.tellg();
  std::string text;
  if (size > 0) {  // one read of the whole file (a large tokenizer.json is tens of MB)
    text.resize(static_cast<size_t>(size));
    in.seekg(0);
    in.read(text.data(), static_cast<std::streamsize>(size));
  }
  if (!in) fail("tokenizer", path + ": cannot read file");
  return text;
}

// bos/eos from a tokenizer_config.json next to the file ("bos_token": "x" or {"content": "x"}).
std::string config_token(const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return {};
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const std::string& path, const std::string& text) : path_(path) {
    tok::TokenizerJson parsed;
    try {
      parsed = tok::parse_tokenizer_json(text);
    } catch (const json::exception& e) {
      fail("tokenizer", path + ": invalid JSON: " + e.what());
    }
    const json& j = parsed.doc;
    if (!j.is_object()) fail("tokenizer", path + ": top level must be a JSON object");
    if (!j.contains("model")) fail("tokenizer", path + ": field 'model' is missing");
    // A field of the wrong JSON type deep in a section surfaces as a JSON exception: named with
    // its section.
    const auto section = [&path](const char* name, const auto& parse) {
      try {
        parse();
      } catch (const json::exception& e) {
        fail("tokenizer", path + ": " + name + ": " + e.what());
      }
    };
    // Sections are read in place, not copied (a copy recurses into however deep the file nests).
    static const json kAbsent, kNoAddedTokens = json::array();
    const auto field = [&j](const char* key, const json& absent) -> const json& {
      const auto it = j.find(key);
      return it == j.end() ? absent : *it;
    };
    section("model", [&] { model_.load(j["model"], std::move(parsed.bpe), path); });
    section("normalizer", [&] { norm_ = parse_normalizer(field("normalizer", kAbsent), path); });
    section("pre_tokenizer", [&] { pre_ = parse_pre_tokenizer(field("pre_tokenizer", kAbsent), path); });
    section("decoder", [&] { dec_ = parse_decoder(field("decoder", kAbsent), path); });
    section("added_tokens", [&] { load_added(field("added_tokens", kNoAddedTokens)); });
    section("post_processor", [&] {
      post_ = parse_post_processor(field("post_processor", kAbsent), path,
                                   [this](const std::string& t) { return token_to_id(t); });
    });
    for (const auto* ids : {&post_.before, &post_.after})
      for (int32_t id : *ids)
        if (id < 0 || id >= vocab_size_)
          fail("tokenizer", path + ": post_processor: special token id " + std::to_string(id) +
                                " is outside the vocabulary (" + std::to_string(vocab_size_) + " ids)");
    find_bos_eos();
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::string clean;
    if (!utf8_valid(text)) {
      clean = utf8_sanitize(text);
      text = clean;
    }
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 8);
    if (add_special && post_.present) ids.insert(ids.end(), post_.before.begin(), post_.before.end());
    std::vector<AddedMatch> matches;
    raw_added_.find(text, matches);
    size_t pos = 0;
    for (const auto& m : matches) {
      if (m.start > pos) encode_segment(text.substr(pos, m.start - pos), pos == 0, ids);
      ids.push_back(m.id);
      pos = m.end;
    }
    if (pos < text.size()) encode_segment(text.substr(pos), pos == 0, ids);
    if (add_special && post_.present) ids.insert(ids.end(), post_.after.begin(), post_.after.end());
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      auto it = added_by_id_.find(id);
      if (it != added_by_id_.end()) {
        if (skip_special && it->second->special) continue;
        tokens.push_back(it->second->content);
      } else if (const std::string* t = model_.id_to_token(id)) {
        tokens.push_back(*t);
      }  // unknown ids are skipped, as Hugging Face does
    }
    return apply_decoders(dec_, std::move(tokens));
  }

  int64_t vocab_size() const override { return vocab_size_; }

  int32_t token_to_id(std::string_view token) const override {
    auto it = added_by_content_.find(token);
    if (it != added_by_content_.end()) return it->second;
    return model_.token_to_id(token);
  }

  std::string id_to_token(int32_t id) const override {
    auto it = added_by_id_.find(id);
    if (it != added_by_id_.end()) return it->second->content;
    const std::string* t = model_.id_to_token(id);
    return t ? *t : std::string();
  }

  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }

 private:
  void encode_segment(std::string_view seg, bool at_start, std::vector<int32_t>& ids) const {
    std::string s(seg);
    apply_normalizers(norm_, s);
    if (norm_added_.empty()) {
      encode_normalized(std::move(s), at_start, ids);
      return;
    }
    std::vector<AddedMatch> matches;
    norm_added_.find(s, matches);
    size_t pos = 0;
    for (const auto& m : matches) {
      if (m.start > pos) encode_normalized(s.substr(pos, m.start - pos), at_start && pos == 0, ids);
      ids.push_back(m.id);
      pos = m.end;
    }
    if (pos < s.size()) encode_normalized(s.substr(pos), at_start && pos == 0, ids);
  }

  void encode_normalized(std::string s, bool at_start, std::vector<int32_t>& ids) const {
    if (pre_.empty()) {
      model_.encode(s, ids);
      return;
    }
    std::vector<Piece> pieces;
    pieces.push_back({std::move(s), at_start});
    apply_pre_tokenizers(pre_, pieces);
    for (const auto& p : pieces) model_.encode(p.text, ids);
  }

  void load_added(const json& arr) {
    if (!arr.is_array()) fail("tokenizer", path_ + ": field 'added_tokens' must be an array");
    added_.reserve(arr.size());
    vocab_size_ = model_.size();
    for (size_t i = 0; i < arr.size(); ++i) {
      const json& a = arr[i];
      auto where = path_ + ": added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        fail("tokenizer", where + " must have an integer 'id' and a string 'content'");
      AddedToken t;
      t.id = tok::token_id_or_invalid(a["id"]);
      if (t.id < 0)
        fail("tokenizer", where + ".id must be non-negative and at most " + std::to_string(INT32_MAX));
      t.content = a["content"].get<std::string>();
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      t.normalized = a.value("normalized", !t.special);
      added_.push_back(std::move(t));
    }
    std::vector<const AddedToken*> raw, norm;
    std::vector<std::string> raw_pat, norm_pat;
    for (const auto& t : added_) {
      added_by_id_[t.id] = &t;
      added_by_content_.emplace(t.content, t.id);
      vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{t.id} + 1);
      if (t.normalized && !norm_.empty()) {
        std::string p = t.content;
        apply_normalizers(norm_, p);
        norm.push_back(&t), norm_pat.push_back(std::move(p));
      } else {
        raw.push_back(&t), raw_pat.push_back(t.content);
      }
    }
    raw_added_.build(raw, raw_pat);
    norm_added_.build(norm, norm_pat);
  }

  void find_bos_eos() {
    std::string dir = path_.substr(0, path_.find_last_of('/') + 1);
    std::string bos, eos;
    std::ifstream cf(dir + "tokenizer_config.json", std::ios::binary);
    if (cf) {
      json cfg = json::parse(cf, nullptr, /*allow_exceptions=*/false);
      bos = config_token(cfg, "bos_token");
      eos = config_token(cfg, "eos_token");
    }
    auto first_of = [this](std::initializer_list<const char*> names) {
      for (const char* n : names)
        if (int32_t id = token_to_id(n); id >= 0) return id;
      return int32_t{-1};
    };
    bos_ = bos.empty() ? -1 : token_to_id(bos);
    eos_ = eos.empty() ? -1 : token_to_id(eos);
    if (bos_ < 0 && post_.present && !post_.before.empty()) bos_ = post_.before.front();
    if (bos_ < 0) bos_ = first_of({"<bos>", "<s>", "<|begin_of_text|>"});
    if (eos_ < 0) eos_ = first_of({"<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>"});
  }

  std::string path_;
  BpeModel model_;
  std::vector<NormStep> norm_;
  std::vector<PreTokStep> pre_;
  std::vector<DecStep> dec_;
  PostTemplate post_;
  std::vector<AddedToken> added_;  // stable: reserved before pointers are taken
  std::unordered_map<int32_t, const AddedToken*> added_by_id_;
  StrIdMap added_by_content_;
  AddedMatcher raw_added_, norm_added_;
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  return std::make_unique<HfTokenizer>(path, read_file(path));
}

std::unique_ptr<Tokenizer> load_hf_tokenizer_text(const std::string& text, const std::string& path) {
  return std::make_unique<HfTokenizer>(path, text);
}

}  // namespace zaya
