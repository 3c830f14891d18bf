// Request validation for the inference API (see completion_request.h).
#include "serve/completion_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace zaya {

using json = nlohmann::json;

namespace {

[[noreturn]] void expected(const std::string& field, const std::string& what, const json& got) {
  invalid_request(field + ": expected " + what + ", got " + describe_json_value(got));
}

void require_object(const json& body) {
  if (!body.is_object()) expected("request body", "a JSON object", body);
}

// The field's value, or nullptr when it is absent or null (null means "the default", as in
// OpenAI's API).
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// An integer JSON number (not a boolean, not 3.0) that fits int64.
bool get_int64(const json& v, int64_t* out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = int64_t(u);
  } else {
    *out = v.get<int64_t>();
  }
  return true;
}

bool get_bool_field(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) expected(name, "true or false", *v);
  return v->get<bool>();
}

// Token ids in [0, vocab_size): `name` is the field (or element path) named in errors.
std::vector<int32_t> parse_ids(const json& arr, const std::string& name, int64_t vocab_size) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string at = name + "[" + std::to_string(i) + "]";
    int64_t id = 0;
    if (!get_int64(arr[i], &id) || id < 0) {
      // A huge unsigned value is an integer, just not one in the vocabulary.
      if (arr[i].is_number_unsigned())
        id = std::numeric_limits<int64_t>::max();
      else
        expected(at, "a token id (a non-negative integer)", arr[i]);
    }
    if (id >= vocab_size)
      invalid_request(at + ": token id " + describe_json_value(arr[i]) + " is outside the vocabulary [0, " +
                      std::to_string(vocab_size) + ")");
    ids.push_back(int32_t(id));
  }
  return ids;
}

PromptInput parse_one_prompt(const json& p, const std::string& name, const ModelLimits& limits) {
  PromptInput in;
  if (p.is_string()) {
    in.is_text = true;
    in.text = p.get<std::string>();
  } else if (p.is_array()) {
    if (p.empty()) expected(name, "a non-empty array of token ids", p);
    in.ids = parse_ids(p, name, limits.vocab_size);
  } else {
    expected(name, "a string or an array of token ids", p);
  }
  return in;
}

void parse_prompt(const json& body, const ModelLimits& limits, CompletionRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) invalid_request("prompt: required; send a string or an array of token ids");
  // A batch is an array of strings or of id arrays; a flat array of integers is one prompt.
  if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    for (size_t i = 0; i < p->size(); ++i)
      r.prompts.push_back(parse_one_prompt((*p)[i], "prompt[" + std::to_string(i) + "]", limits));
  } else {
    r.prompts.push_back(parse_one_prompt(*p, "prompt", limits));
  }
}

void parse_sampling(const json& body, CompletionRequest& r) {
  if (const json* v = field(body, "temperature")) {
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0)
      expected("temperature", "a number >= 0 (0 = greedy)", *v);
    r.sampling.temperature = v->get<float>();
  }
  if (const json* v = field(body, "top_p")) {
    // Checked as the float the sampler gets (1e-300 is 0 there).
    if (!v->is_number() || !(v->get<float>() > 0 && v->get<float>() <= 1))
      expected("top_p", "a number in (0, 1]", *v);
    r.sampling.top_p = v->get<float>();
  }
  if (const json* v = field(body, "top_k")) {
    int64_t k = 0;
    if (!get_int64(*v, &k) || k < 0) expected("top_k", "an integer >= 0 (0 = off)", *v);
    r.sampling.top_k = k;
  }
  if (const json* v = field(body, "seed")) {
    if (!v->is_number_integer() || (!v->is_number_unsigned() && v->get<int64_t>() < 0))
      expected("seed", "a non-negative integer", *v);
    r.seed = v->get<uint64_t>();
  }
}

void parse_stop(const json& body, CompletionRequest& r) {
  const json* v = field(body, "stop");
  if (!v) return;
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().empty()) expected("stop", "a non-empty string", *v);
    r.stop.push_back(v->get<std::string>());
    return;
  }
  if (!v->is_array()) expected("stop", "a string or an array of strings", *v);
  if (v->size() > kMaxStop)
    invalid_request("stop: at most " + std::to_string(kMaxStop) + " sequences are allowed, got " +
                    std::to_string(v->size()));
  for (size_t i = 0; i < v->size(); ++i) {
    const json& s = (*v)[i];
    if (!s.is_string() || s.get_ref<const std::string&>().empty())
      expected("stop[" + std::to_string(i) + "]", "a non-empty string", s);
    r.stop.push_back(s.get<std::string>());
  }
}

void parse_choices(const json& body, CompletionRequest& r) {
  if (const json* v = field(body, "n"))
    if (!get_int64(*v, &r.n) || r.n < 1 || r.n > kMaxChoices)
      expected("n", "an integer in [1, " + std::to_string(kMaxChoices) + "]", *v);
  const int64_t choices = int64_t(r.prompts.size()) * r.n;
  if (choices > kMaxChoices)
    invalid_request("prompt: " + std::to_string(r.prompts.size()) + " prompts x n = " + std::to_string(r.n) +
                    " make " + std::to_string(choices) + " choices; at most " + std::to_string(kMaxChoices) +
                    " are allowed per request");
  // best_of: candidates generated per prompt, of which the n likeliest are returned.
  r.best_of = r.n;
  if (const json* v = field(body, "best_of"))
    if (!get_int64(*v, &r.best_of) || r.best_of < r.n || r.best_of > kMaxChoices)
      expected("best_of",
               "an integer in [n = " + std::to_string(r.n) + ", " + std::to_string(kMaxChoices) + "]", *v);
  const int64_t candidates = int64_t(r.prompts.size()) * r.best_of;
  if (candidates > kMaxChoices)
    invalid_request("best_of: " + std::to_string(r.prompts.size()) +
                    " prompts x best_of = " + std::to_string(r.best_of) + " make " +
                    std::to_string(candidates) + " completions to generate; at most " +
                    std::to_string(kMaxChoices) + " are allowed per request");
}

void parse_logit_adjustments(const json& body, const ModelLimits& limits, CompletionRequest& r) {
  const std::pair<const char*, float*> penalties[] = {{"presence_penalty", &r.sampling.presence_penalty},
                                                      {"frequency_penalty", &r.sampling.frequency_penalty}};
  for (const auto& [name, target] : penalties) {
    const json* v = field(body, name);
    if (!v) continue;
    if (!v->is_number() || !(std::fabs(v->get<double>()) <= kMaxPenalty))
      expected(name, "a number in [-2, 2]", *v);
    *target = v->get<float>();
  }
  const json* bias = field(body, "logit_bias");
  if (!bias) return;
  if (!bias->is_object())
    expected("logit_bias", "an object mapping token ids (as strings) to numbers", *bias);
  for (const auto& [key, value] : bias->items()) {
    const std::string at = "logit_bias[" + describe_json_value(key) + "]";
    int64_t id = -1;
    if (!key.empty() && key.size() <= 18 && key.find_first_not_of("0123456789") == std::string::npos)
      id = std::stoll(key);
    if (id < 0)
      invalid_request("logit_bias: key " + describe_json_value(key) +
                      " is not a token id (a non-negative integer)");
    if (id >= limits.vocab_size)
      invalid_request(at + ": token id " + key + " is outside the vocabulary [0, " +
                      std::to_string(limits.vocab_size) + ")");
    if (!value.is_number() || !(std::fabs(value.get<double>()) <= kMaxLogitBias))
      expected(at, "a number in [-100, 100]", value);
    r.sampling.logit_bias.emplace_back(int32_t(id), value.get<float>());
  }
}

void parse_logprobs(const json& body, CompletionRequest& r) {
  if (const json* v = field(body, "logprobs")) {
    int64_t k = -1;
    if (!get_int64(*v, &k) || k < 0 || k > kMaxLogprobs)
      expected("logprobs", "an integer in [0, " + std::to_string(kMaxLogprobs) + "] (alternatives per token)",
               *v);
    r.logprobs = int(k);
  }
  r.echo = get_bool_field(body, "echo", false);
}

// Fields of OpenAI's API this server does not implement: accepted only at their defaults,
// so that a client asking for them learns it did not get them.
void reject_unsupported(const json& body) {
  if (const json* v = field(body, "suffix");
      v && !(v->is_string() && v->get_ref<const std::string&>().empty()))
    invalid_request("suffix: not supported by this server, got " + describe_json_value(*v));
  if (const json* v = field(body, "model"); v && !v->is_string()) expected("model", "a string", *v);
}

}  // namespace

std::string describe_json_value(const json& value) {
  std::string s = value.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  constexpr size_t kMax = 80;
  if (s.size() > kMax) s = s.substr(0, kMax - 3) + "...";
  return s;
}

json parse_json_body(const std::string& body) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos)
    invalid_request("request body: expected a JSON object, got an empty body");
  try {
    return json::parse(body);
  } catch (const json::exception& e) {
    // A syntax error (parse_error) or a number too large for a double (out_of_range 406);
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 2: ...".
    std::string what = e.what();
    const size_t bracket = what.find("] ");
    invalid_request("request body: malformed JSON: " +
                    (bracket == std::string::npos ? what : what.substr(bracket + 2)));
  }
}

CompletionRequest parse_completion_request(const json& body, const ModelLimits& limits) {
  require_object(body);
  CompletionRequest r;
  parse_prompt(body, limits, r);
  if (const json* v = field(body, "max_tokens")) {
    if (!get_int64(*v, &r.max_tokens) || r.max_tokens < 0)
      expected("max_tokens", "an integer >= 0 (0: no generation)", *v);
    if (r.max_tokens > limits.context_length)
      invalid_request("max_tokens: " + std::to_string(r.max_tokens) + " exceeds the model's context length " +
                      std::to_string(limits.context_length));
  }
  parse_sampling(body, r);
  parse_stop(body, r);
  parse_choices(body, r);
  parse_logit_adjustments(body, limits, r);
  parse_logprobs(body, r);
  r.stream = get_bool_field(body, "stream", false);
  if (r.stream && r.best_of > r.n)
    invalid_request(
        "best_of: the likeliest choices are known only once every candidate has finished, so "
        "streaming needs best_of = n (" +
        std::to_string(r.n) + "), got " + std::to_string(r.best_of));
  reject_unsupported(body);
  return r;
}

std::vector<std::vector<int32_t>> completion_prompt_ids(const CompletionRequest& r,
                                                        const Tokenizer* tokenizer,
                                                        const ModelLimits& limits) {
  if (!r.stop.empty() && !tokenizer)
    invalid_request(
        "stop: stop sequences are matched against decoded text, and this server has no tokenizer");
  std::vector<std::vector<int32_t>> all;
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    const PromptInput& p = r.prompts[i];
    const std::string name = r.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]";
    std::vector<int32_t> ids;
    if (p.is_text) {
      if (!tokenizer)
        invalid_request(
            name +
            ": a text prompt needs a tokenizer and this server has none; send the prompt as an array "
            "of token ids, or start the server with --tokenizer PATH");
      ids = tokenizer->encode(p.text, /*add_special=*/true);
      if (ids.empty()) invalid_request(name + ": the text encodes to no tokens");
      for (int32_t id : ids)
        if (id < 0 || id >= limits.vocab_size)
          invalid_request(name + ": the tokenizer gave token id " + std::to_string(id) +
                          ", outside the model's vocabulary [0, " + std::to_string(limits.vocab_size) +
                          "); the server's tokenizer does not match its model");
    } else {
      ids = p.ids;
    }
    const int64_t n = int64_t(ids.size());
    if (n > limits.context_length || (n == limits.context_length && r.max_tokens > 0))
      invalid_request(name + ": " + std::to_string(n) + " tokens " +
                      (n > limits.context_length ? "exceed" : "leave no room to generate in") +
                      " the model's context length " + std::to_string(limits.context_length));
    if (n + r.max_tokens > limits.context_length)
      invalid_request("max_tokens: the " + name + " (" + std::to_string(n) + " tokens) + max_tokens (" +
                      std::to_string(r.max_tokens) + ") exceeds the model's context length " +
                      std::to_string(limits.context_length) + "; ask for at most " +
                      std::to_string(limits.context_length - n));
    all.push_back(std::move(ids));
  }
  return all;
}

ChatCompletionRequest parse_chat_completion_request(const json& body, const ModelLimits& limits,
                                                    const ChatFormat* chat) {
  require_object(body);
  if (!chat)
    invalid_request(
        "messages: this server has no chat template; start it with --chat-template NAME|FILE (the one the "
        "model "
        "was fine-tuned with), or send the prompt text to /v1/completions");
  ChatCompletionRequest c;
  CompletionRequest& r = c.completion;
  const json* m = field(body, "messages");
  if (!m) invalid_request("messages: required; send an array of {\"role\", \"content\"} messages");
  std::string error;
  c.messages = parse_chat_messages(*m, "messages", &error);
  if (error.empty()) error = chat->check(c.messages, /*for_reply=*/true);
  if (!error.empty()) invalid_request(error);
  PromptInput prompt;
  prompt.ids = chat->render(c.messages, /*for_reply=*/true).ids;
  for (int32_t id : prompt.ids)
    if (id < 0 || id >= limits.vocab_size)
      invalid_request("messages: the tokenizer gave token id " + std::to_string(id) +
                      ", outside the model's vocabulary [0, " + std::to_string(limits.vocab_size) +
                      "); the server's tokenizer does not match its model");
  if (prompt.ids.empty()) invalid_request("messages: the chat template renders them to no tokens");
  const int64_t n = int64_t(prompt.ids.size());
  r.prompts.push_back(std::move(prompt));
  // The reply may use the rest of the context unless the client bounds it.
  const char* limit_name = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (const json* v = field(body, limit_name)) {
    if (!get_int64(*v, &r.max_tokens) || r.max_tokens < 1) expected(limit_name, "an integer >= 1", *v);
    if (r.max_tokens > limits.context_length - n)  // not n + max_tokens: that can overflow
      invalid_request(std::string(limit_name) + ": the messages (" + std::to_string(n) + " tokens) + " +
                      limit_name + " (" + std::to_string(r.max_tokens) +
                      ") exceed the model's context length " + std::to_string(limits.context_length) +
                      "; ask for at most " + std::to_string(std::max<int64_t>(0, limits.context_length - n)));
  } else {
    if (n >= limits.context_length)
      invalid_request("messages: " + std::to_string(n) +
                      " tokens leave no room for a reply in the model's context length " +
                      std::to_string(limits.context_length));
    r.max_tokens = limits.context_length - n;
  }
  parse_sampling(body, r);
  parse_stop(body, r);
  parse_choices(body, r);
  parse_logit_adjustments(body, limits, r);
  if (get_bool_field(body, "logprobs", false)) {
    r.logprobs = 0;
    if (const json* v = field(body, "top_logprobs")) {
      int64_t k = -1;
      if (!get_int64(*v, &k) || k < 0 || k > kMaxLogprobs)
        expected("top_logprobs", "an integer in [0, " + std::to_string(kMaxLogprobs) + "]", *v);
      r.logprobs = int(k);
    }
  } else if (field(body, "top_logprobs")) {
    invalid_request("top_logprobs: needs \"logprobs\": true");
  }
  r.stream = get_bool_field(body, "stream", false);
  if (r.stream && r.best_of > r.n)
    invalid_request("best_of: streaming needs best_of = n (" + std::to_string(r.n) + "), got " +
                    std::to_string(r.best_of));
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) expected("stream_options", "an object", *v);
    if (!r.stream) invalid_request("stream_options: applies only with \"stream\": true");
    c.include_usage = get_bool_field(*v, "include_usage", false);
  }
  // Tools and structured output are not implemented: a client asking for them learns so.
  if (const json* v = field(body, "tools"); v && !(v->is_array() && v->empty()))
    invalid_request("tools: tool calls are not supported by this server");
  if (const json* v = field(body, "functions"); v && !(v->is_array() && v->empty()))
    invalid_request("functions: function calls are not supported by this server");
  if (const json* v = field(body, "response_format")) {
    const json* type = v->is_object() ? field(*v, "type") : nullptr;
    if (!type || *type != "text")
      invalid_request("response_format: only {\"type\": \"text\"} is supported by this server, got " +
                      describe_json_value(*v));
  }
  if (const json* v = field(body, "model"); v && !v->is_string()) expected("model", "a string", *v);
  return c;
}

TokenizeRequest parse_tokenize_request(const json& body) {
  require_object(body);
  TokenizeRequest r;
  const json* v = field(body, "text");
  if (!v) invalid_request("text: required; send the string to tokenize");
  if (!v->is_string()) expected("text", "a string", *v);
  r.text = v->get<std::string>();
  r.add_special = get_bool_field(body, "add_special", r.add_special);
  return r;
}

DetokenizeRequest parse_detokenize_request(const json& body, int64_t vocab_size) {
  require_object(body);
  DetokenizeRequest r;
  const json* v = field(body, "ids");
  if (!v) invalid_request("ids: required; send an array of token ids");
  if (!v->is_array()) expected("ids", "an array of token ids", *v);
  r.ids = parse_ids(*v, "ids", vocab_size);
  r.skip_special = get_bool_field(body, "skip_special", r.skip_special);
  return r;
}

}  // namespace zaya
