// `zaya train` on the GPU backend (the trainer itself; test_gpu_model.cpp checks its numbers
// against the CPU): every metrics.jsonl record and every progress line carry the most device
// memory held so far (device_memory_gib, "mem"), which never falls and which activation
// recomputation lowers. Skipped ("skipped: no GPU") without a device;
// runs in the host emulation in every build.
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

TEST(GpuTrainer, MetricsAndProgressShowTheDeviceMemoryHeld) {
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
  r.logging.every = 1;
  r.logging.plot = false;
  TrainOptions opt;
  opt.backend = "cuda";
  double last_peak[2] = {0, 0};
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recomputing activations" : "keeping activations");
    Recipe run = r;
    run.run_dir = (dir / (recompute ? "recomputed" : "kept")).string();
    run.batch.recompute_activations = recompute;
    ::testing::internal::CaptureStderr();
    const TrainSummary s = train(run, opt);
    const std::string printed = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(s.steps, 3);
    const std::vector<double> mem = device_memory_of(run.run_dir + "/metrics.jsonl");
    ASSERT_EQ(mem.size(), 3u);
    for (size_t i = 0; i < mem.size(); ++i) {
      EXPECT_GT(mem[i], 0.0) << "step " << i + 1;
      if (i > 0) {
        EXPECT_GE(mem[i], mem[i - 1]) << "step " << i + 1 << ": the most held cannot fall";
      }
    }
    last_peak[recompute ? 1 : 0] = mem.back();
    // Every progress line ("step 1/3 | ... | MFU x% | mem y GiB | ETA ...") shows it.
    for (const char* step : {"step 1/3 |", "step 2/3 |", "step 3/3 |"}) {
      const size_t at = printed.find(step);
      ASSERT_NE(at, std::string::npos) << step << " missing from:\n" << printed;
      const std::string line = printed.substr(at, printed.find('\n', at) - at);
      EXPECT_NE(line.find(" | mem "), std::string::npos) << line;
      EXPECT_NE(line.find(" GiB | ETA "), std::string::npos) << line;
    }
  }
  EXPECT_LT(last_peak[1], last_peak[0]) << "recomputing activations should hold less";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zaya
