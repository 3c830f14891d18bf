// One conversation, turn by turn, on one decode state (see chat_session.h).
#include "serve/chat_session.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "serve/completion_text.h"

namespace zaya {

namespace {

int64_t context_of(const Model& model, int64_t context) {
  const int64_t most = model.config().max_position_embeddings;
  if (context < 0 || context > most)
    fail("chat", "a context of " + std::to_string(context) + " positions is outside [1, " +
                     std::to_string(most) + "] (the model's max_position_embeddings)");
  return context == 0 ? most : context;
}

}  // namespace

ChatSession::ChatSession(Model& model, const Tokenizer& tok, const ChatFormat& chat, int64_t context)
    : model_(model),
      tok_(tok),
      chat_(chat),
      state_(model.config(), model.backend(), 1, context_of(model, context)),
      logits_(size_t(model.config().vocab_size)) {}

void ChatSession::add(const std::string& role, const std::string& content) {
  messages_.push_back({role, content});
}

void ChatSession::reset() {
  std::vector<ChatMessage> kept;
  for (const ChatMessage& m : messages_) {
    if (m.role != "system") break;
    kept.push_back(m);
  }
  messages_ = std::move(kept);
  reset_state();
}

void ChatSession::reset_state() {
  state_.reset();
  fed_.clear();
}

ChatSession::Turn ChatSession::say(const std::string& user, const SamplingParams& sampling, uint64_t seed,
                                   int64_t max_tokens,
                                   const std::function<void(const std::string&)>& on_text) {
  using Clock = std::chrono::steady_clock;
  if (max_tokens < 1) fail("chat", "a reply needs max_tokens >= 1, got " + std::to_string(max_tokens));
  std::vector<ChatMessage> next = messages_;
  next.push_back({"user", user});
  const std::vector<int32_t> prompt = chat_.render(next, /*for_reply=*/true).ids;
  const int64_t capacity = state_.capacity, n = int64_t(prompt.size());
  const int64_t V = model_.config().vocab_size;
  for (int32_t id : prompt)
    if (id < 0 || id >= V)
      fail("chat", "the tokenizer gave token id " + std::to_string(id) +
                       ", outside the model's vocabulary [0, " + std::to_string(V) + ")");
  if (n >= capacity)
    fail("chat",
         "the conversation (" + std::to_string(n) + " tokens) leaves no room for a reply in the context of " +
             std::to_string(capacity) + " positions",
         "start over (/reset), or give a longer --context");
  Turn turn;
  turn.prompt_tokens = n;
  // Continue from the tokens already fed when the prompt extends them; else start afresh.
  const bool extends = fed_.size() < prompt.size() && std::equal(fed_.begin(), fed_.end(), prompt.begin());
  if (!extends) reset_state();
  const auto t0 = Clock::now();
  ForwardOutputs last;
  last.logits = logits_.data();
  last.last_only = true;
  const int64_t from = int64_t(fed_.size());
  try {
    model_.forward(prompt.data() + from, 1, n - from, &state_, last);
  } catch (...) {
    reset_state();  // the state is in no known position: the next turn starts afresh
    throw;
  }
  fed_ = prompt;
  turn.prefilled = n - from;
  const auto t1 = Clock::now();

  TokenSampler sampler(sampling, V, seed);
  CompletionText text(&tok_, {}, {});  // the reply decoded on its own, as the template tokenises it
  const ModelConfig& c = model_.config();
  turn.finish_reason = "length";
  for (int64_t i = 0; i < max_tokens; ++i) {
    const int32_t id = sampler.next(logits_.data());
    if (id == chat_.end_of_reply_id() ||
        std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), int64_t(id)) != c.eos_token_ids.end()) {
      turn.finish_reason = "stop";
      break;
    }
    turn.ids.push_back(id);
    const std::string piece = text.push(id).text;
    if (on_text && !piece.empty()) on_text(piece);
    if (i + 1 == max_tokens) break;  // sampled, never fed: the next turn feeds it
    if (int64_t(fed_.size()) == capacity) {
      turn.finish_reason = "context";
      break;
    }
    try {
      model_.forward(&id, 1, 1, &state_, last);
    } catch (...) {
      reset_state();
      throw;
    }
    fed_.push_back(id);
  }
  const std::string rest = text.finish();
  if (on_text && !rest.empty()) on_text(rest);
  turn.reply = text.text();
  turn.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  turn.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  messages_ = std::move(next);
  messages_.push_back({"assistant", turn.reply});
  return turn;
}

}  // namespace zaya
