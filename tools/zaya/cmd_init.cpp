// `zaya init`: writes a randomly initialised model (spec C.5) in HF layout, from a preset
// or a config.json, so the rest of the tool chain can run without a download.
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "model/model_io.h"

namespace zaya::cli {

void add_init(CLI::App& app) {
  auto* cmd = app.add_subcommand("init", "Write a randomly initialised model directory (HF layout)");
  static std::string preset = "zaya-tiny", config_path, out, dtype = "f32";
  static uint64_t seed = 1234;
  static int64_t vocab = 0;
  cmd->add_option("--preset", preset, "Built-in preset")->capture_default_str();
  cmd->add_option("--config", config_path, "A config.json to use instead of a preset");
  cmd->add_option("--vocab", vocab, "Override vocab_size");
  cmd->add_option("--out", out, "Output directory")->required();
  cmd->add_option("--seed", seed, "Initialisation seed")->capture_default_str();
  cmd->add_option("--dtype", dtype, "Stored dtype: f32 or bf16")->capture_default_str();
  cmd->callback([] {
    ModelConfig c = config_path.empty() ? preset_config(preset) : load_config_file(config_path);
    if (vocab > 0) {
      c.vocab_size = vocab;
      validate_config(c, "init --vocab");
    }
    DType t = dtype == "f32" ? DType::F32 : dtype == "bf16" ? DType::BF16 : DType::U8;
    if (t == DType::U8) fail("init", "--dtype must be f32 or bf16, got '" + dtype + "'");
    auto be = make_cpu_backend();
    Model m(c, *be);
    m.init_random(seed);
    save_model(m, out, t);
    std::printf("wrote %s (%s, seed %llu)\n", out.c_str(), config_path.empty() ? preset.c_str() : config_path.c_str(),
                (unsigned long long)seed);
  });
}

}  // namespace zaya::cli
