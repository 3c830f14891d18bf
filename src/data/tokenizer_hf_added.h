// Added tokens of a tokenizer.json (special and not): a byte trie that finds them in text
// leftmost-longest, honouring lstrip/rstrip/single_word, before the model ever sees it.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace zaya::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

struct AddedMatch {
  size_t start, end;  // byte range consumed (including stripped whitespace)
  int32_t id;
};

class AddedMatcher {
 public:
  // `patterns[i]` is the text to find for `tokens[i]` (content, or its normalized form).
  void build(const std::vector<const AddedToken*>& tokens, const std::vector<std::string>& patterns);
  bool empty() const { return tokens_.empty(); }
  void find(std::string_view text, std::vector<AddedMatch>& out) const;

 private:
  int32_t child(int32_t node, unsigned char b) const {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | b);
    return it == edges_.end() ? -1 : it->second;
  }
  std::vector<const AddedToken*> tokens_;
  std::vector<int32_t> terminal_;  // node -> index into tokens_, -1 if none
  std::unordered_map<uint64_t, int32_t> edges_;
  std::array<bool, 256> first_{};
};

}  // namespace zaya::tok
