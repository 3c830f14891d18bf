// Shard directory statistics (see data_stats.h).
#include "data/data_stats.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <unordered_map>

#include "data/shard_reader.h"
#include "data/tokenizer.h"

namespace zaya {

namespace {

// Counts token ids: a dense array for ordinary vocabularies, a hash map for huge ones.
class TokenCounter {
 public:
  explicit TokenCounter(uint64_t vocab) {
    if (vocab <= (uint64_t(1) << 24)) dense_.assign(size_t(vocab), 0);
  }
  void add(std::span<const uint32_t> toks) {
    if (!dense_.empty()) {
      uint64_t* c = dense_.data();
      const size_t n = dense_.size();
      for (uint32_t t : toks)
        if (t < n) ++c[t];  // ids are < vocab in a valid shard; the check keeps it safe regardless
    } else {
      for (uint32_t t : toks) ++sparse_[t];
    }
  }
  std::vector<std::pair<uint32_t, uint64_t>> top(size_t k) const {
    std::vector<std::pair<uint32_t, uint64_t>> all;
    if (!dense_.empty()) {
      for (size_t i = 0; i < dense_.size(); ++i)
        if (dense_[i]) all.emplace_back(uint32_t(i), dense_[i]);
    } else {
      all.assign(sparse_.begin(), sparse_.end());
    }
    auto cmp = [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; };
    k = std::min(k, all.size());
    std::partial_sort(all.begin(), all.begin() + ptrdiff_t(k), all.end(), cmp);
    all.resize(k);
    return all;
  }

 private:
  std::vector<uint64_t> dense_;
  std::unordered_map<uint32_t, uint64_t> sparse_;
};

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += char(c);
  }
  return out;
}

std::string with_commas(uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s.push_back(',');
    s.push_back(digits[i]);
  }
  return s;
}

}  // namespace

std::vector<SplitStats> compute_data_stats(const std::string& dir, size_t top_k) {
  const Manifest m = read_manifest(dir);
  std::vector<SplitStats> out;
  for (const auto& [name, split] : m.splits) {
    ShardDataset::Options o;
    o.split = name;
    ShardDataset ds = ShardDataset::open(dir, o);
    SplitStats s;
    s.split = name;
    s.shards = ds.shard_count();
    s.tokens = ds.tokens();
    s.documents = ds.documents();
    s.loss_mask = ds.has_loss_mask();
    s.chat = !ds.manifest().messages_field.empty();
    TokenCounter counter(ds.vocab_size());
    for (size_t i = 0; i < ds.shard_count(); ++i) {
      const ShardReader& r = ds.shard(i);
      counter.add(r.token_span());
      for (uint8_t v : r.loss_mask_span()) s.target_tokens += v != 0;
      auto idx = r.index();
      for (size_t d = 0; d + 1 < idx.size(); ++d) {
        const uint64_t len = idx[d + 1] - idx[d];
        s.min_length = s.min_length == 0 && s.max_length == 0 ? len : std::min(s.min_length, len);
        s.max_length = std::max(s.max_length, len);
        const size_t b = len == 0 ? 0 : size_t(std::bit_width(len) - 1);
        if (s.length_histogram.size() <= b) s.length_histogram.resize(b + 1, 0);
        ++s.length_histogram[b];
      }
    }
    s.top_tokens = counter.top(top_k);
    out.push_back(std::move(s));
  }
  return out;
}

std::string format_data_stats(const std::vector<SplitStats>& stats, const Tokenizer* tok) {
  std::string o;
  char line[256];
  for (const SplitStats& s : stats) {
    o += "split " + s.split + "\n";
    std::snprintf(line, sizeof line, "  shards     %s\n  tokens     %s\n  documents  %s\n", with_commas(s.shards).c_str(),
                  with_commas(s.tokens).c_str(), with_commas(s.documents).c_str());
    o += line;
    if (s.loss_mask) {
      std::snprintf(
          line, sizeof line, "  targets    %s (%.1f%% of the tokens: %s)\n",
          with_commas(s.target_tokens).c_str(),
          100.0 * double(s.target_tokens) / double(std::max<uint64_t>(1, s.tokens)),
          s.chat ? "the assistant's replies; the rest is context" : "the completions; prompts are context");
      o += line;
    }
    if (s.documents == 0) continue;
    std::snprintf(line, sizeof line, "  doc length min %s, mean %.1f, max %s tokens (EOS included)\n",
                  with_commas(s.min_length).c_str(), double(s.tokens) / double(s.documents),
                  with_commas(s.max_length).c_str());
    o += line;
    o += "  document lengths (log2 buckets):\n";
    uint64_t peak = 1;
    for (uint64_t c : s.length_histogram) peak = std::max(peak, c);
    for (size_t b = 0; b < s.length_histogram.size(); ++b) {
      const uint64_t c = s.length_histogram[b];
      if (c == 0) continue;
      const uint64_t lo = uint64_t(1) << b, hi = (uint64_t(1) << (b + 1)) - 1;
      std::string bar(size_t((c * 40 + peak - 1) / peak), '#');
      std::snprintf(line, sizeof line, "    [%9s, %9s] %12s %5.1f%% %s\n", with_commas(lo).c_str(),
                    with_commas(hi).c_str(), with_commas(c).c_str(), 100.0 * double(c) / double(s.documents),
                    bar.c_str());
      o += line;
    }
    o += "  top tokens:\n";
    for (const auto& [id, count] : s.top_tokens) {
      std::string shown;
      if (tok != nullptr && int64_t(id) < tok->vocab_size()) {
        shown.push_back('"');
        shown += printable(tok->decode({int32_t(id)}));
        shown += "\"  ";
        shown += printable(tok->id_to_token(int32_t(id)));
      }
      std::snprintf(line, sizeof line, "    %8u %14s %5.2f%%  ", id, with_commas(count).c_str(),
                    100.0 * double(count) / double(std::max<uint64_t>(1, s.tokens)));
      o += line;
      o += shown;
      o += '\n';
    }
  }
  return o;
}

}  // namespace zaya
