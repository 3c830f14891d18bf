// The text of a completion as its tokens arrive: incremental detokenisation and stop
// sequences. Text is decoded over context + generated ids (so spacing at the seam is right)
// and only the part past the decoded context is released, as `zaya generate` prints it; an
// incomplete UTF-8 sequence (decoded as U+FFFD at the end) is held back until it completes.
// Text that could be the start of a stop sequence is held back too, so streamed text never
// has to be taken back: a stop sequence ends the completion and is cut off with what follows.
// The streamed pieces concatenate to text() by construction. Pure: no model, no locks.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace zaya {

class CompletionText {
 public:
  // tokenizer may be null: no text then (callers use the ids). context: the ids just before the
  // completion (the prompt, or its tail: kContextTail ids are enough for the seam).
  CompletionText(const Tokenizer* tokenizer, std::vector<int32_t> context, std::vector<std::string> stop);

  static constexpr size_t kContextTail = 64;

  struct Step {
    std::string text;   // newly released text (often empty)
    bool stop = false;  // a stop sequence matched: the completion ends here
  };
  // One generated token.
  Step push(int32_t id);
  // End of generation: releases what was held back (an incomplete UTF-8 tail included, as the
  // tokenizer decodes it). Returns "" after a stop.
  std::string finish();

  const std::string& text() const { return released_; }  // everything released so far
  bool stopped() const { return stopped_; }

 private:
  Step release(bool final_step);

  const Tokenizer* tok_;
  std::vector<int32_t> ids_;  // context + generated
  std::string context_text_;  // decode(context)
  std::vector<std::string> stop_;
  std::string released_;
  bool stopped_ = false;
};

// The last `n` ids of `ids` (all of them when there are fewer).
std::vector<int32_t> id_tail(const std::vector<int32_t>& ids, size_t n);

// The text of a prompt as an echo shows it, one piece per id: what each id adds (special tokens
// skipped; an incomplete UTF-8 sequence goes to the id that completes it). The pieces
// concatenate to the prompt's decode. Decoded in blocks that carry the seam context, so the
// cost stays linear in the prompt's length. Without a tokenizer every piece is "".
std::vector<std::string> prompt_pieces(const Tokenizer* tokenizer, const std::vector<int32_t>& ids);

// How a token is named among a position's most likely alternatives: the text `id` adds after
// `context` (its last few ids are enough), special tokens shown by name; "token_id:<id>" when
// there is no tokenizer or the id is outside its vocabulary.
std::string alternative_token_text(const Tokenizer* tokenizer, std::span<const int32_t> context, int32_t id);

}  // namespace zaya
