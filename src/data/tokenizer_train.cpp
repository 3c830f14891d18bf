// SentencePiece BPE training: writes sentence-per-line training text, then calls the trainer.
#include "data/tokenizer_train.h"

#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"

namespace zaya {

namespace fs = std::filesystem;

namespace {

// Splits text into lines of at most ~2000 bytes, preferring sentence ends.
void write_sentences(const std::string& text, std::ofstream& out) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = std::min(text.size(), start + 2000);
    if (end < text.size()) {
      size_t cut = text.rfind(". ", end);
      if (cut != std::string::npos && cut > start + 20) end = cut + 1;
      else {
        size_t sp = text.rfind(' ', end);
        if (sp != std::string::npos && sp > start) end = sp;
      }
    }
    std::string line = text.substr(start, end - start);
    for (char& c : line)
      if (c == '\n' || c == '\r') c = ' ';
    size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos) out << line.substr(first) << '\n';
    start = end;
  }
}

}  // namespace

void train_sentencepiece(const std::vector<std::string>& inputs, const std::string& out_prefix,
                         const TokenizerTrainOptions& opt) {
  if (inputs.empty()) fail("tokenizer", "no input files to train on");
  if (opt.vocab_size < 16) fail("tokenizer", "vocab size must be at least 16");
  fs::path prefix(out_prefix);
  if (prefix.has_parent_path()) fs::create_directories(prefix.parent_path());
  const std::string corpus = out_prefix + ".train.txt";
  {
    std::ofstream out(corpus);
    if (!out) fail("tokenizer", "cannot write " + corpus);
    for (const auto& path : inputs) {
      std::ifstream in(path, std::ios::binary);
      if (!in) fail("tokenizer", "cannot open input " + path);
      std::stringstream ss;
      ss << in.rdbuf();
      write_sentences(ss.str(), out);
    }
  }
  std::string specials;
  for (const auto& s : opt.special_tokens) specials += (specials.empty() ? "" : ",") + s;
  std::unordered_map<std::string, std::string> args = {
      {"input", corpus},
      {"model_prefix", out_prefix},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"character_coverage", std::to_string(opt.character_coverage)},
      {"byte_fallback", opt.byte_fallback ? "true" : "false"},
      {"pad_id", "0"},
      {"eos_id", "1"},
      {"bos_id", "2"},
      {"unk_id", "3"},
      {"input_sentence_size", std::to_string(opt.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", "2"},
      {"minloglevel", "2"},
      {"split_digits", "true"},
  };
  if (!specials.empty()) args["user_defined_symbols"] = specials;
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  std::error_code ec;
  fs::remove(corpus, ec);
  if (!status.ok()) fail("tokenizer", "SentencePiece training failed: " + status.ToString());
}

}  // namespace zaya
