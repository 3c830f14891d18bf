// The token stream `zaya eval` scores, from any of the project's data forms:
//   * a shard directory written by `zaya data prepare` (DIR/manifest.json): one split's tokens,
//     documents already ending in EOS;
//   * a flat token file (`.bin`, `zaya data demo`'s format);
//   * text: .txt files (one document each) and .jsonl files (one document per line, the text in
//     text_field), optionally .gz/.zst, and glob patterns, tokenized with the given tokenizer
//     the way `zaya data prepare` does (each document's ids, then EOS); or JSONL prompt/completion
//     records, of which only the completions are scored.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace zaya {

struct EvalTokens {
  std::vector<int32_t> tokens;
  uint64_t documents = 0;
  uint64_t text_bytes = 0;  // UTF-8 bytes of the scored text (text inputs only: the documents, or the
                            // records' completions; 0 otherwise)
  std::string description;  // e.g. "shard directory data/x, split val"
  // Supervised fine-tuning shards: per token, 1 where it is a training target (a completion),
  // 0 where it is context (a prompt); only targets are scored. Empty = every token is scored.
  std::vector<uint8_t> target_mask;
  // The offset in `tokens` of every document's first token, ascending, where the input records
  // document boundaries (shard directories and text; not a flat token file).
  bool has_document_boundaries = false;
  std::vector<uint64_t> document_starts;
};

struct EvalDataOptions {
  std::string split = "val";        // shard directories
  std::string text_field = "text";  // JSONL
  // JSONL prompt/completion records (both set): each is tokenised as `zaya data prepare
  // --prompt-field --completion-field` does, and only the completions are scored.
  std::string prompt_field, completion_field;
  // JSONL chat records (both set): tokenised as `zaya data prepare --messages-field
  // --chat-template` does, and only the assistant's replies (with the tokens ending them) are scored.
  std::string messages_field, chat_template;
};

// tok may be null unless the inputs are text. Throws zaya::Error naming the file and problem.
EvalTokens load_eval_tokens(const std::vector<std::string>& inputs, const Tokenizer* tok,
                            const EvalDataOptions& options);

}  // namespace zaya
