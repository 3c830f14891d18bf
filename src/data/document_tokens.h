// How a corpus record becomes a document's tokens, the one rule `zaya data prepare` (shards) and
// `zaya eval` (text inputs) share (docs/formats.md): a plain text is its ids then EOS; a
// supervised fine-tuning record is prompt + completion + EOS, with a loss mask that makes the
// completion and EOS the only training targets; a chat record is its messages rendered by a chat
// template, the assistant's replies (with the tokens that end them) the only targets.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/chat_template.h"
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

// Appends a chat record's document: the messages as `chat` renders them for training (each
// reply and its end-of-reply token are targets, the rest context), then `eos` as context (a
// separator, not a target) unless the last token is already EOS. Returns false and appends
// nothing when the messages hold no reply. Throws naming `source` for messages the template
// cannot render and ids outside [0, vocab).
// `what` names the message list in errors.
bool append_chat_document(const ChatFormat& chat, const std::vector<ChatMessage>& messages,
                          const std::string& what, uint32_t eos, uint64_t vocab, const std::string& source,
                          std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask);

// Which JSONL fields hold a record, as `zaya data prepare` and `zaya eval` take them: plain
// documents (text_field), prompt/completion records (both fields), or chat records (a message
// list in messages_field, rendered by the chat template named in chat_template).
struct RecordFields {
  std::string text_field = "text";
  std::string prompt_field, completion_field;
  std::string messages_field, chat_template;
  bool prompt_completion() const { return !completion_field.empty(); }
  bool chat() const { return !messages_field.empty(); }
  bool supervised() const { return prompt_completion() || chat(); }
};

// Checks that the fields name one kind of record: check_prompt_completion_fields, and
// --messages-field with --chat-template, apart from the prompt/completion fields. Throws
// zaya::Error under `component` naming the options.
void check_record_fields(const RecordFields& fields, const std::string& component);

// Turns raw records into documents by one rule, on any number of threads at once.
class DocumentBuilder {
 public:
  // Loads and binds the chat template for chat records (throws as load_chat_template and
  // ChatFormat do). The tokenizer must outlive the builder.
  DocumentBuilder(const Tokenizer& tok, RecordFields fields, uint32_t eos, uint64_t vocab);
  // Appends the record's document to tokens (and its loss mask to mask for supervised records;
  // mask is then one byte per token on entry). Returns false when the record is skipped (an
  // empty text, no completion text, no reply). *scored_bytes, when given, gains the UTF-8 bytes
  // of the text that is scored (the document, the completions, or the replies).
  bool append(RawDocument&& doc, const std::string& file, std::vector<uint32_t>& tokens,
              std::vector<uint8_t>& mask, uint64_t* scored_bytes = nullptr) const;

 private:
  const Tokenizer& tok_;
  RecordFields fields_;
  uint32_t eos_;
  uint64_t vocab_;
  std::unique_ptr<ChatFormat> chat_;
};

}  // namespace zaya
