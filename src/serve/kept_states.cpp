// The inference engine's kept decode states (see kept_states.h).
#include "serve/kept_states.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace zaya {

KeptStates::KeptStates(const ModelConfig& config, Backend& backend, int64_t budget_bytes)
    : cfg_(config), be_(backend), budget_(budget_bytes) {
  if (budget_ < 0)
    fail("serve", "the kept states' budget must be at least 0 bytes, got " + std::to_string(budget_));
}

int64_t KeptStates::entry_bytes(int64_t tokens) const {
  return DecodeState::bytes(cfg_, 1, tokens) + cfg_.vocab_size * int64_t(sizeof(float));
}

bool KeptStates::keep(const std::vector<int32_t>& tokens, const DecodeState& state, int64_t seq,
                      const float* logits, Source source) {
  ZAYA_CHECK(seq >= 0 && seq < state.batch && state.pos[size_t(seq)] == int64_t(tokens.size()),
             "a kept state must have consumed exactly its tokens");
  // An entry of the same tokens goes; entries whose tokens begin these (the turns of the
  // conversation before) move to the end of the eviction order.
  std::list<Entry> earlier_turns;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const auto here = it++;
    if (!begins_with(tokens, here->tokens)) continue;
    if (here->tokens.size() == tokens.size()) {
      bytes_ -= here->bytes;
      entries_.erase(here);
    } else {
      earlier_turns.splice(earlier_turns.end(), entries_, here);
    }
  }
  entries_.splice(entries_.end(), earlier_turns);
  const int64_t need = entry_bytes(int64_t(tokens.size()));
  if (tokens.empty() || need > budget_) return false;
  while (bytes_ + need > budget_) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  Entry e;
  e.source = source;
  e.tokens = tokens;
  e.state = std::make_unique<DecodeState>(cfg_, be_, 1, int64_t(tokens.size()));
  e.state->copy_sequence(state, seq, 0);
  e.logits.assign(logits, logits + cfg_.vocab_size);
  e.bytes = need;
  entries_.push_front(std::move(e));
  bytes_ += need;
  return true;
}

const KeptStates::Entry* KeptStates::longest_prefix(const std::vector<int32_t>& prompt) const {
  const Entry* best = nullptr;
  for (const Entry& e : entries_)
    if ((!best || e.tokens.size() > best->tokens.size()) && begins_with(prompt, e.tokens)) best = &e;
  return best;
}

void KeptStates::touch(const Entry* entry) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (&*it == entry) {
      entries_.splice(entries_.begin(), entries_, it);
      return;
    }
  ZAYA_CHECK(false, "touch: the entry is not kept");
}

}  // namespace zaya
