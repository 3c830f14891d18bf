// Training a SentencePiece BPE vocabulary from text files (libsentencepiece), with zaya's
// special-token convention: pad 0, eos 1, bos 2, unk 3 (as in ZAYA1's configs).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zaya {

struct TokenizerTrainOptions {
  int64_t vocab_size = 4096;
  double character_coverage = 0.9995;
  bool byte_fallback = true;
  std::vector<std::string> special_tokens;  // user-defined symbols kept whole
  int64_t max_sentences = 400000;           // sentences sampled for training
  uint64_t seed = 1;
};

// Trains on the UTF-8 text of `inputs` (documents are split into sentence-sized lines) and
// writes <out_prefix>.model and <out_prefix>.vocab. Throws zaya::Error naming the input.
void train_sentencepiece(const std::vector<std::string>& inputs, const std::string& out_prefix,
                         const TokenizerTrainOptions& opt);

}  // namespace zaya
