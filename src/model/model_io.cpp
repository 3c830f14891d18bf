// Model loading/saving in HF layout, with the original 80-half-layer name mapping.
#include "model/model_io.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"

namespace zaya {

namespace fs = std::filesystem;

std::vector<std::string> original_layout_names(const ModelConfig& c, const std::string& name) {
  static const std::regex block_re(R"(^model\.layers\.(\d+)\.(.*)$)");
  if (name == "model.input_hidden_states_scale") return {"model.layers.0.res_scale.hidden_states_scale"};
  if (name == "model.input_hidden_states_bias") return {"model.layers.0.res_scale.hidden_states_bias"};
  if (name == "model.norm.weight") return {"model.final_norm.weight"};
  std::smatch m;
  if (!std::regex_match(name, m, block_re)) return {name};
  const int64_t k = std::stoll(m[1].str());
  const std::string rest = m[2].str();
  const std::string att = "model.layers." + std::to_string(2 * k) + ".";
  const std::string moe = "model.layers." + std::to_string(2 * k + 1) + ".";
  const std::string nxt = k + 1 < c.num_hidden_layers ? "model.layers." + std::to_string(2 * k + 2) + ".res_scale."
                                                       : std::string("model.res_scale.");
  static const std::vector<std::pair<std::string, std::string>> attn_map = {
      {"self_attn.qkv_proj.q_proj.weight", "self_attn.qkv.linear_q.weight"},
      {"self_attn.qkv_proj.k_proj.weight", "self_attn.qkv.linear_k.weight"},
      {"self_attn.qkv_proj.v_proj_current.weight", "self_attn.qkv.val_proj1.weight"},
      {"self_attn.qkv_proj.v_proj_delayed.weight", "self_attn.qkv.val_proj2.weight"},
      {"self_attn.qkv_proj.conv_qk_depthwise.weight", "self_attn.qkv.conv_qk.0.weight"},
      {"self_attn.qkv_proj.conv_qk_depthwise.bias", "self_attn.qkv.conv_qk.0.bias"},
      {"self_attn.qkv_proj.conv_qk_grouped.weight", "self_attn.qkv.conv_qk.1.weight"},
      {"self_attn.qkv_proj.conv_qk_grouped.bias", "self_attn.qkv.conv_qk.1.bias"},
      {"self_attn.qk_norm.temp", "self_attn.qkv.temp"},
      {"self_attn.o_proj.weight", "self_attn.o_proj.weight"},
      {"input_layernorm.weight", "input_norm.weight"}};
  for (const auto& [hf, orig] : attn_map)
    if (rest == hf) return {att + orig};
  static const std::vector<std::pair<std::string, std::string>> router_map = {
      {"mlp.gate.down_proj.weight", "down_proj.weight"},
      {"mlp.gate.down_proj.bias", "down_proj.bias"},
      {"mlp.gate.router_states_scale", "router_states_scale"},
      {"mlp.gate.router_mlp.norm.weight", "rmsnorm_eda.weight"},
      {"mlp.gate.router_mlp.fc1.weight", "router_mlp.0.weight"},
      {"mlp.gate.router_mlp.fc1.bias", "router_mlp.0.bias"},
      {"mlp.gate.router_mlp.fc2.weight", "router_mlp.2.weight"},
      {"mlp.gate.router_mlp.fc2.bias", "router_mlp.2.bias"},
      {"mlp.gate.router_mlp.out_proj.weight", "router_mlp.4.weight"},
      {"mlp.gate.balancing_biases", "balancing_biases"}};
  for (const auto& [hf, orig] : router_map)
    if (rest == hf) return {moe + "zaya_block.router." + orig};
  if (rest == "post_attention_layernorm.weight") return {moe + "input_norm.weight"};
  const std::string pa = "post_attention_residual_scale.", pm = "post_mlp_residual_scale.";
  if (rest.rfind(pa, 0) == 0) return {moe + "res_scale." + rest.substr(pa.size())};
  if (rest.rfind(pm, 0) == 0) return {nxt + rest.substr(pm.size())};
  if (rest == "mlp.experts.gate_up_proj" || rest == "mlp.experts.down_proj") {
    const char* leaf = rest == "mlp.experts.gate_up_proj" ? ".linear_fc1.weight" : ".linear_fc2.weight";
    std::vector<std::string> names;
    for (int64_t e = 0; e < c.num_experts; ++e)
      names.push_back(moe + "zaya_block.experts.local_experts." + std::to_string(e) + leaf);
    return names;
  }
  return {name};
}

void load_weights(Model& m, const std::string& dir) {
  const ModelConfig& c = m.config();
  SafeTensorsSet set = SafeTensorsSet::open_dir(dir);
  const bool original = set.find("model.final_norm.weight") || set.find("model.layers.0.res_scale.hidden_states_scale");
  std::vector<std::string> missing, misshaped;
  std::set<std::string> used;
  std::vector<float> host;
  for (const ParamSpec& p : m.layout().params) {
    std::vector<std::string> sources = original ? original_layout_names(c, p.name) : std::vector<std::string>{p.name};
    std::vector<int64_t> part_shape = p.shape;
    if (sources.size() > 1) part_shape.erase(part_shape.begin());  // stacked experts
    host.assign(static_cast<size_t>(p.numel), 0.0f);
    int64_t off = 0;
    bool ok = true;
    for (const std::string& src : sources) {
      const SafeTensorsSet::Entry* e = set.find(src);
      if (!e) {
        missing.push_back(src + " " + shape_str(part_shape));
        ok = false;
        continue;
      }
      used.insert(src);
      if (e->info->shape != part_shape) {
        misshaped.push_back(src + ": expected " + shape_str(part_shape) + ", found " + shape_str(e->info->shape) +
                            " in " + e->file->path());
        ok = false;
        continue;
      }
      set.read_f32(src, host.data() + off);
      off += int64_t(e->info->numel());
    }
    if (ok) m.backend().from_host(m.params() + p.offset, host.data(), p.numel * 4);
  }
  std::vector<std::string> unexpected;
  for (const std::string& n : set.names()) {
    if (used.count(n)) continue;
    if (c.tie_word_embeddings && n == "lm_head.weight") continue;  // tied: the embedding is the head
    unexpected.push_back(n);
  }
  if (missing.empty() && misshaped.empty() && unexpected.empty()) return;
  std::string msg = dir + ": the checkpoint does not match config.json (" +
                    std::string(original ? "original 80-half-layer" : "HF 40-block") + " names)";
  auto section = [&](const char* title, const std::vector<std::string>& items) {
    if (items.empty()) return;
    msg += "\n  " + std::string(title) + " (" + std::to_string(items.size()) + "):";
    size_t shown = 0;
    for (const auto& s : items) {
      if (++shown > 20) { msg += "\n    ... and " + std::to_string(items.size() - 20) + " more"; break; }
      msg += "\n    " + s;
    }
  };
  section("missing", missing);
  section("mis-shaped", misshaped);
  section("unexpected", unexpected);
  fail("weights", msg, "check that config.json belongs to these weights (layers, experts, sizes, tie_word_embeddings)");
}

std::unique_ptr<Model> load_model(const std::string& dir, Backend& be) {
  if (!fs::is_directory(dir)) fail("weights", "model directory '" + dir + "' does not exist");
  ModelConfig c = load_config_file((fs::path(dir) / "config.json").string());
  auto m = std::make_unique<Model>(c, be);
  load_weights(*m, dir);
  return m;
}

void save_model(Model& m, const std::string& dir, DType dtype) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("weights", "cannot create directory '" + dir + "': " + ec.message());
  {
    std::ofstream f(fs::path(dir) / "config.json");
    if (!f) fail("weights", "cannot write " + (fs::path(dir) / "config.json").string());
    f << config_to_json(m.config()).dump(2) << "\n";
  }
  const auto& params = m.layout().params;
  std::vector<std::vector<uint8_t>> bufs(params.size());
  std::vector<TensorToWrite> tensors;
  std::vector<float> host;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    DType t = p.kind == ParamKind::Buffer ? DType::F32 : dtype;  // balancing biases stay fp32
    host.resize(static_cast<size_t>(p.numel));
    m.backend().to_host(host.data(), m.params() + p.offset, p.numel * 4);
    bufs[i].resize(static_cast<size_t>(p.numel) * dtype_size(t));
    convert_from_f32(host.data(), size_t(p.numel), t, bufs[i].data());
    tensors.push_back({p.name, t, p.shape, bufs[i].data()});
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
}

}  // namespace zaya
