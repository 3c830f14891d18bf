// The request bodies of the HTTP inference API (docs/serving.md): parsing and validating
// POST /v1/completions, /tokenize and /detokenize JSON into plain structs. Pure functions
// (no model, no I/O, no locks); every rejection is an ApiError 400 whose message names the
// field and says what was expected and what came. Unknown fields are ignored, as OpenAI does;
// known fields of a wrong type are errors.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "serve/api_error.h"
#include "serve/logprobs.h"
#include "serve/sampling.h"

namespace zaya {

// What a request is checked against.
struct ModelLimits {
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // prompt + generated tokens must fit
};

// One prompt of a request: text, or token ids (each in [0, vocab_size)).
struct PromptInput {
  bool is_text = false;
  std::string text;          // when is_text
  std::vector<int32_t> ids;  // otherwise
};

struct CompletionRequest {
  std::vector<PromptInput> prompts;  // one, or a batch; each gets n choices
  int64_t max_tokens = 16;           // >= 0; 0 generates nothing (an echo, or prompt scoring)
  int64_t n = 1;                     // choices per prompt; choice j of a prompt samples with seed + j
  // Candidates per prompt (>= n): candidate j samples with seed + j, and the n whose sampled
  // tokens have the highest mean log-probability are returned, likeliest first.
  int64_t best_of = 1;
  SamplingParams sampling;           // OpenAI's defaults: temperature 1, no top-k, top_p 1, no adjustments
  std::optional<uint64_t> seed;            // none: the server picks one
  std::vector<std::string> stop;           // at most kMaxStop non-empty strings
  bool stream = false;
  bool echo = false;  // the prompt leads each choice's text (and its logprobs)
  int logprobs = -1;  // -1: none; else how many alternatives per token (0 .. kMaxLogprobs)
};

constexpr size_t kMaxStop = 4;
constexpr int64_t kMaxChoices = 128;  // prompts x n, per request
constexpr double kMaxPenalty = 2, kMaxLogitBias = 100;

// Parses a request body as JSON; a malformed body is a 400 naming the parse error.
nlohmann::json parse_json_body(const std::string& body);

// Validates a /v1/completions body (already parsed JSON) against the model's limits.
CompletionRequest parse_completion_request(const nlohmann::json& body, const ModelLimits& limits);

// Every prompt as token ids, in order: a text prompt is encoded with the tokenizer's special
// tokens (as `zaya generate --prompt` does). Checks what needs the tokenizer (a text prompt,
// stop sequences), that every id is inside the model's vocabulary and that each prompt +
// max_tokens fits the context. tokenizer may be null.
std::vector<std::vector<int32_t>> completion_prompt_ids(const CompletionRequest& request,
                                                        const Tokenizer* tokenizer,
                                                        const ModelLimits& limits);

// POST /v1/chat/completions: a completion whose one prompt is the message list rendered by the
// server's chat template (the prompt of the assistant's next reply), ending at the template's end
// of reply.
struct ChatCompletionRequest {
  CompletionRequest completion;  // prompts[0] holds the rendered ids; max_tokens is resolved
  std::vector<ChatMessage> messages;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
};

// Validates a /v1/chat/completions body: messages (rendered by `chat`; null: the server has no
// chat template, a 400), max_completion_tokens or max_tokens (default: the rest of the context),
// n, temperature, top_p, top_k, seed, stop, presence/frequency penalties, logit_bias, logprobs
// (a boolean) with top_logprobs, stream and stream_options. Tools and structured output are
// refused. The rendered prompt is checked against the vocabulary and context as
// completion_prompt_ids checks a prompt.
ChatCompletionRequest parse_chat_completion_request(const nlohmann::json& body, const ModelLimits& limits,
                                                    const ChatFormat* chat);

struct TokenizeRequest {
  std::string text;
  bool add_special = true;  // the tokenizer's special tokens (BOS), as a completion's text prompt gets
};
TokenizeRequest parse_tokenize_request(const nlohmann::json& body);

struct DetokenizeRequest {
  std::vector<int32_t> ids;
  bool skip_special = true;  // drop special/control tokens, as completion text does
};
// ids are checked against the tokenizer's vocabulary.
DetokenizeRequest parse_detokenize_request(const nlohmann::json& body, int64_t vocab_size);

// A value as it appears in an error message: JSON, shortened when long.
std::string describe_json_value(const nlohmann::json& value);

}  // namespace zaya
