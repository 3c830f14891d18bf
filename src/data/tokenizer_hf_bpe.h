// The BPE model of a Hugging Face tokenizer.json: vocab, merges as a rank table keyed by
// pair of ids, byte fallback, unk, and a per-word cache. Words are the pre-tokens; inside a
// pre-token the model also cuts before U+2581/space wherever no vocab token could span the
// cut (checked once at load), which keeps words short and cacheable without changing ids.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer_hf_json.h"

namespace zaya::tok {

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StrIdMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

class BpeModel {
 public:
  // Parses model.{unk_token, byte_fallback, ...} and takes the vocab and merges from `entries`
  // (read from the same file by parse_tokenizer_json); errors name `file`.
  void load(const nlohmann::json& model, BpeEntries&& entries, const std::string& file);
  // Appends the ids of one pre-token.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;
  int32_t token_to_id(std::string_view token) const;  // -1 if absent
  const std::string* id_to_token(int32_t id) const;   // nullptr if absent
  int64_t size() const { return static_cast<int64_t>(id_to_token_.size()); }

 private:
  struct MergeSlot {
    uint64_t key;
    int32_t rank, new_id;
  };
  const MergeSlot* find_merge(int32_t a, int32_t b) const {
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
    for (;;) {
      const MergeSlot& s = merges_[i];
      if (s.key == key) return &s;
      if (s.key == kEmpty) return nullptr;
      i = (i + 1) & merge_mask_;
    }
  }
  void add_merge(int32_t a, int32_t b, int32_t rank, int32_t new_id);
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_word_cached(std::string_view word, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& syms) const;
  void merge_small(std::vector<int32_t>& syms) const;
  void merge_heap(std::vector<int32_t>& syms) const;
  void compute_split_flags();

  static constexpr uint64_t kEmpty = ~0ull;
  StrIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<int32_t> char_id_;  // code point -> id of the single-char token, -1 if none
  std::array<int32_t, 256> byte_id_{};
  std::vector<MergeSlot> merges_;
  size_t merge_mask_ = 0;
  int merge_shift_ = 64;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  // split_before_[cp] bit 0: a word may end after cp when U+2581 follows; bit 1: when ' ' follows.
  std::vector<uint8_t> split_before_;
  bool split_enabled_ = false;

  static constexpr size_t kShards = 16, kMaxCachedWord = 64, kMaxShardEntries = 1 << 14;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, SvHash, std::equal_to<>> map;
  };
  mutable std::array<Shard, kShards> cache_;
};

}  // namespace zaya::tok
