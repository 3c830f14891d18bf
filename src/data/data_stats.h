// `zaya data stats`: per-split token and document counts, a log2 histogram of document
// lengths, and the most frequent tokens of a shard directory.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zaya {

class Tokenizer;

struct SplitStats {
  std::string split;
  uint64_t shards = 0, tokens = 0, documents = 0;
  uint64_t min_length = 0, max_length = 0;  // in tokens, EOS included
  bool loss_mask = false;                   // supervised fine-tuning data
  bool chat = false;                        // of chat records (the targets are the replies)
  uint64_t target_tokens = 0;  // with a loss mask: tokens that are training targets (completions)
  // length_histogram[b] counts documents with length in [2^b, 2^(b+1)).
  std::vector<uint64_t> length_histogram;
  std::vector<std::pair<uint32_t, uint64_t>> top_tokens;  // (id, count), most frequent first, ties by id
};

// Reads every shard of every split of DIR (structure-verified). `top_k` tokens are kept.
std::vector<SplitStats> compute_data_stats(const std::string& dir, size_t top_k = 20);

// Human-readable report; `tok` (may be null) decodes the top tokens.
std::string format_data_stats(const std::vector<SplitStats>& stats, const Tokenizer* tok);

}  // namespace zaya
