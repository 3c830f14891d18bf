// SentencePiece wrapper: trains a tiny model with `spm_train` in a temp dir, then checks that
// zaya's ids equal SentencePieceProcessor's, that decode round-trips, and the error paths.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>

#include "core/error.h"
#include "data/tokenizer.h"

namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kSentences = {
    "The quick brown fox jumps over the lazy dog.",
    "Mixture of experts models route each token to a few experts.",
    "A tokenizer turns text into integer ids and back again.",
    "Training runs for many steps with a warmup and a cosine decay.",
    "Numbers like 12345 and 3.14159 appear in text, too.",
    "Unicode: caf\xC3\xA9, na\xC3\xAFve, \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E, \xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82.",
};

class TokenizerSp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("zaya_sp_" + std::to_string(::getpid())));
    fs::create_directories(*dir_);
    std::string corpus = (*dir_ / "corpus.txt").string();
    {
      std::ofstream out(corpus);
      for (int r = 0; r < 60; ++r)
        for (size_t i = 0; i < kSentences.size(); ++i) out << kSentences[(i + static_cast<size_t>(r)) % kSentences.size()] << "\n";
    }
    std::string prefix = (*dir_ / "tiny").string();
    std::string cmd = "spm_train --input=" + corpus + " --model_prefix=" + prefix +
                      " --vocab_size=400 --model_type=bpe --character_coverage=1.0 --byte_fallback=true"
                      " --bos_id=1 --eos_id=2 --unk_id=0 --minloglevel=2 > " + (*dir_ / "train.log").string() + " 2>&1";
    status_ = std::system(cmd.c_str());
    model_ = prefix + ".model";
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    if (status_ != 0 || !fs::exists(model_))
      GTEST_FAIL() << "spm_train failed (status " << status_ << "); install it with scripts/setup.sh (Debian package "
                   << "'sentencepiece'); log: " << (*dir_ / "train.log").string();
  }
  static inline fs::path* dir_ = nullptr;
  static inline int status_ = -1;
  static inline std::string model_;
};

TEST_F(TokenizerSp, IdsMatchSentencePieceAndRoundTrip) {
  auto tok = zaya::load_tokenizer(model_);
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(model_).ok());
  std::vector<std::string> texts = kSentences;
  texts.push_back("unseen words: zebra quokka \xF0\x9F\x98\x80 \xE2\x9C\x93");
  texts.push_back("");
  for (const auto& t : texts) {
    std::vector<int> want;
    ASSERT_TRUE(sp.Encode(t, &want).ok());
    auto got = tok->encode(t);
    EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want) << t;
    EXPECT_EQ(tok->decode(got), t);
    auto with_bos = tok->encode(t, true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos.front(), 1);
    EXPECT_EQ(tok->decode(with_bos, true), t);
  }
}

TEST_F(TokenizerSp, Metadata) {
  auto tok = zaya::load_tokenizer(model_);
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->id_to_token(1), "<s>");
  EXPECT_EQ(tok->token_to_id("</s>"), 2);
  EXPECT_EQ(tok->token_to_id("<unk>"), 0);
  EXPECT_EQ(tok->token_to_id("no such piece at all"), -1);
  EXPECT_EQ(tok->id_to_token(100000), "");
}

TEST_F(TokenizerSp, InvalidUtf8BecomesReplacementChar) {
  auto tok = zaya::load_tokenizer(model_);
  EXPECT_EQ(tok->encode("ab\xFF" "cd"), tok->encode("ab\xEF\xBF\xBD" "cd"));
}

TEST_F(TokenizerSp, DirectoryAndErrors) {
  fs::path d = *dir_ / "modeldir";
  fs::create_directories(d);
  fs::copy_file(model_, d / "tokenizer.model", fs::copy_options::overwrite_existing);
  EXPECT_EQ(zaya::load_tokenizer(d.string())->vocab_size(), 400);

  std::string bad = (*dir_ / "bad.model").string();
  std::ofstream(bad) << "this is not a protobuf";
  try {
    zaya::load_tokenizer(bad);
    ADD_FAILURE() << "expected an error";
  } catch (const zaya::Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ": not a valid SentencePiece model"), std::string::npos) << e.what();
  }
  try {
    zaya::load_tokenizer((*dir_ / "missing.model").string());
    ADD_FAILURE() << "expected an error";
  } catch (const zaya::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.model: no such file"), std::string::npos) << e.what();
  }
}

}  // namespace
