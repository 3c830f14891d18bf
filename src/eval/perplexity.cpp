// Windowed next-token loss over a token stream (see perplexity.h).
#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "core/error.h"
#include "data/loader.h"
#include "train/train_support.h"

namespace zaya {

PerplexityResult evaluate_perplexity(Model& model, const std::vector<int32_t>& tokens,
                                     const PerplexityOptions& o) {
  const int64_t vocab = model.config().vocab_size;
  const int64_t T = o.seq_len, B = o.batch;
  if (T < 1) fail("eval", "seq_len must be at least 1, got " + std::to_string(T));
  if (B < 1) fail("eval", "batch must be at least 1, got " + std::to_string(B));
  if (o.max_tokens < 0) fail("eval", "max_tokens must be >= 0, got " + std::to_string(o.max_tokens));
  // Enough of the stream for max_tokens targets: one token more than that.
  const int64_t n =
      o.max_tokens > 0 ? std::min<int64_t>(int64_t(tokens.size()), o.max_tokens + 1) : int64_t(tokens.size());
  if (n < 2) fail("eval", "the data has " + std::to_string(n) + " token(s); scoring needs at least 2");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[size_t(i)] < 0 || tokens[size_t(i)] >= vocab)
      fail("eval",
           "token " + std::to_string(i) + " of the data is id " + std::to_string(tokens[size_t(i)]) +
               ", outside the model's vocabulary [0, " + std::to_string(vocab) + ")",
           "was the data tokenized with this model's tokenizer?");

  const std::vector<uint8_t>* mask = o.target_mask;
  if (o.document_starts && !std::is_sorted(o.document_starts->begin(), o.document_starts->end()))
    fail("eval", "the document starts are not in ascending order");
  if (mask && mask->size() != tokens.size())
    fail("eval", "the target mask has " + std::to_string(mask->size()) + " entries for " +
                     std::to_string(tokens.size()) + " tokens");
  const auto started = std::chrono::steady_clock::now();
  PerplexityResult r;
  int64_t targets_total = n - 1;
  if (mask)
    targets_total = std::count_if(mask->begin() + 1, mask->begin() + n, [](uint8_t v) { return v != 0; });
  if (targets_total == 0) fail("eval", "the data has no scored token: every token is masked as a prompt");
  r.windows = (n - 1 + T - 1) / T;
  std::vector<int32_t> ids(size_t(B * T)), targets(size_t(B * T));
  const std::vector<uint64_t>* docs = o.document_starts;
  std::vector<int32_t> segments(docs ? size_t(B * T) : 0), starts;
  for (int64_t w0 = 0; w0 < r.windows; w0 += B) {
    const int64_t rows = std::min(B, r.windows - w0);
    for (int64_t b = 0; b < rows; ++b) {
      const int64_t first = (w0 + b) * T;  // the window's first input token
      for (int64_t t = 0; t < T; ++t) {
        const int64_t at = first + t;
        const bool scored = at + 1 < n && (!mask || (*mask)[size_t(at + 1)] != 0);
        // Past the end of the stream: a padding input (id 0) whose target is not counted.
        ids[size_t(b * T + t)] = at < n ? tokens[size_t(at)] : 0;
        targets[size_t(b * T + t)] = scored ? tokens[size_t(at + 1)] : -1;
      }
      if (docs) {  // the window's document starts, as positions within it
        starts.clear();
        starts_in_range(docs->data(), docs->data() + docs->size(), uint64_t(first), uint64_t(first + T), 0,
                        starts);
        document_segments(starts.data(), starts.size(), T, segments.data() + b * T);
      }
    }
    r.loss_sum += eval_loss_sum(model, ids.data(), targets.data(), rows, T, &r.scored_tokens,
                                docs ? segments.data() : nullptr);
    if (o.progress && r.scored_tokens > 0)
      o.progress(r.scored_tokens, targets_total, r.loss_sum / double(r.scored_tokens));
  }
  r.loss = r.loss_sum / double(r.scored_tokens);
  r.perplexity = std::exp(r.loss);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return r;
}

}  // namespace zaya
