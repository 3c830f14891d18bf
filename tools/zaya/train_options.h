// The options `zaya train` takes and `zaya launch` forwards to it: one definition, so the two
// commands accept the same flags with the same checks and help.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace zaya::cli {

struct TrainCliOptions {
  std::string recipe_path;             // --recipe ("" = the built-in recipe)
  std::vector<std::string> overrides;  // --set section.key=value
  std::string backend = "cpu";
  bool device_comm = false;
  int64_t bucket_mb = 32;
  double comm_timeout = 600;
};

// Registers the recipe (positional or --recipe), --set, --backend, --device-comm, --bucket-mb and
// --comm-timeout on cmd.
void add_train_options(CLI::App* cmd, TrainCliOptions& o);

// The same options as `zaya train` arguments (for a launcher that runs zaya train).
std::vector<std::string> train_arguments(const TrainCliOptions& o);

}  // namespace zaya::cli
