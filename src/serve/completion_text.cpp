// Incremental completion text with stop sequences (see completion_text.h).
#include "serve/completion_text.h"

#include <algorithm>
#include <memory>

namespace zaya {

namespace {

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD: what an incomplete UTF-8 tail decodes to

// The longest tail of `text` that is a proper prefix of some stop sequence: it may become a
// stop once more text arrives, so it is not released yet.
size_t stop_prefix_tail(const std::string& text, const std::vector<std::string>& stop) {
  size_t keep = 0;
  for (const std::string& s : stop)
    for (size_t k = std::min(s.size() - 1, text.size()); k > keep; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  return keep;
}

}  // namespace

std::vector<int32_t> id_tail(const std::vector<int32_t>& ids, size_t n) {
  return std::vector<int32_t>(ids.end() - std::ptrdiff_t(std::min(n, ids.size())), ids.end());
}

std::vector<std::string> prompt_pieces(const Tokenizer* tokenizer, const std::vector<int32_t>& ids) {
  std::vector<std::string> pieces(ids.size());
  if (!tokenizer) return pieces;
  constexpr size_t kBlock = 256;
  size_t block_start = 0;
  auto text = std::make_unique<CompletionText>(tokenizer, std::vector<int32_t>{}, std::vector<std::string>{});
  for (size_t i = 0; i < ids.size(); ++i) {
    // A new block starts only where the last id released text: nothing is held back there.
    if (i - block_start >= kBlock && !pieces[i - 1].empty()) {
      block_start = i;
      text = std::make_unique<CompletionText>(
          tokenizer,
          id_tail(std::vector<int32_t>(ids.begin(), ids.begin() + std::ptrdiff_t(i)),
                  CompletionText::kContextTail),
          std::vector<std::string>{});
    }
    pieces[i] = text->push(ids[i]).text;
  }
  if (!pieces.empty()) pieces.back() += text->finish();
  return pieces;
}

std::string alternative_token_text(const Tokenizer* tokenizer, std::span<const int32_t> context, int32_t id) {
  if (!tokenizer || id < 0 || id >= tokenizer->vocab_size()) return "token_id:" + std::to_string(id);
  constexpr size_t kSeam = 4;
  std::vector<int32_t> ids(context.end() - std::ptrdiff_t(std::min(kSeam, context.size())), context.end());
  const std::string before = tokenizer->decode(ids, /*skip_special=*/false);
  ids.push_back(id);
  const std::string after = tokenizer->decode(ids, /*skip_special=*/false);
  if (after.size() >= before.size() && after.compare(0, before.size(), before) == 0)
    return after.substr(before.size());
  return tokenizer->decode({id}, /*skip_special=*/false);
}

CompletionText::CompletionText(const Tokenizer* tokenizer, std::vector<int32_t> context,
                               std::vector<std::string> stop)
    : tok_(tokenizer), ids_(std::move(context)), stop_(std::move(stop)) {
  std::erase(stop_, std::string());  // an empty stop sequence would match at once
  if (tok_ && !ids_.empty()) context_text_ = tok_->decode(ids_, /*skip_special=*/true);
}

CompletionText::Step CompletionText::push(int32_t id) {
  if (!tok_ || stopped_) return {};
  ids_.push_back(id);
  return release(/*final_step=*/false);
}

std::string CompletionText::finish() {
  if (!tok_ || stopped_) return {};
  return release(/*final_step=*/true).text;
}

CompletionText::Step CompletionText::release(bool final_step) {
  const std::string full = tok_->decode(ids_, /*skip_special=*/true);
  if (!final_step && full.ends_with(kReplacement)) return {};
  // The decoded context and the text already released must still lead the decode; a tokenizer
  // that rewrote earlier text is waited out (as `zaya generate` does) rather than contradicted.
  const size_t head = context_text_.size() + released_.size();
  if (full.size() < head || full.compare(0, context_text_.size(), context_text_) != 0 ||
      full.compare(context_text_.size(), released_.size(), released_) != 0)
    return {};
  const std::string pending = full.substr(head);
  // Released text never ends with the start of a stop sequence, so a match lies in `pending`.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, pending.find(s));
  Step step;
  if (cut != std::string::npos) {
    step.text = pending.substr(0, cut);
    step.stop = stopped_ = true;
  } else {
    step.text = pending.substr(0, pending.size() - (final_step ? 0 : stop_prefix_tail(pending, stop_)));
  }
  released_ += step.text;
  return step;
}

}  // namespace zaya
