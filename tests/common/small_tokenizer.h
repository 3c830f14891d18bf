// A small SentencePiece BPE tokenizer trained inside a test, from three sentences repeated: its
// 320 ids fit the vocabulary of a zaya-tiny model (512). For tests that need real text
// tokenization (multiple-choice evaluation, a recipe's data.tokenizer).
#pragma once
#include <fstream>
#include <string>

#include "data/tokenizer_train.h"

namespace zaya::test {

// Trains on a corpus written next to `prefix` and writes prefix.model (and prefix.vocab);
// returns the .model path.
inline std::string train_small_tokenizer(const std::string& prefix) {
  const std::string corpus = prefix + ".corpus.txt";
  {
    std::ofstream out(corpus);
    for (int i = 0; i < 50; ++i) out << "The cat sat on the mat. A dog ran in the park. Birds fly south.\n";
  }
  TokenizerTrainOptions options;
  options.vocab_size = 320;
  options.character_coverage = 1.0;
  train_sentencepiece({corpus}, prefix, options);
  return prefix + ".model";
}

}  // namespace zaya::test
