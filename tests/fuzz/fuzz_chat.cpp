// libFuzzer target: the chat inputs. The first byte picks what the rest is: even, a POST
// /v1/chat/completions body (every rejection must be an ApiError, a 400 naming the field, and an
// accepted request must fit the limits the engine relies on); odd, a chat template file (every
// rejection must be a zaya::Error naming the file; a template that loads renders a fixed
// conversation to ids inside the vocabulary, a target flag for each).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/error.h"
#include "data/chat_template.h"
#include "serve/completion_request.h"

namespace {

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::abort();
}

// Bytes as ids (byte + 3), BOS 1, EOS 2, and "<end>" as id 300.
class ByteTokenizer final : public zaya::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<int32_t> ids;
    if (add_special) ids.push_back(1);
    for (size_t i = 0; i < text.size();) {
      if (text.substr(i, 5) == "<end>") {
        ids.push_back(300);
        i += 5;
      } else {
        ids.push_back(int32_t(static_cast<unsigned char>(text[i++])) + 3);
      }
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>&, bool) const override { return {}; }
  int64_t vocab_size() const override { return 301; }
  int32_t token_to_id(std::string_view) const override { return -1; }
  std::string id_to_token(int32_t) const override { return {}; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
};

void fuzz_request(const std::string& body_text) {
  static const ByteTokenizer tok;
  static const zaya::ChatFormat chat(zaya::load_chat_template("plain"), tok);
  const zaya::ModelLimits limits{301, 1024};
  try {
    const nlohmann::json body = zaya::parse_json_body(body_text);
    const zaya::ChatCompletionRequest c = zaya::parse_chat_completion_request(body, limits, &chat);
    const zaya::CompletionRequest& r = c.completion;
    if (r.prompts.size() != 1 || r.prompts[0].is_text) bug("a chat request is not one prompt of ids");
    const std::vector<int32_t>& ids = r.prompts[0].ids;
    if (ids.empty() || ids.front() != 1) bug("a chat prompt does not start with BOS");
    for (int32_t id : ids)
      if (id < 0 || id >= limits.vocab_size) bug("accepted a token id outside the vocabulary");
    if (r.max_tokens < 1 || int64_t(ids.size()) + r.max_tokens > limits.context_length)
      bug("accepted a reply that does not fit the context");
    if (r.n < 1 || r.n > zaya::kMaxChoices || r.best_of < r.n) bug("accepted a bad n or best_of");
    if (r.logprobs < -1 || r.logprobs > zaya::kMaxLogprobs) bug("accepted logprobs out of range");
    if (r.echo) bug("a chat request echoes");
    if (c.include_usage && !r.stream) bug("include_usage without stream");
  } catch (const zaya::ApiError&) {
  } catch (const std::exception& e) {
    bug(std::string("a chat request escaped validation with: ") + e.what());
  }
}

void fuzz_template(const std::string& text) {
  static const ByteTokenizer tok;
  static const std::vector<zaya::ChatMessage> conversation = {
      {"system", " s "}, {"user", "u"}, {"assistant", "a"}, {"user", "v"}, {"assistant", ""}, {"user", "w"}};
  try {
    const zaya::ChatFormat chat(zaya::parse_chat_template(text, "fuzz.toml"), tok);
    for (const bool for_reply : {false, true}) {
      const zaya::ChatTokens t = chat.render(conversation, for_reply);
      if (t.ids.size() != t.target.size()) bug("a target flag per id");
      size_t targets = 0;
      for (size_t i = 0; i < t.ids.size(); ++i) {
        if (t.ids[i] < 0 || t.ids[i] >= tok.vocab_size()) bug("a rendered id outside the vocabulary");
        targets += t.target[i];
      }
      if (targets != 3) bug("the replies \"a\" and \"\" with their ends are not the 3 targets");
    }
  } catch (const zaya::Error& e) {
    if (std::string(e.what()).find("fuzz.toml") == std::string::npos &&
        std::string(e.what()).find("chat template") == std::string::npos)
      bug(std::string("an error that names neither the file nor the template: ") + e.what());
  } catch (const std::exception& e) {
    bug(std::string("a template file escaped validation with: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0)
    fuzz_request(rest);
  else
    fuzz_template(rest);
  return 0;
}
