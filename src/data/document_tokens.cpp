// Corpus records as document tokens (see document_tokens.h).
#include "data/document_tokens.h"

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
  bool any_completion = false;
  for (const PromptCompletion::Turn& t : record.turns)
    any_completion = any_completion || !t.completion.empty();
  if (!any_completion) return false;
  for (size_t i = 0; i < record.turns.size(); ++i) {
    append_ids(tok.encode(record.turns[i].prompt, /*add_special=*/i == 0), vocab, source, tokens);
    mask.resize(tokens.size(), 0);
    append_ids(tok.encode(record.turns[i].completion), vocab, source, tokens);
    mask.resize(tokens.size(), 1);
  }
  tokens.push_back(eos);
  mask.push_back(1);
  return true;
}

}  // namespace zaya
