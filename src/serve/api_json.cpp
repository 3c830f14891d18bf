// OpenAI-shaped response bodies (see api_json.h).
#include "serve/api_json.h"

namespace zaya {

using json = nlohmann::json;

namespace {

json logprobs_json(const std::optional<std::vector<LogprobEntry>>& entries) {
  if (!entries) return nullptr;
  json tokens = json::array(), logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const LogprobEntry& e : *entries) {
    tokens.push_back(e.token);
    logprobs.push_back(e.logprob ? json(*e.logprob) : json(nullptr));
    if (e.top) {
      json alternatives = json::object();
      for (const auto& [name, logprob] : *e.top)
        if (!alternatives.contains(name)) alternatives[name] = logprob;  // two ids, one text: the likelier
      top.push_back(std::move(alternatives));
    } else {
      top.push_back(nullptr);
    }
    offsets.push_back(e.text_offset);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

json choice_json(int64_t index, const std::string& text, const std::vector<int32_t>& ids,
                 const std::optional<std::vector<LogprobEntry>>& logprobs, json finish_reason) {
  return {{"index", index},
          {"text", text},
          {"token_ids", ids},
          {"logprobs", logprobs_json(logprobs)},
          {"finish_reason", std::move(finish_reason)}};
}

json completion(const CompletionMeta& meta, json choices) {
  return {{"id", meta.id},
          {"object", "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", std::move(choices)}};
}

}  // namespace

json usage_json(const CompletionUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json error_body(const std::string& message, const std::string& type) {
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
}

json completion_body(const CompletionMeta& meta, const std::vector<CompletionResult>& results,
                     const CompletionUsage& usage) {
  json choices = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const CompletionResult& r = results[i];
    choices.push_back(choice_json(int64_t(i), r.text, r.ids, r.logprobs, r.finish_reason));
  }
  json body = completion(meta, std::move(choices));
  body["usage"] = usage_json(usage);
  return body;
}

json completion_chunk_body(const CompletionMeta& meta, int64_t index, const CompletionChunk& c) {
  return completion(meta, json::array({choice_json(index, c.text, c.ids, c.logprobs, nullptr)}));
}

json completion_final_chunk_body(const CompletionMeta& meta, int64_t index, const CompletionResult& r,
                                 const CompletionUsage* usage) {
  std::optional<std::vector<LogprobEntry>> no_tokens;
  if (r.logprobs) no_tokens.emplace();
  json body = completion(meta, json::array({choice_json(index, "", {}, no_tokens, r.finish_reason)}));
  if (usage) body["usage"] = usage_json(*usage);
  return body;
}

json models_body(const std::string& model, int64_t created, int64_t context_length, int64_t vocab_size,
                 const std::string& chat_template) {
  json entry = {{"id", model},
                {"object", "model"},
                {"created", created},
                {"owned_by", "zaya"},
                {"context_length", context_length},
                {"vocab_size", vocab_size},
                {"chat_template", chat_template.empty() ? json(nullptr) : json(chat_template)}};
  return {{"object", "list"}, {"data", json::array({std::move(entry)})}};
}

std::string json_text(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& value) { return "data: " + json_text(value) + "\n\n"; }

}  // namespace zaya
