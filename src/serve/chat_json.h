// The JSON bodies of POST /v1/chat/completions, in OpenAI's chat shapes (docs/serving.md): a
// whole chat completion (object "chat.completion", each choice a message from the assistant) and
// its Server-Sent Events chunks (object "chat.completion.chunk", each carrying a delta). Pure
// builders over the engine's results; logprobs become the chat form, a list of {token, logprob,
// bytes, top_logprobs} per generated token.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "serve/api_json.h"
#include "serve/completion_engine.h"

namespace zaya {

// {"id", "object": "chat.completion", "created", "model", "choices": [{"index", "message":
// {"role": "assistant", "content"}, "token_ids", "logprobs", "finish_reason"}], "usage"}
nlohmann::json chat_completion_body(const CompletionMeta& meta, const std::vector<CompletionResult>& results,
                                    const CompletionUsage& usage);

// The first chunk of choice `index`: delta {"role": "assistant", "content": ""}.
nlohmann::json chat_role_chunk_body(const CompletionMeta& meta, int64_t index);
// One generated step of choice `index`: delta {"content": text}, its ids and logprobs.
nlohmann::json chat_chunk_body(const CompletionMeta& meta, int64_t index, const CompletionChunk& chunk);
// The last chunk of choice `index`: an empty delta, the finish_reason and null logprobs.
nlohmann::json chat_final_chunk_body(const CompletionMeta& meta, int64_t index,
                                     const CompletionResult& result);
// stream_options.include_usage: after every choice has ended, a chunk with no choices and the usage.
nlohmann::json chat_usage_chunk_body(const CompletionMeta& meta, const CompletionUsage& usage);

}  // namespace zaya
