// Leftmost-longest search for added tokens over a byte trie.
#include "data/tokenizer_hf_added.h"

#include <algorithm>

#include "data/tokenizer_utf8.h"

namespace zaya::tok {

void AddedMatcher::build(const std::vector<const AddedToken*>& tokens,
                         const std::vector<std::string>& patterns) {
  tokens_ = tokens;
  terminal_.assign(1, -1);
  edges_.clear();
  first_.fill(false);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& pat = patterns[t];
    if (pat.empty()) continue;
    first_[static_cast<unsigned char>(pat[0])] = true;
    int32_t node = 0;
    for (unsigned char b : pat) {
      int32_t c = child(node, b);
      if (c < 0) {
        c = static_cast<int32_t>(terminal_.size());
        terminal_.push_back(-1);
        edges_.emplace((static_cast<uint64_t>(node) << 8) | b, c);
      }
      node = c;
    }
    if (terminal_[static_cast<size_t>(node)] < 0) terminal_[static_cast<size_t>(node)] = static_cast<int32_t>(t);
  }
}

static uint32_t cp_before(std::string_view s, size_t i) {
  size_t j = utf8_prev_start(s, i);
  return utf8_next(s, j);
}

// Like Hugging Face: first all leftmost-longest, non-overlapping matches; then single_word
// drops a match (no retry inside it), lstrip/rstrip widen it over whitespace. A match that
// rstrip already swallowed is still emitted (the widened ranges may overlap).
void AddedMatcher::find(std::string_view text, std::vector<AddedMatch>& out) const {
  if (tokens_.empty()) return;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size(), start_offset = 0;
  for (size_t i = 0; i < n;) {
    if (!first_[p[i]]) {
      ++i;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < n; ++k) {
      node = child(node, p[k]);
      if (node < 0) break;
      if (terminal_[static_cast<size_t>(node)] >= 0) best = terminal_[static_cast<size_t>(node)], best_end = k + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = *tokens_[static_cast<size_t>(best)];
    size_t start = i, end = best_end;
    i = best_end;
    if (tok.single_word) {
      bool word_before = start > 0 && is_word_char(cp_before(text, start));
      size_t j = end;
      bool word_after = end < n && is_word_char(utf8_next(text, j));
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      while (start > 0 && is_unicode_space(cp_before(text, start))) start = utf8_prev_start(text, start);
      start = std::max(start, start_offset);
    }
    if (tok.rstrip) {
      while (end < n) {
        size_t j = end;
        if (!is_unicode_space(utf8_next(text, j))) break;
        end = j;
      }
    }
    out.push_back({start, end, tok.id});
    start_offset = end;
  }
}

}  // namespace zaya::tok
