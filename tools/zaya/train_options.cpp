// The training options shared by `zaya train` and `zaya launch`. See train_options.h.
#include "train_options.h"

#include <cstdio>

namespace zaya::cli {

void add_train_options(CLI::App* cmd, TrainCliOptions& o) {
  cmd->add_option("recipe,--recipe", o.recipe_path,
                  "TOML recipe, given as the first argument or with --recipe (default: the built-in recipe)");
  cmd->add_option("--set", o.overrides, "Override a recipe key: --set optimizer.lr=1e-3 (repeatable)");
  cmd->add_option("--backend", o.backend, "cpu, or cuda in a GPU build (rank r uses GPU local rank r)")
      ->capture_default_str();
  cmd->add_flag(
      "--device-comm", o.device_comm,
      "GPU data parallel: reduce gradients over NCCL on the device instead of through host memory (MPI)");
  cmd->add_option("--bucket-mb", o.bucket_mb, "Data parallel: gradient reduce-scatter bucket size in MiB")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  cmd->add_option("--comm-timeout", o.comm_timeout,
                  "Data parallel: watchdog seconds per collective (0 = off; ZAYA_COMM_TIMEOUT overrides)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

std::vector<std::string> train_arguments(const TrainCliOptions& o) {
  std::vector<std::string> args;
  if (!o.recipe_path.empty()) args.insert(args.end(), {"--recipe", o.recipe_path});
  for (const std::string& s : o.overrides) args.insert(args.end(), {"--set", s});
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g", o.comm_timeout);
  args.insert(args.end(), {"--backend", o.backend, "--bucket-mb", std::to_string(o.bucket_mb),
                           "--comm-timeout", timeout});
  if (o.device_comm) args.push_back("--device-comm");
  return args;
}

}  // namespace zaya::cli
