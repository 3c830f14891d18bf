// `zaya info`: configuration, parameter counts (total, active, embedding), memory per dtype.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "train/optimizer.h"

namespace zaya::cli {

namespace {

std::string human(double n) {
  const char* unit[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000 && u < 4) { n /= 1000; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%s", n, unit[u]);
  return buf;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

void run_info(const std::string& model_dir, const std::string& preset) {
  ModelConfig c = !preset.empty() ? preset_config(preset)
                                  : load_config_file((std::filesystem::path(model_dir) / "config.json").string());
  ParamCounts pc = count_params(c);
  std::printf("model            %s\n", preset.empty() ? model_dir.c_str() : ("preset " + preset).c_str());
  std::printf("hidden / layers  %lld / %lld blocks (CCA + MoE each)\n", (long long)c.hidden_size,
              (long long)c.num_hidden_layers);
  std::printf("attention        %lld query heads, %lld KV heads, head_dim %lld, rotary %lld dims, conv %lldx%lld\n",
              (long long)c.num_attention_heads, (long long)c.num_key_value_heads, (long long)c.head_dim,
              (long long)c.rotary_dim(0), (long long)c.cca_time0, (long long)c.cca_time1);
  std::printf("experts          %lld x SwiGLU(%lld) + skip, top-1, router latent %lld, skip output %s\n",
              (long long)c.num_experts, (long long)c.moe_intermediate_size, (long long)c.router_hidden_size,
              c.skip_expert_output == SkipMode::Zero ? "zero" : "identity");
  std::printf("vocab            %lld (%s embeddings)\n", (long long)c.vocab_size,
              c.tie_word_embeddings ? "tied" : "untied");
  std::printf("rope theta       %g (hybrid), %g (sliding); max positions %lld\n", c.rope_hybrid.theta,
              c.rope_sliding.theta, (long long)c.max_position_embeddings);
  std::printf("parameters       total %s (%lld), non-embedding %s, embedding %s, active/token %s\n",
              human(double(pc.total)).c_str(), (long long)pc.total, human(double(pc.total - pc.embedding)).c_str(),
              human(double(pc.embedding)).c_str(), human(double(pc.active)).c_str());
  std::printf("weights memory   f32 %s, bf16 %s\n", gib(double(pc.total) * 4).c_str(),
              gib(double(pc.total) * 2).c_str());
  // What training keeps per parameter: fp32 weights and gradients, plus Muon's momentum or
  // AdamW's two moments (spec C.3-C.5), on one GPU without sharding (ZeRO-1 splits the last part).
  double state_floats = 0;
  for (const ParamSpec& p : build_param_layout(c).params) {
    const OptimKind k = route_param(p).kind;
    state_floats += double(p.numel) * (2 + (k == OptimKind::Muon ? 1 : k == OptimKind::AdamW ? 2 : 0));
  }
  std::printf("training state   %s (f32 weights, gradients, Muon momentum / AdamW moments; activations extra)\n",
              gib(state_floats * 4).c_str());
  std::printf("KV cache         %lld values/token (%s per 1k tokens in f32)\n",
              (long long)(2 * c.kv_dim() * c.num_hidden_layers),
              gib(double(2 * c.kv_dim() * c.num_hidden_layers) * 4 * 1000).c_str());
}

}  // namespace

void add_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show a model's configuration, parameter counts and memory");
  static std::string model_dir, preset;
  auto* m = cmd->add_option("--model", model_dir, "Model directory (config.json + safetensors)");
  auto* p = cmd->add_option("--preset", preset, "A built-in preset instead of a directory");
  m->excludes(p);
  cmd->callback([] {
    if (model_dir.empty() && preset.empty()) fail("info", "pass --model DIR or --preset NAME");
    run_info(model_dir, preset);
  });
}

}  // namespace zaya::cli
