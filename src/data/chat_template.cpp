// Chat templates: the built-ins, TOML template files, message lists and rendering (see
// chat_template.h).
#include "data/chat_template.h"

#include <toml++/toml.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace zaya {

namespace {

constexpr const char* kChatComponent = "chat";

std::string json_quoted(const std::string& s) { return nlohmann::json(s).dump(); }

std::string trimmed(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

ChatTemplate::Role role(std::string prefix, std::string suffix) {
  return {std::move(prefix), std::move(suffix)};
}

ChatTemplate builtin(const std::string& name) {
  ChatTemplate t;
  t.name = name;
  if (name == "chatml") {
    t.system = role("<|im_start|>system\n", "<|im_end|>\n");
    t.user = role("<|im_start|>user\n", "<|im_end|>\n");
    t.assistant = role("<|im_start|>assistant\n", "\n");
    t.end_of_reply = "<|im_end|>";
  } else if (name == "gemma") {
    t.system_role = false;
    t.system_separator = "\n\n";
    t.user = role("<start_of_turn>user\n", "<end_of_turn>\n");
    t.assistant = role("<start_of_turn>model\n", "\n");
    t.end_of_reply = "<end_of_turn>";
    t.trim_content = true;
  } else if (name == "llama3") {
    t.system = role("<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>");
    t.user = role("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>");
    t.assistant = role("<|start_header_id|>assistant<|end_header_id|>\n\n", "");
    t.end_of_reply = "<|eot_id|>";
    t.trim_content = true;
  } else if (name == "plain") {
    t.system = role("System: ", "\n");
    t.user = role("User: ", "\n");
    t.assistant = role("Assistant:", "\n");
  } else {
    t.name.clear();
  }
  return t;
}

std::string text_of_content(const nlohmann::json& content, const std::string& where, std::string* error) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string text;
    for (size_t i = 0; i < content.size(); ++i) {
      const nlohmann::json& part = content[i];
      const std::string at = where + "[" + std::to_string(i) + "]";
      auto type = part.is_object() ? part.find("type") : part.end();
      if (!part.is_object() || type == part.end() || *type != "text") {
        *error = at +
                 ": expected a text part {\"type\": \"text\", \"text\": ...} (only text is supported), got " +
                 (part.is_object() && type != part.end() ? "type " + type->dump() : part.dump());
        return {};
      }
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) {
        *error = at + ".text: expected a string";
        return {};
      }
      text += t->get<std::string>();
    }
    return text;
  }
  *error = where + ": expected a string or an array of text parts, got " + std::string(content.type_name());
  return {};
}

// TOML template files.
[[noreturn]] void fail_at(const std::string& source, const toml::node* node, const std::string& message) {
  std::string at = source;
  if (node && node->source().begin.line > 0) at += ":" + std::to_string(node->source().begin.line);
  fail(kChatComponent, at + ": " + message, "docs/formats.md describes chat template files");
}

void check_template_keys(const toml::table& table, const std::string& table_name,
                         const std::vector<std::string>& allowed, const std::string& source) {
  for (auto&& [key, node] : table) {
    const std::string k(key.str());
    bool ok = false;
    for (const std::string& a : allowed) ok = ok || a == k;
    if (!ok) {
      std::string list;
      for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail_at(source, &node, "unknown key '" + table_name + k + "'; expected one of: " + list);
    }
  }
}

std::string string_key(const toml::table& table, const std::string& key, const std::string& table_name,
                       const std::string& source) {
  const toml::node* node = table.get(key);
  if (!node) return {};
  if (!node->is_string()) fail_at(source, node, "'" + table_name + key + "' must be a string");
  return std::string(node->as_string()->get());
}

bool bool_key(const toml::table& table, const std::string& key, bool fallback, const std::string& table_name,
              const std::string& source) {
  const toml::node* node = table.get(key);
  if (!node) return fallback;
  if (!node->is_boolean()) fail_at(source, node, "'" + table_name + key + "' must be true or false");
  return node->as_boolean()->get();
}

const toml::table* role_table(const toml::table& root, const std::string& name, bool required,
                              const std::string& source) {
  const toml::node* node = root.get(name);
  if (!node) {
    if (required) fail_at(source, nullptr, "has no [" + name + "] table (its prefix and suffix)");
    return nullptr;
  }
  if (!node->is_table()) fail_at(source, node, "'" + name + "' must be a table ([" + name + "])");
  return node->as_table();
}

ChatTemplate::Role read_role(const toml::table& table, const std::string& name, const std::string& source) {
  check_template_keys(table, name + ".", {"prefix", "suffix"}, source);
  return {string_key(table, "prefix", name + ".", source), string_key(table, "suffix", name + ".", source)};
}

}  // namespace

std::vector<ChatMessage> parse_chat_messages(const nlohmann::json& value, const std::string& what,
                                             std::string* error) {
  error->clear();
  if (!value.is_array()) {
    *error = what + ": expected an array of messages, got " + std::string(value.type_name());
    return {};
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < value.size(); ++i) {
    const nlohmann::json& m = value[i];
    const std::string at = what + "[" + std::to_string(i) + "]";
    if (!m.is_object()) {
      *error = at + ": expected an object with a role and a content, got " + std::string(m.type_name());
      return {};
    }
    auto r = m.find("role");
    if (r == m.end() || !r->is_string()) {
      *error = at + ".role: expected a string (\"system\", \"user\" or \"assistant\")" +
               (r == m.end() ? std::string(", got nothing") : ", got " + std::string(r->type_name()));
      return {};
    }
    auto c = m.find("content");
    if (c == m.end()) {
      *error = at + ".content: missing";
      return {};
    }
    ChatMessage msg;
    msg.role = r->get<std::string>();
    msg.content = text_of_content(*c, at + ".content", error);
    if (!error->empty()) return {};
    messages.push_back(std::move(msg));
  }
  return messages;
}

std::vector<std::string> builtin_chat_template_names() { return {"chatml", "gemma", "llama3", "plain"}; }

ChatTemplate parse_chat_template(const std::string& toml_text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(std::string_view(toml_text), std::string_view(source));
  } catch (const toml::parse_error& e) {
    fail(kChatComponent,
         source + ":" + std::to_string(e.source().begin.line) +
             ": TOML syntax error: " + std::string(e.description()),
         "docs/formats.md describes chat template files");
  }
  check_template_keys(root, "", {"end_of_reply", "trim_content", "system", "user", "assistant"}, source);
  ChatTemplate t;
  t.name = source;
  t.end_of_reply = string_key(root, "end_of_reply", "", source);
  t.trim_content = bool_key(root, "trim_content", false, "", source);
  t.user = read_role(*role_table(root, "user", true, source), "user", source);
  t.assistant = read_role(*role_table(root, "assistant", true, source), "assistant", source);
  if (const toml::table* s = role_table(root, "system", false, source)) {
    check_template_keys(*s, "system.", {"prefix", "suffix", "merge_into_user", "separator"}, source);
    t.system_role = !bool_key(*s, "merge_into_user", false, "system.", source);
    if (t.system_role) {
      if (s->get("separator"))
        fail_at(source, s->get("separator"),
                "'system.separator' applies only with system.merge_into_user = true");
      t.system = {string_key(*s, "prefix", "system.", source), string_key(*s, "suffix", "system.", source)};
    } else {
      if (s->get("prefix") || s->get("suffix"))
        fail_at(source, s, "a system merged into the user's message has no prefix or suffix of its own");
      if (s->get("separator")) t.system_separator = string_key(*s, "separator", "system.", source);
    }
  } else {
    // No [system]: system messages take the user's text with the default separator.
    t.system_role = false;
  }
  return t;
}

ChatTemplate load_chat_template(const std::string& name_or_path) {
  ChatTemplate t = builtin(name_or_path);
  if (!t.name.empty()) return t;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(name_or_path, ec)) {
    std::string names;
    for (const std::string& n : builtin_chat_template_names()) names += (names.empty() ? "" : ", ") + n;
    fail(kChatComponent,
         "'" + name_or_path + "' is neither a built-in chat template (" + names + ") nor a file",
         "pass a built-in's name or a TOML template file (docs/formats.md)");
  }
  std::ifstream in(name_or_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) fail(kChatComponent, name_or_path + ": cannot read the chat template file");
  return parse_chat_template(text.str(), name_or_path);
}

ChatFormat::ChatFormat(ChatTemplate chat_template, const Tokenizer& tok)
    : t_(std::move(chat_template)), tok_(tok) {
  if (t_.end_of_reply.empty()) {
    end_id_ = tok_.eos_id();
    if (end_id_ < 0)
      fail(kChatComponent, "chat template " + t_.name + " ends replies with EOS, but the tokenizer has none",
           "use a template whose end_of_reply is a token of this tokenizer");
    return;
  }
  const std::vector<int32_t> ids = tok_.encode(t_.end_of_reply);
  if (ids.size() != 1)
    fail(kChatComponent,
         "chat template " + t_.name + ": its end of reply " + json_quoted(t_.end_of_reply) +
             " is not one token of this tokenizer (it encodes to " + std::to_string(ids.size()) + " ids)",
         "use a template made for this tokenizer (plain ends replies with EOS)");
  end_id_ = ids[0];
}

std::string ChatFormat::content_text(const std::string& content) const {
  return t_.trim_content ? trimmed(content) : content;
}

std::string ChatFormat::check(const std::vector<ChatMessage>& messages, bool for_reply,
                              const std::string& what) const {
  if (for_reply && messages.empty()) return what + ": expected at least one message";
  bool system_waiting = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    const std::string at = what + "[" + std::to_string(i) + "].role";
    if (r != "system" && r != "user" && r != "assistant")
      return at + ": expected \"system\", \"user\" or \"assistant\", got " + json_quoted(r);
    if (r == "system" && !t_.system_role) system_waiting = true;
    if (r == "assistant" && system_waiting)
      return at + ": chat template " + t_.name +
             " has no system turn and puts a system message into the next user message, but an assistant "
             "message comes first";
    if (r == "user") system_waiting = false;
  }
  if (system_waiting && for_reply)
    return what + ": chat template " + t_.name +
           " has no system turn and puts a system message into the next user message, but none follows it";
  if (for_reply && messages.back().role == "assistant")
    return what + "[" + std::to_string(messages.size() - 1) +
           "].role: the last message is the assistant's; the reply is what the model writes next";
  return {};
}

ChatTokens ChatFormat::render(const std::vector<ChatMessage>& messages, bool for_reply) const {
  const std::string problem = check(messages, for_reply);
  if (!problem.empty()) fail(kChatComponent, problem);
  ChatTokens out;
  std::string run, system_text;
  bool first = true;
  auto append = [&](const std::vector<int32_t>& ids, uint8_t target) {
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.target.resize(out.ids.size(), target);
  };
  auto flush = [&] {
    append(tok_.encode(run, /*add_special=*/first), 0);
    first = false;
    run.clear();
  };
  for (const ChatMessage& m : messages) {
    const std::string content = content_text(m.content);
    if (m.role == "system") {
      if (t_.system_role)
        run += t_.system.prefix + content + t_.system.suffix;
      else
        system_text += m.content + t_.system_separator;  // as it is, trim_content or not
    } else if (m.role == "user") {
      run += t_.user.prefix + system_text + content + t_.user.suffix;
      system_text.clear();
    } else {
      run += t_.assistant.prefix;
      flush();
      append(tok_.encode(content), 1);
      append({end_id_}, 1);
      run = t_.assistant.suffix;
    }
  }
  if (for_reply) {
    run += t_.assistant.prefix;
    flush();
  }
  return out;
}

}  // namespace zaya
