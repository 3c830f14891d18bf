// The JSON bodies the inference API answers with, in OpenAI's shapes (docs/serving.md):
// completions (whole and as Server-Sent Events chunks), the model list and errors. Pure
// builders; text that is not valid UTF-8 is written with U+FFFD rather than failing.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/completion_engine.h"

namespace zaya {

// Who answered and when: the same for every chunk of one completion.
struct CompletionMeta {
  std::string id;       // "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

// {"error": {"message", "type", "param": null, "code": null}}
nlohmann::json error_body(const std::string& message, const std::string& type);

// Token counts of a whole request: each prompt once, every choice's generated tokens.
struct CompletionUsage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// {"prompt_tokens", "completion_tokens", "total_tokens"}
nlohmann::json usage_json(const CompletionUsage& usage);

// A whole completion: id, object "text_completion", created, model, choices [{index, text,
// token_ids, logprobs, finish_reason}] (choice i is results[i]), usage. logprobs is null, or
// OpenAI's {tokens, token_logprobs, top_logprobs, text_offset}.
nlohmann::json completion_body(const CompletionMeta& meta, const std::vector<CompletionResult>& results,
                               const CompletionUsage& usage);

// One streamed chunk of choice `index`: the same shape with this step's text, ids and logprobs
// and finish_reason null.
nlohmann::json completion_chunk_body(const CompletionMeta& meta, int64_t index, const CompletionChunk& chunk);
// The last streamed chunk of choice `index`: no text, its finish_reason, and (on the request's
// very last chunk) the usage.
nlohmann::json completion_final_chunk_body(const CompletionMeta& meta, int64_t index,
                                           const CompletionResult& result, const CompletionUsage* usage);

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created", "owned_by",
// "context_length", "vocab_size", "chat_template"}]} (the chat template's name or file, null without one)
nlohmann::json models_body(const std::string& model, int64_t created, int64_t context_length,
                           int64_t vocab_size, const std::string& chat_template = "");

// Serialised JSON (invalid UTF-8 replaced by U+FFFD).
std::string json_text(const nlohmann::json& value);
// One Server-Sent Event: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& value);

}  // namespace zaya
