// ZAYA model configuration: the fields of a Hugging Face config.json with model_type "zaya"
// (spec A.1) plus zaya's skip_expert_output setting (project decision 2), built-in presets,
// validation with errors that name the field, and JSON round-tripping.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zaya {

enum class SkipMode { Zero, Identity };  // skip-class output: 0 (HF) or p*x (original training code)

struct RopeParams {
  double theta = 1e6;
  double partial_rotary_factor = 0.5;
};

struct ModelConfig {
  int64_t vocab_size = 262272;
  int64_t hidden_size = 2048;
  int64_t num_hidden_layers = 40;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 32768;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = true;
  bool lm_head_bias = false;
  int64_t moe_intermediate_size = 2048;
  int64_t num_experts = 16;
  int64_t num_experts_per_tok = 1;
  int64_t router_hidden_size = 256;
  int64_t cca_time0 = 2;
  int64_t cca_time1 = 2;
  std::vector<std::string> layer_types;  // "hybrid" or "hybrid_sliding", one per block
  int64_t sliding_window = 0;            // 0 = none
  RopeParams rope_hybrid{1e6, 0.5};
  RopeParams rope_sliding{1e4, 0.5};
  int64_t pad_token_id = 0;
  int64_t bos_token_id = 2;
  std::vector<int64_t> eos_token_ids{1};
  double initializer_range = 0.02;
  SkipMode skip_expert_output = SkipMode::Zero;

  // Derived quantities.
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t conv_channels() const { return q_dim() + kv_dim(); }
  int64_t conv_state_rows() const { return (cca_time0 - 1) + (cca_time1 - 1); }
  int64_t router_classes() const { return num_experts + 1; }
  bool is_sliding(int64_t layer) const { return layer_types[layer] == "hybrid_sliding"; }
  const RopeParams& rope(int64_t layer) const { return is_sliding(layer) ? rope_sliding : rope_hybrid; }
  int64_t rotary_dim(int64_t layer) const;
};

// Parses a config.json object. `source` names the file in errors. Throws zaya::Error naming
// the field for unknown keys, wrong types and inconsistent values.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& source);
ModelConfig load_config_file(const std::string& path);
nlohmann::json config_to_json(const ModelConfig& c);
// Checks every cross-field constraint; throws naming the field.
void validate_config(const ModelConfig& c, const std::string& source);

// Built-in presets: "zaya1-base" (the exact 8.3B shape), "zaya-tiny" (tests),
// "zaya-small" (demo), "zaya-60m" (benchmarks).
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace zaya
