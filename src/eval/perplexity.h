// Held-out evaluation (`zaya eval`): the mean next-token cross-entropy and perplexity of a model
// over a token stream. The stream is cut into consecutive windows of seq_len input tokens, each
// predicting the token after it, so every token but the first is scored exactly once, with the
// window's earlier tokens as its context (windows do not overlap; the usual "N windows of T
// tokens" perplexity, and what the trainer's held-out loss computes). With document starts, a
// token's context is instead the earlier tokens of its own document within the window (as the
// trainer sees data with data.reset_at_document_boundary). The loss runs fused with the LM head
// on the backend, so no [B, T, V] logits are materialised.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.h"

namespace zaya {

struct PerplexityOptions {
  int64_t seq_len = 1024;  // input tokens per window (at most the model's context)
  int64_t batch = 1;       // windows per forward pass
  int64_t max_tokens = 0;  // score at most this many tokens (0 = the whole stream)
  // Optional, one byte per token of the stream: a token is scored only where its byte is
  // nonzero (supervised fine-tuning data scores its completions, not its prompts).
  const std::vector<uint8_t>* target_mask = nullptr;
  // Optional, ascending offsets of the documents' first tokens: every document then runs as its
  // own fresh sequence inside its window (attention, the CCA convolution, the delayed value and
  // RoPE positions restart), as training with data.reset_at_document_boundary sees it.
  const std::vector<uint64_t>* document_starts = nullptr;
  // Called after every batch: tokens scored so far, tokens to score, running mean loss.
  std::function<void(int64_t scored, int64_t total, double loss)> progress;
};

struct PerplexityResult {
  double loss = 0;        // mean next-token cross-entropy, nats per token
  double perplexity = 0;  // exp(loss)
  double loss_sum = 0;    // summed over the scored tokens
  int64_t scored_tokens = 0;
  int64_t windows = 0;
  double seconds = 0;
};

// Throws zaya::Error ("eval") for fewer than 2 tokens, an id outside the model's vocabulary (naming
// its position) or options out of range.
PerplexityResult evaluate_perplexity(Model& model, const std::vector<int32_t>& tokens,
                                     const PerplexityOptions& options);

}  // namespace zaya
