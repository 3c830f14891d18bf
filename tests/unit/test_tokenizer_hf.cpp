// Hugging Face tokenizer.json: Gemma-3 golden ids (tests/fixtures/tokenizer/gemma3_golden.jsonl,
// made by tests/tokenizer/gen_golden.mjs with HF `tokenizers`), decode, round trips, metadata,
// a tiny hand-made tokenizer, and error messages for bad files.
#include <gtest/gtest.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_utf8.h"
#include "test_helpers.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kGemmaDir = zaya::test::gemma_tokenizer_dir();
const std::string kGemmaJson = kGemmaDir + "/tokenizer.json";
const std::string kGolden = std::string(ZAYA_SOURCE_DIR) + "/tests/fixtures/tokenizer/gemma3_golden.jsonl";

struct Golden {
  std::string cat, text;  // text: raw input bytes (possibly invalid UTF-8)
  bool invalid = false, special = false;
  std::vector<int32_t> ids;
  std::string decoded, skipped;
};

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

std::string show(const std::string& s) {  // printable form for failure messages
  std::string out;
  for (unsigned char c : s.substr(0, 300)) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) { char b[8]; std::snprintf(b, sizeof b, "\\x%02X", c); out += b; }
    else out += static_cast<char>(c);
  }
  return s.size() > 300 ? out + "..." : out;
}

std::string show_ids(const std::vector<int32_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size() && i < 40; ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + (v.size() > 40 ? ",...]" : "]");
}

class TokenizerHfGemma : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kGemmaJson) || !fs::exists(kGolden)) return;
    tok_ = zaya::load_tokenizer(kGemmaJson).release();
    std::ifstream in(kGolden);
    std::string line;
    while (std::getline(in, line)) {
      json j = json::parse(line);
      Golden g;
      g.cat = j["cat"];
      g.invalid = j.contains("hex");
      g.text = g.invalid ? unhex(j["hex"]) : j["text"].get<std::string>();
      g.special = j.value("special", false);
      g.ids = j["ids"].get<std::vector<int32_t>>();
      std::string lenient = zaya::tok::utf8_sanitize(g.text);
      g.decoded = j.value("decoded", lenient);
      g.skipped = j.value("skipped", g.decoded);
      golden_->push_back(std::move(g));
    }
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_FAIL() << "missing " << kGemmaJson << " or " << kGolden << ": run scripts/setup.sh";
    ASSERT_GT(golden_->size(), 3000u);
  }
  static inline zaya::Tokenizer* tok_ = nullptr;
  static inline std::vector<Golden>* golden_ = new std::vector<Golden>();
};

TEST_F(TokenizerHfGemma, GoldenIdsMatchHuggingFace) {
  size_t bad = 0, n = 0;
  for (const auto& g : *golden_) {
    ++n;
    auto ids = tok_->encode(g.text, g.special);
    if (ids != g.ids && ++bad <= 8)
      ADD_FAILURE() << "[" << g.cat << (g.special ? ", add_special" : "") << "] \"" << show(g.text) << "\"\n  want "
                    << show_ids(g.ids) << "\n  got  " << show_ids(ids);
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << n << " golden strings differ";
}

TEST_F(TokenizerHfGemma, DecodeMatchesHuggingFace) {
  size_t bad = 0;
  for (const auto& g : *golden_) {
    std::string d = tok_->decode(g.ids, false), s = tok_->decode(g.ids, true);
    if ((d != g.decoded || s != g.skipped) && ++bad <= 8)
      ADD_FAILURE() << "[" << g.cat << "] ids " << show_ids(g.ids) << "\n  want \"" << show(g.decoded) << "\" / \""
                    << show(g.skipped) << "\"\n  got  \"" << show(d) << "\" / \"" << show(s) << "\"";
  }
  EXPECT_EQ(bad, 0u);
}

TEST_F(TokenizerHfGemma, RoundTripValidUtf8) {
  // Gemma's decoder maps U+2581 back to a space, so only text without it round-trips.
  size_t checked = 0, bad = 0;
  for (const auto& g : *golden_) {
    if (g.invalid || g.text.find("\xE2\x96\x81") != std::string::npos) continue;
    ++checked;
    std::string back = tok_->decode(tok_->encode(g.text), false);
    if (back != g.text && ++bad <= 8) ADD_FAILURE() << "\"" << show(g.text) << "\" -> \"" << show(back) << "\"";
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(checked, 3000u);
}

TEST_F(TokenizerHfGemma, Metadata) {
  EXPECT_EQ(tok_->vocab_size(), 262145);  // 262144 model tokens + <image_soft_token>
  EXPECT_EQ(tok_->bos_id(), 2);
  EXPECT_EQ(tok_->eos_id(), tok_->token_to_id("<end_of_turn>"));  // tokenizer_config.json eos_token
  EXPECT_EQ(tok_->token_to_id("<start_of_turn>"), 105);
  EXPECT_EQ(tok_->token_to_id("<bos>"), 2);
  EXPECT_EQ(tok_->id_to_token(2), "<bos>");
  EXPECT_EQ(tok_->id_to_token(tok_->token_to_id("\xE2\x96\x81world")), "\xE2\x96\x81world");
  EXPECT_EQ(tok_->token_to_id("definitely not a token"), -1);
  EXPECT_EQ(tok_->id_to_token(-5), "");
  EXPECT_EQ(tok_->encode("", true), std::vector<int32_t>{2});
}

TEST_F(TokenizerHfGemma, ConcurrentEncodeAgrees) {
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < golden_->size(); i += 7) want.push_back((*golden_)[i].ids);
  auto worker = [&](int* bad) {
    size_t k = 0;
    for (size_t i = 0; i < golden_->size(); i += 7, ++k)
      if (tok_->encode((*golden_)[i].text, (*golden_)[i].special) != want[k]) ++*bad;
  };
  int b1 = 0, b2 = 0;
  std::thread t1(worker, &b1), t2(worker, &b2);
  t1.join(), t2.join();
  EXPECT_EQ(b1 + b2, 0);
}

TEST_F(TokenizerHfGemma, LoadsFromDirectory) {
  auto t = zaya::load_tokenizer(kGemmaDir);
  EXPECT_EQ(t->encode("Hello world"), (std::vector<int32_t>{9259, 1902}));
}

// ---- A tiny hand-made tokenizer.json, and error messages ----

class TokenizerHfFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zaya_tok_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& body) {
    std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << body;
    return p;
  }
  // Llama-style: Prepend/Replace normalizer, byte fallback, pair-form merges.
  static json tiny() {
    json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\xE2\x96\x81", 3}, {"a", 4}, {"b", 5}, {"c", 6},
                  {"ab", 7}, {"\xE2\x96\x81" "ab", 8}, {"abc", 9}, {"<0xC3>", 10}, {"<0xA9>", 11}};
    return {{"version", "1.0"},
            {"added_tokens", json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}, {"lstrip", false},
                                           {"rstrip", false}, {"single_word", false}, {"normalized", false}},
                                          {{"id", 2}, {"content", "</s>"}, {"special", true}, {"lstrip", false},
                                           {"rstrip", false}, {"single_word", false}, {"normalized", false}}})},
            {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array({
                {{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}})}}},
            {"pre_tokenizer", nullptr},
            {"post_processor", {{"type", "TemplateProcessing"},
                                {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                                {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
            {"decoder", {{"type", "Sequence"}, {"decoders", json::array({
                {{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"byte_fallback", true},
                       {"fuse_unk", true}, {"vocab", vocab},
                       {"merges", json::array({json::array({"a", "b"}), json::array({"ab", "c"}),
                                               json::array({"\xE2\x96\x81", "ab"})})}}}};
  }
  static std::string error_of(const std::string& path) {
    try {
      zaya::load_tokenizer(path);
    } catch (const zaya::Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

TEST_F(TokenizerHfFiles, TinyTokenizerEncodesAndDecodes) {
  auto t = zaya::load_tokenizer(write("tokenizer.json", tiny().dump()));
  // "ab abc é z": ▁ab ▁ abc ▁ <0xC3><0xA9> ▁ <unk>
  EXPECT_EQ(t->encode("ab abc \xC3\xA9 z"), (std::vector<int32_t>{8, 3, 9, 3, 10, 11, 3, 0}));
  EXPECT_EQ(t->encode("ab</s>", true), (std::vector<int32_t>{1, 8, 2}));
  EXPECT_EQ(t->decode({1, 8, 3, 9, 3, 10, 11}, true), "ab abc \xC3\xA9");
  EXPECT_EQ(t->decode({8, 10}, false), "ab\xEF\xBF\xBD");  // lone byte -> U+FFFD
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_EQ(t->vocab_size(), 12);
}

TEST_F(TokenizerHfFiles, StringFormMergesEqualPairForm) {
  json j = tiny();
  j["model"]["merges"] = json::array({"a b", "ab c", "\xE2\x96\x81 ab"});
  auto t = zaya::load_tokenizer(write("tokenizer.json", j.dump()));
  EXPECT_EQ(t->encode("ab abc"), (std::vector<int32_t>{8, 3, 9}));
}

TEST_F(TokenizerHfFiles, MissingFile) {
  std::string e = error_of((dir_ / "nope.json").string());
  EXPECT_NE(e.find("nope.json"), std::string::npos) << e;
  EXPECT_NE(e.find("tokenizer"), std::string::npos) << e;
}

TEST_F(TokenizerHfFiles, DirectoryWithoutTokenizer) {
  std::string e = error_of(dir_.string());
  EXPECT_NE(e.find("neither tokenizer.json nor tokenizer.model"), std::string::npos) << e;
}

TEST_F(TokenizerHfFiles, BadJson) {
  std::string p = write("tokenizer.json", "{\"model\": {\"type\": \"BPE\",");
  std::string e = error_of(p);
  EXPECT_NE(e.find(p + ": invalid JSON"), std::string::npos) << e;
}

TEST_F(TokenizerHfFiles, UnsupportedComponentsAreNamed) {
  struct Case {
    const char* field;
    json value;
    const char* want;
  };
  const std::vector<Case> cases = {
      {"normalizer", {{"type", "NFKC"}}, "normalizer type 'NFKC' is not supported"},
      {"normalizer", {{"type", "Lowercase"}}, "normalizer type 'Lowercase' is not supported"},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}, "pre_tokenizer type 'BertPreTokenizer' is not supported"},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}},
       "pre_tokenizer type 'Split' is not supported with a Regex pattern"},
      {"decoder", {{"type", "CTC"}}, "decoder type 'CTC' is not supported"},
      {"post_processor", {{"type", "Weird"}}, "post_processor type 'Weird' is not supported"},
  };
  for (const auto& c : cases) {
    json j = tiny();
    j[c.field] = c.value;
    std::string p = write("tokenizer.json", j.dump());
    std::string e = error_of(p);
    EXPECT_NE(e.find(p + ": " + c.want), std::string::npos) << e;
  }
  json j = tiny();
  j["model"]["type"] = "WordPiece";
  std::string p = write("tokenizer.json", j.dump());
  EXPECT_NE(error_of(p).find("model type 'WordPiece' is not supported"), std::string::npos) << error_of(p);
  j = tiny();
  j["model"]["merges"] = json::array({"a b c"});
  EXPECT_NE(error_of(write("tokenizer.json", j.dump())).find("model.merges[0]"), std::string::npos);
  j = tiny();
  j["model"]["merges"] = json::array({"a zz"});
  EXPECT_NE(error_of(write("tokenizer.json", j.dump())).find("'zz' that is not in model.vocab"), std::string::npos);
}

// model.vocab and model.merges are read as the file streams by (tokenizer_hf_json.h): every
// bad entry is still named, a repeated key still replaces the earlier one, and the same names
// elsewhere in the file are left alone.
TEST_F(TokenizerHfFiles, VocabAndMergesErrorsNameTheEntry) {
  const std::string bad_id = "must be a non-negative integer id";
  for (const json& value : {json("4"), json(4.5), json(-1), json(int64_t(1) << 31), json(uint64_t(1) << 63),
                            json::object({{"id", 4}}), json::array({4}), json(nullptr), json(true)}) {
    json j = tiny();
    j["model"]["vocab"]["zz"] = value;
    const std::string e = error_of(write("tokenizer.json", j.dump()));
    EXPECT_NE(e.find("model.vocab['zz'] " + bad_id), std::string::npos) << value.dump() << ": " << e;
  }
  json j = tiny();
  j["model"]["vocab"] = json::array({"a", "b"});
  EXPECT_NE(error_of(write("tokenizer.json", j.dump())).find("field 'model.vocab' must be an object"),
            std::string::npos);
  j = tiny();
  j["model"]["merges"] = {{"a", "b"}};
  EXPECT_NE(error_of(write("tokenizer.json", j.dump())).find("field 'model.merges' must be an array"),
            std::string::npos);
  j = tiny();
  j["model"].erase("merges");
  EXPECT_NE(error_of(write("tokenizer.json", j.dump())).find("field 'model.merges' must be an array"),
            std::string::npos);
  for (const json& merge :
       {json(7), json(nullptr), json::object({{"a", "b"}}), json::array({"a"}), json::array({"a", "b", "c"}),
        json::array({"a", 5}), json::array({"a", json::array({"b"})})}) {
    j = tiny();
    j["model"]["merges"] = json::array({"a b", merge, "ab c"});
    const std::string e = error_of(write("tokenizer.json", j.dump()));
    EXPECT_NE(e.find("model.merges[1] must be \"a b\" or [\"a\", \"b\"]"), std::string::npos)
        << merge.dump() << ": " << e;
  }
  // The same field names outside model are not the vocabulary; the tokenizer is tiny()'s.
  j = tiny();
  j["extra"] = {{"vocab", {{"q", "not an id"}}}, {"merges", 5}};
  j["model"]["extra"] = {{"vocab", json::array({1})}, {"merges", {{"x", 1}}}};
  auto t = zaya::load_tokenizer(write("tokenizer.json", j.dump()));
  EXPECT_EQ(t->encode("ab abc"), (std::vector<int32_t>{8, 3, 9}));
  EXPECT_EQ(t->vocab_size(), 12);
  // With several bad entries the first in key order is named, whatever the file's order.
  j = tiny();
  j["model"]["vocab"]["zz"] = "x";
  j["model"]["vocab"]["yy"] = "x";
  EXPECT_NE(error_of(write("tokenizer.json", j.dump())).find("model.vocab['yy'] " + bad_id),
            std::string::npos);
  // A repeated "model": the last one counts, with the vocabulary and merges it has (none here).
  std::string two_models = tiny().dump();
  two_models.insert(two_models.size() - 1, ",\"model\":{\"type\":\"BPE\"}");
  EXPECT_NE(error_of(write("tokenizer.json", two_models)).find("field 'model.vocab' must be an object"),
            std::string::npos)
      << error_of(write("tokenizer.json", two_models));
  // A repeated key: the last vocab and the last merges count, as when a document is parsed.
  std::string text = tiny().dump();
  const std::string model_key = "\"model\":{";
  ASSERT_NE(text.find(model_key), std::string::npos);
  text.insert(text.find(model_key) + model_key.size(), "\"merges\":[\"x y\"],\"vocab\":{\"x\":\"bad\"},");
  t = zaya::load_tokenizer(write("tokenizer.json", text));
  EXPECT_EQ(t->encode("ab abc"), (std::vector<int32_t>{8, 3, 9}));
}

// A JSON value of the wrong type deep in a section is named with the file and the section, and
// ids from the file are checked against the vocabulary before any text is encoded with them.
TEST_F(TokenizerHfFiles, WrongTypesAndIdsAreNamed) {
  struct Case {
    std::function<void(json&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["post_processor"]["special_tokens"]["<s>"]["ids"] = {99}; },
       "post_processor: special token id 99 is outside the vocabulary (12 ids)"},
      {[](json& j) {
         j["post_processor"]["single"] = json::array({{{"SpecialToken", 5}}});
       },
       "post_processor: [json.exception"},
      {[](json& j) { j["added_tokens"][0]["id"] = int64_t(1) << 32; },
       "added_tokens[0].id must be non-negative and at most 2147483647"},
      {[](json& j) { j["added_tokens"][0]["id"] = -3; }, "added_tokens[0].id must be non-negative"},
      {[](json& j) { j["post_processor"]["special_tokens"]["<s>"]["ids"] = {int64_t(1) << 32}; },
       "id 4294967296 must be an integer in [0, 2147483647]"},
      {[](json& j) { j["post_processor"]["special_tokens"]["<s>"]["ids"] = {1.5}; },
       "id 1.5 must be an integer"},
      {[](json& j) { j["model"]["vocab"]["zz"] = 5000000; },
       "model.vocab: id 5000000 leaves more than 1048576 ids unused"},
      {[](json& j) { j["model"]["vocab"]["zz"] = INT32_MAX; }, "leaves more than 1048576 ids unused"},
      {[](json& j) {
         j["normalizer"] = {{"type", "Prepend"}, {"prepend", 5}};
       },
       "normalizer: [json.exception"},
      {[](json& j) {
         j["decoder"] = {{"type", "Replace"}, {"pattern", {{"String", 7}}}, {"content", " "}};
       },
       "decoder: [json.exception"},
  };
  for (const auto& c : cases) {
    json j = tiny();
    c.edit(j);
    const std::string p = write("tokenizer.json", j.dump());
    const std::string e = error_of(p);
    EXPECT_NE(e.find(p + ": "), std::string::npos) << e;
    EXPECT_NE(e.find(c.want), std::string::npos) << j.dump() << "\n" << e;
  }
}

TEST(TokenizerUtf8, MaximalSubpartReplacement) {
  using zaya::tok::utf8_sanitize;
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_sanitize("a\x80z"), "a" + r + "z");
  EXPECT_EQ(utf8_sanitize("\xE2\x96"), r);                     // truncated 3-byte: one subpart
  EXPECT_EQ(utf8_sanitize("\xC0\x80"), r + r);                 // overlong lead is invalid alone
  EXPECT_EQ(utf8_sanitize("\xED\xA0\x80"), r + r + r);         // surrogate
  EXPECT_EQ(utf8_sanitize("\xF0\x9F\x98" "x"), r + "x");       // truncated 4-byte
  EXPECT_EQ(utf8_sanitize("\xF4\x90\x80\x80"), r + r + r + r); // > U+10FFFF
  EXPECT_EQ(utf8_sanitize("\xC3\xA9\xF0\x9F\x98\x80"), "\xC3\xA9\xF0\x9F\x98\x80");
}

}  // namespace
