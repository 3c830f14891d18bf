// The decode states the inference engine keeps after prompts are prefilled and completions
// finish, so that a prompt that begins with one of them (another choice of the same prompt, or a
// conversation's next turn, which sends back the exchange so far) runs only what follows. An
// entry holds the tokens its state has consumed (a prompt, or a completion's prompt and every
// generated token but the last, which was never fed), a state sized to them, and the logits
// after the last of them. Several conversations can be continued this way at
// once; once the entries' bytes would exceed the budget, the least recently used go first.
// Used from the engine's thread only.
#pragma once
#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "model/model.h"

namespace zaya {

// Whether tokens begins with prefix (prefix no longer than tokens, the same up to its end).
inline bool begins_with(const std::vector<int32_t>& tokens, const std::vector<int32_t>& prefix) {
  return prefix.size() <= tokens.size() && std::equal(prefix.begin(), prefix.end(), tokens.begin());
}

class KeptStates {
 public:
  // What an entry's state is: a prompt just prefilled (the next completion of the same prompt,
  // or of one extending it, starts from it), or a finished completion (its prompt and reply).
  enum class Source { prompt, completion };
  struct Entry {
    Source source = Source::completion;
    std::vector<int32_t> tokens;         // what state has consumed, in order
    std::unique_ptr<DecodeState> state;  // one sequence, tokens.size() positions
    std::vector<float> logits;           // [vocab]: after the last token
    int64_t bytes = 0;                   // the state and the logits
  };

  // budget_bytes 0 keeps nothing.
  KeptStates(const ModelConfig& config, Backend& backend, int64_t budget_bytes);

  // Keeps sequence seq of state, which has consumed tokens, with the logits after them (vocab
  // floats). An entry of the same tokens is replaced. Entries whose tokens begin the new ones
  // (the turns of the conversation before it) become the first to evict: they serve only a turn
  // sent again, so a long conversation does not crowd out the others. Evicts as the budget
  // requires, the least recently used first; returns false, keeping nothing, when the entry
  // alone exceeds the budget.
  bool keep(const std::vector<int32_t>& tokens, const DecodeState& state, int64_t seq, const float* logits,
            Source source = Source::completion);

  // The entry whose tokens are the longest prefix of prompt (the whole prompt included), or
  // null. Valid until the next keep().
  const Entry* longest_prefix(const std::vector<int32_t>& prompt) const;
  // Makes an entry (from longest_prefix) the most recently used: call it when the entry is used.
  void touch(const Entry* entry);

  // What an entry of this many tokens takes.
  int64_t entry_bytes(int64_t tokens) const;
  int64_t bytes() const { return bytes_; }
  int64_t budget() const { return budget_; }
  size_t size() const { return entries_.size(); }

 private:
  const ModelConfig& cfg_;
  Backend& be_;
  int64_t budget_, bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace zaya
