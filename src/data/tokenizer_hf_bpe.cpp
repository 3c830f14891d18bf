// BPE model: loading vocab/merges from tokenizer.json and encoding words by repeatedly
// merging the lowest-ranked adjacent pair (leftmost on ties), as Hugging Face's BPE does.
#include "data/tokenizer_hf_bpe.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <queue>
#include <unordered_set>

#include "core/error.h"
#include "data/tokenizer_utf8.h"

namespace zaya::tok {

using nlohmann::json;

namespace {
constexpr uint32_t kMaxCp = 0x110000;
constexpr uint32_t kMetaspace = 0x2581;

[[noreturn]] void bad(const std::string& file, const std::string& msg) {
  fail("tokenizer", file + ": " + msg);
}
}  // namespace

void BpeModel::add_merge(int32_t a, int32_t b, int32_t rank, int32_t new_id) {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
  for (;;) {
    MergeSlot& s = merges_[i];
    if (s.key == key) return;  // duplicate merge: the first (lowest rank) wins
    if (s.key == kEmpty) {
      s = {key, rank, new_id};
      return;
    }
    i = (i + 1) & merge_mask_;
  }
}

void BpeModel::load(const json& model, BpeEntries&& entries, const std::string& file) {
  if (!model.is_object()) bad(file, "field 'model' must be an object");
  std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE")
    bad(file, "model type '" + type + "' is not supported (only BPE)");
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    bad(file, "model.dropout must be null (BPE dropout is not supported)");
  auto str_or_empty = [&](const char* key) -> std::string {
    if (!model.contains(key) || model[key].is_null()) return {};
    if (!model[key].is_string()) bad(file, std::string("model.") + key + " must be a string or null");
    return model[key].get<std::string>();
  };
  prefix_ = str_or_empty("continuing_subword_prefix");
  suffix_ = str_or_empty("end_of_word_suffix");
  std::string unk = str_or_empty("unk_token");
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  ignore_merges_ = model.value("ignore_merges", false);

  if (!entries.vocab_is_object) bad(file, "field 'model.vocab' must be an object");
  vocab_.reserve(entries.vocab.size());
  for (auto& [token, id] : entries.vocab)
    vocab_.insert_or_assign(std::move(token), id);  // the last of a repeated key
  entries.vocab = {};
  int64_t max_id = -1;
  const std::string* invalid = nullptr;  // the first in key order, as a parsed document names it
  for (const auto& [token, id] : vocab_) {
    if (id < 0 && (!invalid || token < *invalid)) invalid = &token;
    max_id = std::max<int64_t>(max_id, id);
  }
  if (invalid) bad(file, "model.vocab['" + *invalid + "'] must be a non-negative integer id");
  // Ids index a table: holes are allowed (added tokens may fill them), but not a table mostly
  // made of them.
  constexpr int64_t kMaxUnusedIds = int64_t(1) << 20;
  if (max_id >= static_cast<int64_t>(vocab_.size()) + kMaxUnusedIds)
    bad(file, "model.vocab: id " + std::to_string(max_id) + " leaves more than " +
                  std::to_string(kMaxUnusedIds) + " ids unused (the vocabulary has " +
                  std::to_string(vocab_.size()) + " tokens)");
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = tok;
  char_id_.assign(kMaxCp, -1);
  for (const auto& [tok, id] : vocab_) {
    if (tok.empty() || !utf8_valid(tok)) continue;
    size_t i = 0;
    uint32_t cp = utf8_next(tok, i);
    if (i == tok.size()) char_id_[cp] = id;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_id_[static_cast<size_t>(b)] = token_to_id(name);
  }
  if (!unk.empty()) {
    unk_id_ = token_to_id(unk);
    if (unk_id_ < 0) bad(file, "model.unk_token '" + unk + "' is not in model.vocab");
  }

  if (!entries.merges_is_array) bad(file, "field 'model.merges' must be an array");
  size_t cap = 16;
  while (cap < entries.merges.size() * 2) cap <<= 1;
  merges_.assign(cap, MergeSlot{kEmpty, 0, 0});
  merge_mask_ = cap - 1;
  merge_shift_ = 64 - __builtin_ctzll(cap);
  int32_t rank = 0;
  std::string merged;
  for (const BpeEntries::Merge& m : entries.merges) {
    std::string_view a, b;
    if (m.form == BpeEntries::Merge::Form::Text) {
      const std::string& s = m.a;
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        bad(file, "model.merges[" + std::to_string(rank) + "] '" + s + "' must be two tokens separated by one space");
      a = std::string_view(s).substr(0, sp), b = std::string_view(s).substr(sp + 1);
    } else if (m.form == BpeEntries::Merge::Form::Pair) {
      a = m.a, b = m.b;
    } else {
      bad(file, "model.merges[" + std::to_string(rank) + "] must be \"a b\" or [\"a\", \"b\"]");
    }
    int32_t ia = token_to_id(a), ib = token_to_id(b);
    if (ia < 0 || ib < 0)
      bad(file, "model.merges[" + std::to_string(rank) + "] uses token '" + std::string(ia < 0 ? a : b) +
                    "' that is not in model.vocab");
    merged = a;
    if (!prefix_.empty() && b.compare(0, prefix_.size(), prefix_) == 0)
      merged.append(b.substr(prefix_.size()));
    else
      merged += b;
    int32_t im = token_to_id(merged);
    if (im < 0) bad(file, "model.merges[" + std::to_string(rank) + "] result '" + merged + "' is not in model.vocab");
    add_merge(ia, ib, rank, im);
    ++rank;
  }
  entries.merges = {};
  compute_split_flags();
}

// A cut before U+2581 (or ' ') after code point p is exact when no vocab token contains p
// immediately followed by it: then no merge can ever join the two sides.
void BpeModel::compute_split_flags() {
  split_enabled_ = prefix_.empty() && suffix_.empty() && !ignore_merges_;
  if (!split_enabled_) return;
  const uint32_t brk[2] = {kMetaspace, ' '};
  std::unordered_set<uint32_t> pred[2];
  for (const auto& [tok, id] : vocab_) {
    if (!utf8_valid(tok)) continue;
    size_t i = 0;
    uint32_t prev = utf8_next(tok, i);
    while (i < tok.size()) {
      uint32_t cp = utf8_next(tok, i);
      for (int k = 0; k < 2; ++k)
        if (cp == brk[k]) pred[k].insert(prev);
      prev = cp;
    }
  }
  split_before_.assign(kMaxCp, 0);
  for (int k = 0; k < 2; ++k) {
    if (char_id_[brk[k]] < 0) continue;
    for (uint32_t cp = 0; cp < kMaxCp; ++cp)
      if (char_id_[cp] >= 0 && !pred[k].count(cp)) split_before_[cp] |= static_cast<uint8_t>(1 << k);
  }
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  const std::string& s = id_to_token_[static_cast<size_t>(id)];
  if (s.empty() && token_to_id(s) != id) return nullptr;
  return &s;
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    int32_t id = token_to_id(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (!split_enabled_) {
    encode_word_cached(piece, out);
    return;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
  size_t n = piece.size(), start = 0;
  for (size_t i = 1; i < n; ++i) {
    int bit;
    if (p[i] == ' ') {
      bit = 2;
    } else if (p[i] == 0xE2 && i + 2 < n && p[i + 1] == 0x96 && p[i + 2] == 0x81) {
      bit = 1;
    } else {
      continue;
    }
    size_t ps = utf8_prev_start(piece, i);
    size_t j = ps;
    uint32_t prev = utf8_next(piece, j);
    if (split_before_[prev] & bit) {
      if (i > start) encode_word_cached(piece.substr(start, i - start), out);
      start = i;
    }
  }
  encode_word_cached(piece.substr(start), out);
}

void BpeModel::encode_word_cached(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > kMaxCachedWord) {
    encode_word(word, out);
    return;
  }
  Shard& shard = cache_[SvHash{}(word) % kShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(word);
    if (it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t before = out.size();
  encode_word(word, out);
  std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= kMaxShardEntries) shard.map.clear();
  shard.map.emplace(std::string(word), std::move(ids));
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& syms) const {
  bool last_unk = false;
  size_t i = 0, n = word.size();
  std::string tmp;
  while (i < n) {
    size_t start = i;
    uint32_t cp = utf8_next(word, i);
    int32_t id;
    if (prefix_.empty() && suffix_.empty()) {
      id = char_id_[cp];
    } else {
      tmp.clear();
      if (start > 0) tmp = prefix_;
      tmp.append(word.substr(start, i - start));
      if (i == n) tmp += suffix_;
      id = token_to_id(tmp);
    }
    if (id >= 0) {
      syms.push_back(id);
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (size_t k = start; k < i; ++k) all = all && byte_id_[static_cast<unsigned char>(word[k])] >= 0;
      if (all) {
        for (size_t k = start; k < i; ++k) syms.push_back(byte_id_[static_cast<unsigned char>(word[k])]);
        last_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (!(fuse_unk_ && last_unk)) syms.push_back(unk_id_);
      last_unk = true;
    }
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> syms;
  syms.clear();
  initial_symbols(word, syms);
  if (syms.size() <= 48)
    merge_small(syms);
  else
    merge_heap(syms);
  out.insert(out.end(), syms.begin(), syms.end());
}

// Short words: keep each adjacent pair's rank in an array; scan for the minimum.
void BpeModel::merge_small(std::vector<int32_t>& syms) const {
  size_t n = syms.size();
  if (n < 2) return;
  int32_t rank[64], next_id[64];
  auto look = [&](size_t i) {
    const MergeSlot* m = find_merge(syms[i], syms[i + 1]);
    rank[i] = m ? m->rank : INT32_MAX;
    next_id[i] = m ? m->new_id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  for (;;) {
    size_t best = n;
    int32_t best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < n; ++i)
      if (rank[i] < best_rank) best_rank = rank[i], best = i;
    if (best == n) break;
    syms[best] = next_id[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      syms[i] = syms[i + 1];
      rank[i] = rank[i + 1];
      next_id[i] = next_id[i + 1];
    }
    --n;
    syms.resize(n);
    if (best > 0) look(best - 1);
    if (best + 1 < n) look(best);
  }
}

// Long words: linked list of symbols and a min-heap of (rank, position) pair candidates.
void BpeModel::merge_heap(std::vector<int32_t>& syms) const {
  const int32_t n = static_cast<int32_t>(syms.size());
  std::vector<int32_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  std::vector<char> alive(static_cast<size_t>(n), 1);
  for (int32_t i = 0; i < n; ++i) prev[static_cast<size_t>(i)] = i - 1, next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  struct Cand {
    int32_t rank, pos, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t i) {
    int32_t j = next[static_cast<size_t>(i)];
    if (j < 0) return;
    if (const MergeSlot* m = find_merge(syms[static_cast<size_t>(i)], syms[static_cast<size_t>(j)]))
      heap.push({m->rank, i, m->new_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    auto pos = static_cast<size_t>(c.pos);
    if (!alive[pos] || next[pos] < 0) continue;
    auto j = static_cast<size_t>(next[pos]);
    const MergeSlot* m = find_merge(syms[pos], syms[j]);
    if (!m || m->new_id != c.new_id) continue;
    syms[pos] = c.new_id;
    alive[j] = 0;
    next[pos] = next[j];
    if (next[j] >= 0) prev[static_cast<size_t>(next[j])] = c.pos;
    if (prev[pos] >= 0) push(prev[pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[static_cast<size_t>(i)]) syms[w++] = syms[static_cast<size_t>(i)];
  syms.resize(w);
}

}  // namespace zaya::tok
