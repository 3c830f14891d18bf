// [[data.datasets]] and [[phases]] in training recipes: parsing, the round trip through
// recipe_to_toml, and errors naming the phase / dataset and the key.
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/recipe.h"

namespace zaya {
namespace {

const char* kTwoPhases = R"(
[data]
reset_at_document_boundary = true

[[data.datasets]]
name = "sotu"
dir = "data/shards/sotu"

[[data.datasets]]
name = "brown"
dir = "data/shards/brown"

[[phases]]
name = "warm"
tokens = 4096
seq_len = 128
mixture = { sotu = 3.0, brown = 1.0 }

[[phases]]
name = "long"
seq_len = 256
mixture = { brown = 1 }
rope_theta = 1e5
lr_scale = 0.5
)";

std::string error_text(const std::string& text) {
  try {
    parse_recipe(text, "r.toml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(RecipePhases, ParsesDatasetsAndPhases) {
  Recipe r = parse_recipe(kTwoPhases, "r.toml");
  ASSERT_EQ(r.data.datasets.size(), 2u);
  EXPECT_EQ(r.data.datasets[1].name, "brown");
  EXPECT_EQ(r.data.datasets[1].dir, "data/shards/brown");
  ASSERT_EQ(r.phases.size(), 2u);
  EXPECT_EQ(r.phases[0].name, "warm");
  EXPECT_EQ(r.phases[0].tokens, 4096);
  EXPECT_EQ(r.phases[0].seq_len, 128);
  ASSERT_EQ(r.phases[0].mixture.size(), 2u);
  EXPECT_EQ(r.phases[0].mixture[0].dataset, "brown");  // sorted by name
  EXPECT_EQ(r.phases[0].mixture[1].weight, 3.0);
  EXPECT_EQ(r.phases[0].rope_theta, 0.0);
  EXPECT_EQ(r.phases[1].tokens, 0);  // last phase: until the end
  EXPECT_EQ(r.phases[1].rope_theta, 1e5);
  EXPECT_EQ(r.phases[1].lr_scale, 0.5);
  EXPECT_EQ(r.phases[1].mixture[0].weight, 1.0);  // integer weight accepted
  EXPECT_TRUE(r.data.reset_at_document_boundary);
}

TEST(RecipePhases, RoundTripsThroughToml) {
  Recipe r = parse_recipe(kTwoPhases, "r.toml");
  const std::string text = recipe_to_toml(r);
  EXPECT_HAS(text, "[[phases]]");
  EXPECT_HAS(text, "[[data.datasets]]");
  EXPECT_EQ(parse_recipe(text, "resolved.toml"), r) << text;
}

TEST(RecipePhases, ErrorsNameThePhaseAndKey) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string t = kTwoPhases;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_HAS(error_text(with("brown = 1 }", "brwn = 1 }")), "phases[1].mixture.brwn");
  EXPECT_HAS(error_text(with("brown = 1 }", "brwn = 1 }")), "declared datasets: brown, sotu");
  EXPECT_HAS(error_text(with("tokens = 4096", "tokens = 4000")), "phases[0].tokens");
  EXPECT_HAS(error_text(with("tokens = 4096", "tokens = 4000")), "multiple of seq_len (128)");
  EXPECT_HAS(error_text(with("tokens = 4096\n", "")), "only the last phase may be open-ended");
  EXPECT_HAS(error_text(with("seq_len = 128", "seq_len = \"128\"")), "phases[0].seq_len");
  EXPECT_HAS(error_text(with("name = \"long\"", "name = \"warm\"")), "declared twice");
  EXPECT_HAS(error_text(with("lr_scale = 0.5", "lr_scale = 0.5\nwarmup = 3")), "phases[1].warmup");
  // Context parallelism: every phase's sequences split into 2 x context_parallel chunks.
  const std::string cp = with("[data]\nreset_at_document_boundary = true", "[parallel]\ncontext_parallel = 48");
  EXPECT_HAS(error_text(cp), "'phases[0].seq_len'");
  EXPECT_HAS(error_text(cp), "expected a multiple of 2 x parallel.context_parallel (96), found 128");
  EXPECT_HAS(error_text(cp), "'phases[1].seq_len'");
  EXPECT_EQ(error_text(with("[data]\nreset_at_document_boundary = true", "[parallel]\ncontext_parallel = 32")), "");
  EXPECT_HAS(error_text(with("lr_scale = 0.5", "lr_scale = -1")), "phases[1].lr_scale");
  EXPECT_HAS(error_text(with("name = \"sotu\"\n", "")), "data.datasets[0].name");
  EXPECT_HAS(error_text("[[phases]]\nseq_len = 64\nmixture = { a = 1 }\n"), "no [[data.datasets]] is declared");
  EXPECT_HAS(error_text("phases = 3\n"), "expected an array of tables");
  Recipe r;
  try {
    apply_override(r, "phases.seq_len=3");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "not with --set");
  }
}

}  // namespace
}  // namespace zaya
