// libFuzzer target: arbitrary bytes as a POST /v1/completions body. Every rejection must be an
// ApiError (a 400 naming the field); any other exception escaping is a bug, and so is an
// accepted request that breaks the limits the engine relies on.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "serve/completion_request.h"

namespace {

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const zaya::ModelLimits limits{512, 1024};
  try {
    const nlohmann::json body = zaya::parse_json_body(std::string(reinterpret_cast<const char*>(data), size));
    const zaya::CompletionRequest r = zaya::parse_completion_request(body, limits);
    if (r.prompts.empty()) bug("accepted a request without a prompt");
    if (r.n < 1 || int64_t(r.prompts.size()) * r.n > zaya::kMaxChoices) bug("accepted too many choices");
    if (r.max_tokens < 0 || r.max_tokens > limits.context_length) bug("accepted max_tokens out of range");
    if (r.logprobs < -1 || r.logprobs > zaya::kMaxLogprobs) bug("accepted logprobs out of range");
    if (r.stop.size() > zaya::kMaxStop) bug("accepted too many stop sequences");
    for (const auto& [id, bias] : r.sampling.logit_bias)
      if (id < 0 || id >= limits.vocab_size || !(bias >= -100 && bias <= 100))
        bug("accepted a bad logit_bias");
    // Text prompts need a tokenizer (none here): that is a 400 too.
    for (const auto& prompt : zaya::completion_prompt_ids(r, nullptr, limits)) {
      if (prompt.empty() || int64_t(prompt.size()) + r.max_tokens > limits.context_length)
        bug("accepted a prompt that does not fit");
      for (int32_t id : prompt)
        if (id < 0 || id >= limits.vocab_size) bug("accepted a token id outside the vocabulary");
    }
  } catch (const zaya::ApiError&) {
    return 0;
  } catch (const std::exception& e) {
    bug(std::string("a request escaped validation with: ") + e.what());
  }
  return 0;
}
