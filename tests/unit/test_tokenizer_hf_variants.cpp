// The Gemma-3 vocab under other tokenizer.json pipelines (Metaspace, Llama legacy, ByteLevel,
// Whitespace, Split behaviours, added-token flags): ids and decodes must equal Hugging Face's,
// recorded in tests/fixtures/tokenizer/gemma3_variants_golden.jsonl by gen_golden.mjs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "test_helpers.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kGemmaTokenizerJson = zaya::test::gemma_tokenizer_dir() + "/tokenizer.json";
const std::string kVariants = std::string(ZAYA_SOURCE_DIR) + "/tests/fixtures/tokenizer/gemma3_variants_golden.jsonl";

std::string ids_str(const std::vector<int32_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size() && i < 40; ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + (v.size() > 40 ? ",...]" : "]");
}

TEST(TokenizerHfVariants, MatchHuggingFace) {
  if (!fs::exists(kGemmaTokenizerJson))
    GTEST_FAIL() << "missing " << kGemmaTokenizerJson << ": run scripts/setup.sh";
  std::ifstream in(kVariants);
  ASSERT_TRUE(in) << "missing " << kVariants;
  json base;
  {
    std::ifstream b(kGemmaTokenizerJson);
    base = json::parse(b);
  }
  fs::path tmp = fs::temp_directory_path() / ("zaya_tokvar_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  std::unique_ptr<zaya::Tokenizer> tok;
  std::string variant, line;
  std::map<std::string, int> checked, failed;
  int bad = 0;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    if (j.contains("patch")) {
      variant = j["variant"];
      json cfg = base;
      for (auto it = j["patch"].begin(); it != j["patch"].end(); ++it)
        if (it.key() != "added_flags" && it.key() != "model_fields") cfg[it.key()] = it.value();
      if (j["patch"].contains("model_fields")) cfg["model"].update(j["patch"]["model_fields"]);
      if (j["patch"].contains("added_flags"))
        for (auto& t : cfg["added_tokens"])
          if (j["patch"]["added_flags"].contains(t["content"].get<std::string>()))
            t.update(j["patch"]["added_flags"][t["content"].get<std::string>()]);
      std::string p = (tmp / (variant + ".json")).string();
      std::ofstream(p) << cfg.dump();
      tok = zaya::load_tokenizer(p);
      continue;
    }
    std::string text = j["text"];
    auto want = j["ids"].get<std::vector<int32_t>>();
    bool special = j.value("special", false);
    auto got = tok->encode(text, special);
    std::string decoded = j.value("decoded", text), skipped = j.value("skipped", decoded);
    ++checked[variant];
    if (got != want) {
      ++failed[variant];
      if (++bad <= 10)
        ADD_FAILURE() << "[" << variant << "] ids differ for \"" << text.substr(0, 200) << "\"\n  want "
                      << ids_str(want) << "\n  got  " << ids_str(got);
    } else if (tok->decode(want, false) != decoded || tok->decode(want, true) != skipped) {
      ++failed[variant];
      if (++bad <= 10)
        ADD_FAILURE() << "[" << variant << "] decode differs for " << ids_str(want) << "\n  want \"" << decoded
                      << "\"\n  got  \"" << tok->decode(want, false) << "\"";
    }
  }
  fs::remove_all(tmp);
  EXPECT_EQ(bad, 0);
  EXPECT_GE(checked.size(), 9u);
  for (const auto& [v, n] : checked) {
    EXPECT_GE(n, 100) << v;
    EXPECT_EQ(failed[v], 0) << failed[v] << " of " << n << " strings differ for variant " << v;
  }
}

}  // namespace
