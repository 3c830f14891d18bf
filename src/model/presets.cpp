// Built-in model shapes. zaya1-base is the exact released shape (spec A.1, A.9); the small
// presets keep the same architecture at sizes that fit tests, demos and benchmarks on a CPU.
#include <algorithm>

#include "core/error.h"
#include "model/config.h"

namespace zaya {

namespace {

ModelConfig make(int64_t vocab, int64_t d, int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
                 int64_t experts, int64_t inter, int64_t router, int64_t max_pos) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = d;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.num_experts = experts;
  c.moe_intermediate_size = inter;
  c.router_hidden_size = router;
  c.max_position_embeddings = max_pos;
  c.layer_types.assign(static_cast<size_t>(layers), "hybrid");
  c.skip_expert_output = SkipMode::Identity;  // models created by zaya (project decision 2)
  return c;
}

}  // namespace

std::vector<std::string> preset_names() { return {"zaya1-base", "zaya-60m", "zaya-small", "zaya-tiny"}; }

ModelConfig preset_config(const std::string& name) {
  ModelConfig c;
  if (name == "zaya1-base") {
    c = make(262272, 2048, 40, 8, 2, 128, 16, 2048, 256, 32768);
    c.rope_hybrid = {1e6, 0.5};
    c.eos_token_ids = {1};
  } else if (name == "zaya-60m") {
    c = make(8192, 512, 8, 8, 2, 64, 8, 512, 128, 4096);
    c.rope_hybrid = {1e4, 0.5};
  } else if (name == "zaya-small") {
    c = make(4096, 256, 4, 4, 2, 64, 4, 256, 64, 2048);
    c.rope_hybrid = {1e4, 0.5};
  } else if (name == "zaya-tiny") {
    c = make(512, 64, 2, 4, 2, 16, 4, 64, 32, 1024);
    c.rope_hybrid = {1e4, 0.5};
  } else {
    std::string list;
    for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
    fail("config", "unknown preset '" + name + "'", "known presets: " + list);
  }
  c.eos_token_ids = {1};
  validate_config(c, "preset " + name);
  return c;
}

}  // namespace zaya
