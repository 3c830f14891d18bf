// Builds the canonical parameter list of spec A.3 for any ZAYA config.
#include "model/params.h"

#include "core/error.h"

namespace zaya {

const ParamSpec* ParamLayout::find(const std::string& name) const {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &params[it->second];
}

const ParamSpec& ParamLayout::at(const std::string& name) const {
  const ParamSpec* p = find(name);
  if (!p) fail("model", "no parameter named '" + name + "'");
  return *p;
}

void ParamLayout::add(const std::string& name, std::vector<int64_t> shape, ParamKind kind) {
  ParamSpec p;
  p.name = name;
  p.shape = std::move(shape);
  p.kind = kind;
  p.numel = 1;
  for (int64_t d : p.shape) p.numel *= d;
  p.offset = total;
  total += (p.numel + 15) / 16 * 16;
  index[p.name] = params.size();
  params.push_back(std::move(p));
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

ParamLayout build_param_layout(const ModelConfig& c) {
  ParamLayout L;
  const int64_t D = c.hidden_size, R = c.router_hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t C = c.conv_channels(), dh = c.head_dim;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, ParamKind kind) {
    L.add(name, std::move(shape), kind);
  };
  auto res_scale = [&](const std::string& prefix) {
    for (const char* n : {"hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias"})
      add(prefix + "." + n, {D}, ParamKind::Vector);
  };

  add("model.embed_tokens.weight", {c.vocab_size, D}, ParamKind::Embedding);
  add("model.input_hidden_states_scale", {D}, ParamKind::Vector);
  add("model.input_hidden_states_bias", {D}, ParamKind::Vector);
  for (int64_t k = 0; k < c.num_hidden_layers; ++k) {
    const std::string b = "model.layers." + std::to_string(k) + ".";
    const std::string qkv = b + "self_attn.qkv_proj.";
    add(b + "input_layernorm.weight", {D}, ParamKind::Vector);
    add(qkv + "q_proj.weight", {c.q_dim(), D}, ParamKind::Matrix);
    add(qkv + "k_proj.weight", {c.kv_dim(), D}, ParamKind::Matrix);
    add(qkv + "v_proj_current.weight", {c.kv_dim() / 2, D}, ParamKind::Matrix);
    add(qkv + "v_proj_delayed.weight", {c.kv_dim() / 2, D}, ParamKind::Matrix);
    add(qkv + "conv_qk_depthwise.weight", {C, 1, c.cca_time0}, ParamKind::Conv);
    add(qkv + "conv_qk_depthwise.bias", {C}, ParamKind::Vector);
    add(qkv + "conv_qk_grouped.weight", {C, dh, c.cca_time1}, ParamKind::Conv);
    add(qkv + "conv_qk_grouped.bias", {C}, ParamKind::Vector);
    add(b + "self_attn.qk_norm.temp", {c.num_key_value_heads}, ParamKind::Vector);
    add(b + "self_attn.o_proj.weight", {D, c.q_dim()}, ParamKind::Matrix);
    res_scale(b + "post_attention_residual_scale");
    add(b + "post_attention_layernorm.weight", {D}, ParamKind::Vector);
    const std::string g = b + "mlp.gate.";
    add(g + "down_proj.weight", {R, D}, ParamKind::Matrix);
    add(g + "down_proj.bias", {R}, ParamKind::Vector);
    if (k > 0) add(g + "router_states_scale", {R}, ParamKind::Vector);
    add(g + "router_mlp.norm.weight", {R}, ParamKind::Vector);
    add(g + "router_mlp.fc1.weight", {R, R}, ParamKind::Matrix);
    add(g + "router_mlp.fc1.bias", {R}, ParamKind::Vector);
    add(g + "router_mlp.fc2.weight", {R, R}, ParamKind::Matrix);
    add(g + "router_mlp.fc2.bias", {R}, ParamKind::Vector);
    add(g + "router_mlp.out_proj.weight", {E + 1, R}, ParamKind::Matrix);
    add(g + "balancing_biases", {E + 1}, ParamKind::Buffer);
    add(b + "mlp.experts.gate_up_proj", {E, 2 * I, D}, ParamKind::Matrix);
    add(b + "mlp.experts.down_proj", {E, D, I}, ParamKind::Matrix);
    res_scale(b + "post_mlp_residual_scale");
  }
  add("model.norm.weight", {D}, ParamKind::Vector);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, D}, ParamKind::Embedding);
  if (c.lm_head_bias) add("lm_head.bias", {c.vocab_size}, ParamKind::Vector);
  return L;
}

ParamCounts count_params(const ModelConfig& c) {
  ParamLayout L = build_param_layout(c);
  ParamCounts pc;
  const int64_t per_expert = 3 * c.moe_intermediate_size * c.hidden_size;
  for (const auto& p : L.params) {
    if (p.kind == ParamKind::Buffer) continue;
    pc.total += p.numel;
    if (p.kind == ParamKind::Embedding) pc.embedding += p.numel;
  }
  int64_t experts_all = c.num_hidden_layers * c.num_experts * per_expert;
  pc.active = pc.total - pc.embedding - experts_all + c.num_hidden_layers * per_expert;
  return pc;
}

}  // namespace zaya
