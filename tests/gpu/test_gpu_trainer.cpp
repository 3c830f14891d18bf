// `zaya train` on the GPU backend (the trainer itself; test_gpu_model.cpp checks its numbers
// against the CPU): every metrics.jsonl record carries the most device memory held so far
// (device_memory_gib), which activation recomputation lowers. Skipped ("skipped: no GPU")
// without a device; runs in the host emulation in every build.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "../common/synthetic_corpus.h"
#include "gpu_test_support.h"
#include "train/recipe.h"
#include "train/trainer.h"
#ifdef ZAYA_SIMT
#include "simt_register.h"  // the trainer's make_backend("cuda") reaches the host emulation
#endif

namespace zaya {
namespace {

using namespace gpu_test;
namespace fs = std::filesystem;

// Each step's device_memory_gib from metrics.jsonl (-1 where a record lacks it).
std::vector<double> device_memory_of(const std::string& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    out.push_back(j.contains("device_memory_gib") ? j["device_memory_gib"].get<double>() : -1.0);
  }
  return out;
}

TEST(GpuTrainer, MetricsRecordTheDeviceMemoryHeld) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
#ifdef ZAYA_SIMT
  static const bool registered = (simt::register_emulated_gpu(), true);
  (void)registered;
#endif
  const fs::path dir = fs::temp_directory_path() / ("zaya_gpu_trainer_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  Recipe r = test::synthetic_recipe(dir.string());
  test::write_synthetic_corpus(r.data.train, 20000, 1);
  test::write_synthetic_corpus(r.data.val, 4000, 2);
  r.model.preset = "zaya-tiny";
  r.data.seq_len = 64;
  r.batch.micro_batch = 4;
  r.batch.global_batch = 4;
  r.schedule.total_steps = 3;
  r.schedule.warmup_steps = 1;
  r.checkpoint.every = 0;
  r.eval.every = 0;
  r.logging.plot = false;
  TrainOptions opt;
  opt.quiet = true;
  opt.backend = "cuda";
  std::vector<double> peaks[2];
  for (const bool recompute : {false, true}) {
    Recipe run = r;
    run.run_dir = (dir / (recompute ? "recomputed" : "kept")).string();
    run.batch.recompute_activations = recompute;
    EXPECT_EQ(train(run, opt).steps, 3);
    const std::vector<double> mem = device_memory_of(run.run_dir + "/metrics.jsonl");
    ASSERT_EQ(mem.size(), 3u);
    for (size_t s = 0; s < mem.size(); ++s) {
      EXPECT_GT(mem[s], 0.0) << "step " << s + 1;
      if (s > 0) {
        EXPECT_GE(mem[s], mem[s - 1]) << "step " << s + 1 << ": the most held cannot fall";
      }
    }
    peaks[recompute ? 1 : 0] = mem;
  }
  EXPECT_LT(peaks[1].back(), peaks[0].back()) << "recomputing activations should hold less";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zaya
