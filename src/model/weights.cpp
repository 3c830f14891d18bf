// Binds the typed per-block views of weights.h to offsets in a flat arena.
#include "model/weights.h"

namespace zaya {

ModelWeights bind_weights(const ModelConfig& c, const ParamLayout& L, float* base) {
  auto at = [&](const std::string& name) { return base + L.at(name).offset; };
  auto opt = [&](const std::string& name) -> float* {
    const ParamSpec* p = L.find(name);
    return p ? base + p->offset : nullptr;
  };
  auto res = [&](const std::string& prefix) {
    return ResidualScaleWeights{at(prefix + ".hidden_states_scale"), at(prefix + ".hidden_states_bias"),
                                at(prefix + ".residual_scale"), at(prefix + ".residual_bias")};
  };
  ModelWeights w{};
  w.embed = at("model.embed_tokens.weight");
  w.input_scale = at("model.input_hidden_states_scale");
  w.input_bias = at("model.input_hidden_states_bias");
  for (int64_t k = 0; k < c.num_hidden_layers; ++k) {
    const std::string b = "model.layers." + std::to_string(k) + ".";
    const std::string qkv = b + "self_attn.qkv_proj.";
    const std::string g = b + "mlp.gate.";
    BlockWeights blk{};
    blk.input_norm = at(b + "input_layernorm.weight");
    blk.attn = CcaWeights{at(qkv + "q_proj.weight"),          at(qkv + "k_proj.weight"),
                          at(qkv + "v_proj_current.weight"),  at(qkv + "v_proj_delayed.weight"),
                          at(qkv + "conv_qk_depthwise.weight"), at(qkv + "conv_qk_depthwise.bias"),
                          at(qkv + "conv_qk_grouped.weight"), at(qkv + "conv_qk_grouped.bias"),
                          at(b + "self_attn.qk_norm.temp"),   at(b + "self_attn.o_proj.weight")};
    blk.post_attn_scale = res(b + "post_attention_residual_scale");
    blk.post_attn_norm = at(b + "post_attention_layernorm.weight");
    blk.router = RouterWeights{at(g + "down_proj.weight"),          at(g + "down_proj.bias"),
                               opt(g + "router_states_scale"),      at(g + "router_mlp.norm.weight"),
                               at(g + "router_mlp.fc1.weight"),     at(g + "router_mlp.fc1.bias"),
                               at(g + "router_mlp.fc2.weight"),     at(g + "router_mlp.fc2.bias"),
                               at(g + "router_mlp.out_proj.weight"), at(g + "balancing_biases")};
    blk.experts = ExpertWeights{at(b + "mlp.experts.gate_up_proj"), at(b + "mlp.experts.down_proj")};
    blk.post_mlp_scale = res(b + "post_mlp_residual_scale");
    w.blocks.push_back(blk);
  }
  w.final_norm = at("model.norm.weight");
  w.lm_head = c.tie_word_embeddings ? w.embed : at("lm_head.weight");
  w.lm_head_bias = opt("lm_head.bias");
  return w;
}

}  // namespace zaya
