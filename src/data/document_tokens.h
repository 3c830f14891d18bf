// How a corpus record becomes a document's tokens, the one rule `zaya data prepare` (shards) and
// `zaya eval` (text inputs) share (docs/formats.md): a plain text is its ids then EOS; a
// supervised fine-tuning record is prompt + completion + EOS, with a loss mask that makes the
// completion and EOS the only training targets.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus_input.h"
#include "data/tokenizer.h"

namespace zaya {

// Checks a pair of --prompt-field / --completion-field options: both empty (plain documents)
// or both set and different. Throws zaya::Error under `component` naming the missing option.
void check_prompt_completion_fields(const std::string& prompt_field, const std::string& completion_field,
                                    const std::string& component);

// Appends a plain document: the text's ids (no special tokens), then `eos`. Returns false and
// appends nothing for an empty text. Throws naming `source` for an id outside [0, vocab).
bool append_text_document(const Tokenizer& tok, const std::string& text, uint32_t eos, uint64_t vocab,
                          const std::string& source, std::vector<uint32_t>& tokens);

// Appends the record's document to `tokens` and its loss mask (0 = context, 1 = target) to
// `mask`, which must hold one byte per token of `tokens` on entry: for each turn, its prompt
// then its completion (tokenised on its own, no special tokens, as a model generates ids); then
// `eos`, a target. The first prompt is tokenised as `zaya serve` tokenises a prompt (with the
// tokenizer's special tokens such as BOS, even when empty). A later prompt is the part beyond the
// ids so far of the conversation's whole text up to it, tokenised the same way (what the server
// sees when a client sends the conversation back), or, where that text's ids do not begin with
// the ids so far, the prompt tokenised on its own. Returns false and appends nothing when every
// completion is empty (there is nothing to train). Throws naming `source` for an id outside
// [0, vocab).
bool append_prompt_completion(const Tokenizer& tok, const PromptCompletion& record, uint32_t eos,
                              uint64_t vocab, const std::string& source, std::vector<uint32_t>& tokens,
                              std::vector<uint8_t>& mask);

}  // namespace zaya
