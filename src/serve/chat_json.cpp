// OpenAI chat-shaped response bodies (see chat_json.h).
#include "serve/chat_json.h"

#include <algorithm>
#include <optional>
#include <string>

namespace zaya {

using json = nlohmann::json;

namespace {

json utf8_bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(int(c));
  return bytes;
}

// The chat form of logprobs: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob,
// bytes}]}]}, or null when none were asked for.
json chat_logprobs_json(const std::optional<std::vector<LogprobEntry>>& entries) {
  if (!entries) return nullptr;
  json content = json::array();
  for (const LogprobEntry& e : *entries) {
    json top = json::array();
    if (e.top) {
      std::vector<std::string> seen;  // two ids with one text: the likelier
      for (const auto& [name, logprob] : *e.top) {
        if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
        seen.push_back(name);
        top.push_back({{"token", name}, {"logprob", logprob}, {"bytes", utf8_bytes(name)}});
      }
    }
    content.push_back({{"token", e.token},
                       {"logprob", e.logprob ? json(*e.logprob) : json(nullptr)},
                       {"bytes", utf8_bytes(e.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

json chat(const CompletionMeta& meta, const char* object, json choices) {
  return {{"id", meta.id},
          {"object", object},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", std::move(choices)}};
}

json chunk_choice(int64_t index, json delta, const std::vector<int32_t>& ids,
                  const std::optional<std::vector<LogprobEntry>>& logprobs, json finish_reason) {
  return {{"index", index},
          {"delta", std::move(delta)},
          {"token_ids", ids},
          {"logprobs", chat_logprobs_json(logprobs)},
          {"finish_reason", std::move(finish_reason)}};
}

}  // namespace

json chat_completion_body(const CompletionMeta& meta, const std::vector<CompletionResult>& results,
                          const CompletionUsage& usage) {
  json choices = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const CompletionResult& r = results[i];
    choices.push_back({{"index", int64_t(i)},
                       {"message", {{"role", "assistant"}, {"content", r.text}}},
                       {"token_ids", r.ids},
                       {"logprobs", chat_logprobs_json(r.logprobs)},
                       {"finish_reason", r.finish_reason}});
  }
  json body = chat(meta, "chat.completion", std::move(choices));
  body["usage"] = usage_json(usage);
  return body;
}

json chat_role_chunk_body(const CompletionMeta& meta, int64_t index) {
  return chat(meta, "chat.completion.chunk",
              json::array({chunk_choice(index, {{"role", "assistant"}, {"content", ""}}, {}, std::nullopt,
                                        nullptr)}));
}

json chat_chunk_body(const CompletionMeta& meta, int64_t index, const CompletionChunk& c) {
  return chat(meta, "chat.completion.chunk",
              json::array({chunk_choice(index, {{"content", c.text}}, c.ids, c.logprobs, nullptr)}));
}

json chat_final_chunk_body(const CompletionMeta& meta, int64_t index, const CompletionResult& r) {
  return chat(meta, "chat.completion.chunk",
              json::array({chunk_choice(index, json::object(), {}, std::nullopt, r.finish_reason)}));
}

json chat_usage_chunk_body(const CompletionMeta& meta, const CompletionUsage& usage) {
  json body = chat(meta, "chat.completion.chunk", json::array());
  body["usage"] = usage_json(usage);
  return body;
}

}  // namespace zaya
