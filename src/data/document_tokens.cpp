// Corpus records as document tokens (see document_tokens.h).
#include "data/document_tokens.h"

#include <algorithm>

#include "core/error.h"

namespace zaya {

namespace {

void append_ids(const std::vector<int32_t>& ids, uint64_t vocab, const std::string& source,
                std::vector<uint32_t>& tokens) {
  for (int32_t id : ids) {
    if (id < 0 || uint64_t(id) >= vocab)
      fail("tokenizer", source + ": the tokenizer produced id " + std::to_string(id) +
                            " outside its vocabulary (" + std::to_string(vocab) + ")");
    tokens.push_back(uint32_t(id));
  }
}

}  // namespace

void check_prompt_completion_fields(const std::string& prompt_field, const std::string& completion_field,
                                    const std::string& component) {
  if (prompt_field.empty() && completion_field.empty()) return;
  if (prompt_field.empty() || completion_field.empty())
    fail(component, "prompt/completion records need both --prompt-field and --completion-field (" +
                        std::string(prompt_field.empty() ? "--prompt-field" : "--completion-field") +
                        " is missing)");
  if (prompt_field == completion_field)
    fail(component, "--prompt-field and --completion-field are both '" + prompt_field + "'",
         "name two different JSONL fields");
}

bool append_text_document(const Tokenizer& tok, const std::string& text, uint32_t eos, uint64_t vocab,
                          const std::string& source, std::vector<uint32_t>& tokens) {
  if (text.empty()) return false;
  append_ids(tok.encode(text), vocab, source, tokens);
  tokens.push_back(eos);
  return true;
}

bool append_prompt_completion(const Tokenizer& tok, const PromptCompletion& record, uint32_t eos,
                              uint64_t vocab, const std::string& source, std::vector<uint32_t>& tokens,
                              std::vector<uint8_t>& mask) {
  ZAYA_CHECK(mask.size() == tokens.size(), "a loss mask must run alongside its tokens");
  if (record.completion_bytes() == 0) return false;
  const size_t begin = tokens.size();
  std::string text;  // the conversation so far, as a client would send it back
  for (size_t i = 0; i < record.turns.size(); ++i) {
    const PromptCompletion::Turn& turn = record.turns[i];
    // The context up to this turn's prompt as the server tokenises that text; used when it
    // extends the ids so far (the usual case), else this prompt is tokenised on its own.
    std::vector<int32_t> prompt_ids;
    text += turn.prompt;
    if (i == 0) {
      prompt_ids = tok.encode(turn.prompt, /*add_special=*/true);
    } else {
      const std::vector<int32_t> whole = tok.encode(text, /*add_special=*/true);
      const size_t have = tokens.size() - begin;
      const bool extends =
          whole.size() >= have && std::equal(tokens.begin() + ptrdiff_t(begin), tokens.end(), whole.begin(),
                                             [](uint32_t a, int32_t b) { return int64_t(a) == int64_t(b); });
      if (extends)
        prompt_ids.assign(whole.begin() + ptrdiff_t(have), whole.end());
      else
        prompt_ids = tok.encode(turn.prompt);
    }
    append_ids(prompt_ids, vocab, source, tokens);
    mask.resize(tokens.size(), 0);
    append_ids(tok.encode(turn.completion), vocab, source, tokens);
    mask.resize(tokens.size(), 1);
    text += turn.completion;
  }
  tokens.push_back(eos);
  mask.push_back(1);
  return true;
}

bool append_chat_document(const ChatFormat& chat, const std::vector<ChatMessage>& messages,
                          const std::string& what, uint32_t eos, uint64_t vocab, const std::string& source,
                          std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask) {
  ZAYA_CHECK(mask.size() == tokens.size(), "a loss mask must run alongside its tokens");
  const std::string problem = chat.check(messages, /*for_reply=*/false, what);
  if (!problem.empty())
    fail("data", source + ": " + problem, "the chat template is " + chat.chat_template().name);
  const ChatTokens rendered = chat.render(messages, /*for_reply=*/false);
  if (rendered.ids.empty()) return false;  // no reply to train
  append_ids(rendered.ids, vocab, source, tokens);
  mask.insert(mask.end(), rendered.target.begin(), rendered.target.end());
  if (tokens.back() != eos) {
    tokens.push_back(eos);
    mask.push_back(0);
  }
  return true;
}

void check_record_fields(const RecordFields& f, const std::string& component) {
  check_prompt_completion_fields(f.prompt_field, f.completion_field, component);
  if (f.messages_field.empty() != f.chat_template.empty())
    fail(component, "chat records need both --messages-field and --chat-template (" +
                        std::string(f.messages_field.empty() ? "--messages-field" : "--chat-template") +
                        " is missing)");
  if (f.chat() && f.prompt_completion())
    fail(component, "--messages-field and --prompt-field/--completion-field are two kinds of record",
         "pass one kind");
}

DocumentBuilder::DocumentBuilder(const Tokenizer& tok, RecordFields fields, uint32_t eos, uint64_t vocab)
    : tok_(tok), fields_(std::move(fields)), eos_(eos), vocab_(vocab) {
  if (fields_.chat()) chat_ = std::make_unique<ChatFormat>(load_chat_template(fields_.chat_template), tok_);
}

bool DocumentBuilder::append(RawDocument&& doc, const std::string& file, std::vector<uint32_t>& tokens,
                             std::vector<uint8_t>& mask, uint64_t* scored_bytes) const {
  uint64_t bytes = 0;
  bool kept = false;
  if (chat_) {
    const std::string where = doc.json ? file + ":" + std::to_string(doc.line) : file;
    const std::vector<ChatMessage> messages =
        extract_chat_messages(std::move(doc), fields_.messages_field, file);
    kept = append_chat_document(*chat_, messages, fields_.messages_field, eos_, vocab_, where, tokens, mask);
    for (const ChatMessage& m : messages)
      if (m.role == "assistant") bytes += chat_->content_text(m.content).size();
  } else if (fields_.prompt_completion()) {
    const PromptCompletion pc =
        extract_prompt_completion(std::move(doc), fields_.prompt_field, fields_.completion_field, file);
    kept = append_prompt_completion(tok_, pc, eos_, vocab_, file, tokens, mask);
    bytes = pc.completion_bytes();
  } else {
    const std::string text = extract_document_text(std::move(doc), fields_.text_field, file);
    kept = append_text_document(tok_, text, eos_, vocab_, file, tokens);
    bytes = text.size();
  }
  if (kept && scored_bytes) *scored_bytes += bytes;
  return kept;
}

}  // namespace zaya
