// A conversation with a model held in one process (`zaya chat`): the messages so far, rendered
// by a chat template as `zaya serve` and `zaya data prepare --messages-field` render them. Each
// turn's prompt continues the decode state of the turn before when its tokens extend the
// tokens already fed (the usual case: the reply tokenises back to the ids that were generated),
// so only the new message is prefilled; otherwise the conversation is prefilled afresh.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "serve/sampling.h"

namespace zaya {

class ChatSession {
 public:
  // context: positions the conversation may use (0: the model's max_position_embeddings). The
  // model, tokenizer and format must outlive the session.
  ChatSession(Model& model, const Tokenizer& tok, const ChatFormat& chat, int64_t context = 0);

  struct Turn {
    std::string reply;          // the reply's text (its ids decoded on their own)
    std::vector<int32_t> ids;   // the reply's tokens, without the token that ended it
    std::string finish_reason;  // "stop" (end of reply or EOS), "length" (max_tokens) or "context" (full)
    int64_t prompt_tokens = 0;  // the rendered conversation the reply follows
    int64_t prefilled = 0;      // how many of those ran in this turn (the rest were kept)
    double prefill_seconds = 0, decode_seconds = 0;
  };

  // Adds a message without a reply (a system message, before the first turn).
  void add(const std::string& role, const std::string& content);
  // Adds the user's message, generates the reply, and adds it to the conversation. on_text gets
  // the reply's text as it is released. Throws zaya::Error (the conversation unchanged) when the
  // conversation no longer fits the context.
  Turn say(const std::string& user, const SamplingParams& sampling, uint64_t seed, int64_t max_tokens,
           const std::function<void(const std::string&)>& on_text = {});
  // Forgets every message but the leading system ones, and the decode state.
  void reset();

  const std::vector<ChatMessage>& messages() const { return messages_; }
  int64_t context() const { return state_.capacity; }

 private:
  void reset_state();  // an empty decode state: the next turn prefills the whole conversation

  Model& model_;
  const Tokenizer& tok_;
  const ChatFormat& chat_;
  DecodeState state_;
  std::vector<int32_t> fed_;   // the tokens the decode state holds
  std::vector<float> logits_;  // after the last token fed
  std::vector<ChatMessage> messages_;
};

}  // namespace zaya
