// config.json parsing: every field of spec A.1, presets, and clear errors for unknown or
// inconsistent fields (naming the field).
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "model/params.h"

namespace zaya {
namespace {

using nlohmann::json;

json base_json() { return config_to_json(preset_config("zaya-tiny")); }

std::string error_of(const json& j) {
  try {
    config_from_json(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, RoundTripsThroughJson) {
  ModelConfig c = preset_config("zaya-small");
  c.layer_types[1] = "hybrid_sliding";
  c.sliding_window = 64;
  c.rope_sliding = {5e3, 1.0};
  c.eos_token_ids = {1, 106};
  c.tie_word_embeddings = false;
  c.lm_head_bias = true;
  ModelConfig d = config_from_json(config_to_json(c), "x");
  EXPECT_EQ(config_to_json(d), config_to_json(c));
  EXPECT_EQ(d.rotary_dim(0), 32);
  EXPECT_EQ(d.rotary_dim(1), 64);
  EXPECT_TRUE(d.is_sliding(1));
}

TEST(Config, ParsesHfStyleConfig) {
  json j = {{"model_type", "zaya"}, {"vocab_size", 262272}, {"hidden_size", 2048}, {"num_hidden_layers", 40},
            {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 128},
            {"rope_parameters", {{"hybrid", {{"rope_type", "default"}, {"rope_theta", 5e6}, {"partial_rotary_factor", 0.5}}},
                                 {"hybrid_sliding", {{"rope_type", "default"}, {"rope_theta", 1e4}, {"partial_rotary_factor", 0.5}}}}},
            {"eos_token_id", 106}, {"transformers_version", "5.17.0"}, {"torch_dtype", "bfloat16"},
            {"sliding_window", nullptr}, {"use_cache", true}};
  ModelConfig c = config_from_json(j, "hf.json");
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.layer_types.size(), 40u);
  EXPECT_DOUBLE_EQ(c.rope_hybrid.theta, 5e6);
  EXPECT_EQ(c.rotary_dim(0), 64);
  EXPECT_EQ(c.skip_expert_output, SkipMode::Zero);  // HF semantics when not named
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{106});
}

TEST(Config, Zaya1BasePresetHasTheReleasedShape) {
  ModelConfig c = preset_config("zaya1-base");
  ParamCounts pc = count_params(c);
  // Spec A.9: 8.303B non-embedding, 8.840B with the tied embedding, ~753.6M active.
  EXPECT_NEAR(double(pc.total - pc.embedding) / 1e9, 8.303, 0.001);
  EXPECT_NEAR(double(pc.total) / 1e9, 8.840, 0.001);
  EXPECT_NEAR(double(pc.active) / 1e6, 753.6, 0.5);
  EXPECT_EQ(c.skip_expert_output, SkipMode::Identity);  // created by zaya
}

TEST(Config, ErrorsNameTheField) {
  json j = base_json();
  j["num_attention_heads"] = 3;
  EXPECT_NE(error_of(j).find("'num_attention_heads' (3) must be divisible by num_key_value_heads (2)"), std::string::npos)
      << error_of(j);
  j = base_json();
  j["hiden_size"] = 5;
  EXPECT_NE(error_of(j).find("unknown field 'hiden_size'"), std::string::npos);
  j = base_json();
  j["hidden_size"] = "64";
  EXPECT_NE(error_of(j).find("'hidden_size' must be an integer"), std::string::npos);
  j = base_json();
  j["layer_types"] = {"hybrid", "hybrid_sliding"};
  EXPECT_NE(error_of(j).find("'sliding_window' must be set"), std::string::npos);
  j = base_json();
  j["layer_types"] = {"hybrid"};
  EXPECT_NE(error_of(j).find("'layer_types' has 1 entries"), std::string::npos);
  j = base_json();
  j["num_experts_per_tok"] = 2;
  EXPECT_NE(error_of(j).find("'num_experts_per_tok' must be 1"), std::string::npos);
  j = base_json();
  j["skip_expert_output"] = "half";
  EXPECT_NE(error_of(j).find("'skip_expert_output'"), std::string::npos);
  j = base_json();
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("'model_type' must be \"zaya\""), std::string::npos);
  j = base_json();
  j["rope_parameters"]["hybrid"]["rope_type"] = "yarn";
  EXPECT_NE(error_of(j).find("rope_type"), std::string::npos);
  j = base_json();
  j["rope_parameters"]["hybrid"]["partial_rotary_factor"] = 0.3;  // 16 * 0.3 = 4.8 -> 4 is even; use 0.1 -> 1
  j["rope_parameters"]["hybrid"]["partial_rotary_factor"] = 0.1;
  EXPECT_NE(error_of(j).find("positive even number"), std::string::npos);
  EXPECT_NE(error_of(json::array()).find("expected a JSON object"), std::string::npos);
}

TEST(Config, UnknownPresetListsTheKnownOnes) {
  try {
    preset_config("zaya-huge");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zaya1-base"), std::string::npos);
  }
}

}  // namespace
}  // namespace zaya
