// Chat templates: how a conversation's messages (system, user, assistant) become a model's
// tokens, the one rule that `zaya data prepare --messages-field` (training documents whose
// assistant replies are the targets) and `zaya serve`'s /v1/chat/completions (the prompt of the
// next reply) share, so that a model is served in the format it was trained in. A template gives
// each role a prefix and a suffix around its text and names the token that ends a reply; the
// built-in ones (chatml, gemma, llama3, plain) and TOML files of the same fields are described in
// docs/formats.md. Jinja templates (a tokenizer_config.json's chat_template) are not run.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace zaya {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Reads an OpenAI-style message list: an array of objects, each with a string "role" and a
// "content" that is a string or an array of {"type": "text", "text": ...} parts (joined). Other
// keys (name, ...) are ignored. On bad input returns nothing and sets *error to a message naming
// the element and field ("messages[2].content: expected a string or an array of text parts, got
// null"), where `what` names the list.
std::vector<ChatMessage> parse_chat_messages(const nlohmann::json& value, const std::string& what,
                                             std::string* error);

struct ChatTemplate {
  struct Role {
    std::string prefix, suffix;
  };
  std::string name;  // the built-in's name, or the file it came from
  Role system, user, assistant;
  // Without a system role, a system message's text followed by system_separator starts the next
  // user message's text (as formats without a system turn do), kept as it is (trim_content or
  // not); a system message with no user message after it is an error.
  bool system_role = true;
  std::string system_separator = "\n\n";
  // The token that ends a reply, as its text (it must be one token of the tokenizer); empty: the
  // tokenizer's EOS. The assistant's suffix comes after it.
  std::string end_of_reply;
  bool trim_content = false;  // strip whitespace around every message's text
};

// The built-in templates' names, in the order the help lists them.
std::vector<std::string> builtin_chat_template_names();

// A built-in template by name, or a TOML file of the same fields (docs/formats.md). Throws
// zaya::Error naming the file and field for a bad file, and listing the built-ins for a name that
// is neither.
ChatTemplate load_chat_template(const std::string& name_or_path);
// The same from TOML text; `source` names it in errors.
ChatTemplate parse_chat_template(const std::string& toml_text, const std::string& source);

// A conversation as token ids, with a target flag per id (1 for a reply's tokens and the token
// that ends it, 0 for everything else).
struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> target;
};

// A template bound to a tokenizer: its end-of-reply token resolved to an id.
class ChatFormat {
 public:
  // Throws zaya::Error when end_of_reply is not one token of `tok`, or the tokenizer has no EOS
  // where the template ends replies with it. The tokenizer must outlive the format.
  ChatFormat(ChatTemplate chat_template, const Tokenizer& tok);

  const ChatTemplate& chat_template() const { return t_; }
  // A message's text as the template renders it (trimmed with trim_content).
  std::string content_text(const std::string& content) const;
  int32_t end_of_reply_id() const { return end_id_; }

  // Why these messages cannot be rendered ("" when they can): an unknown role, a system message
  // the template cannot place, or, with for_reply, a last message that is the assistant's (the
  // reply is what the model writes next) or no message at all. `what` names the list in the message.
  std::string check(const std::vector<ChatMessage>& messages, bool for_reply,
                    const std::string& what = "messages") const;

  // The tokens of a conversation, checked first (throws zaya::Error with check()'s message).
  // Text runs between replies are tokenised whole (the first with the tokenizer's special
  // tokens, such as BOS); each reply is tokenised on its own, as the model generates it, and
  // followed by the end-of-reply id. for_reply: the assistant's prefix follows the last message
  // (the prompt of the next reply). Otherwise (training) the tokens end with the last reply's
  // end-of-reply id; messages after it have no reply to train and are left out.
  ChatTokens render(const std::vector<ChatMessage>& messages, bool for_reply) const;

 private:
  ChatTemplate t_;
  const Tokenizer& tok_;
  int32_t end_id_ = -1;
};

}  // namespace zaya
