// OpenAI-shaped response bodies (see api_json.h).
#include "serve/api_json.h"

namespace zaya {

using json = nlohmann::json;

namespace {

json usage(const CompletionResult& r) {
  const int64_t completion = int64_t(r.ids.size());
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", r.prompt_tokens + completion}};
}

json completion(const CompletionMeta& meta, json choice) {
  choice["index"] = 0;
  choice["logprobs"] = nullptr;
  return {{"id", meta.id},
          {"object", "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array({std::move(choice)})}};
}

}  // namespace

json error_body(const std::string& message, const std::string& type) {
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
}

json completion_body(const CompletionMeta& meta, const CompletionResult& r) {
  json body = completion(meta, {{"text", r.text}, {"token_ids", r.ids}, {"finish_reason", r.finish_reason}});
  body["usage"] = usage(r);
  return body;
}

json completion_chunk_body(const CompletionMeta& meta, const CompletionChunk& c) {
  return completion(meta, {{"text", c.text}, {"token_ids", c.ids}, {"finish_reason", nullptr}});
}

json completion_final_chunk_body(const CompletionMeta& meta, const CompletionResult& r) {
  json body =
      completion(meta, {{"text", ""}, {"token_ids", json::array()}, {"finish_reason", r.finish_reason}});
  body["usage"] = usage(r);
  return body;
}

json models_body(const std::string& model, int64_t created, int64_t context_length, int64_t vocab_size) {
  json entry = {{"id", model},
                {"object", "model"},
                {"created", created},
                {"owned_by", "zaya"},
                {"context_length", context_length},
                {"vocab_size", vocab_size}};
  return {{"object", "list"}, {"data", json::array({std::move(entry)})}};
}

std::string json_text(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& value) { return "data: " + json_text(value) + "\n\n"; }

}  // namespace zaya
