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

}  // namespace zaya
