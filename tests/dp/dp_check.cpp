// Data-parallel equivalence check, run under mpirun (tests/dp/dp_equivalence.sh):
//
//   zaya_dp_check train DIR [--stop-after N] [--backend NAME]
//                                              trains the fixed tiny recipe into DIR/run with
//                                              however many ranks it was launched with (on the
//                                              GPU: --backend cuda-fp32, scripts/gpu_device_checks.sh)
//   zaya_dp_check compare DIR_A DIR_B           same per-step losses (rel diff < 1e-5) and the
//                                              same final parameters within rounding (per tensor
//                                              max|a-b| / max|a| < 3e-5: ranks sum gradients in
//                                              a different order, and 20 Muon steps amplify
//                                              those float32 differences; 8.4e-6 measured)
//
// The recipe: zaya-tiny on a synthetic successor-chain language, 20 steps of 6 sequences
// (divisible by 1, 2 and 3 ranks), checkpoints every 5 steps, an eval at step 10 and 20.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/dist_checkpoint.h"
#include "core/error.h"
#include "dist/comm.h"
#include "model/params.h"
#include "train/trainer.h"
#ifdef ZAYA_CUDA
#include "backend/cuda/cuda_factory.h"
#endif

#include "../common/synthetic_corpus.h"

namespace fs = std::filesystem;
using namespace zaya;

namespace {

bool gpu_present() {
#ifdef ZAYA_CUDA
  return cuda_device_count() > 0;
#else
  return true;  // a CPU build: make_backend reports that CUDA is missing
#endif
}

Recipe recipe(const std::string& dir) {
  Recipe r = test::synthetic_recipe(dir);
  r.seed = 11;
  r.batch.micro_batch = 1;
  r.batch.global_batch = 6;
  r.schedule.total_steps = 20;
  r.checkpoint.every = 5;
  r.checkpoint.keep = 10;
  r.eval.every = 10;
  r.eval.batches = 3;
  r.logging.plot = false;
  return r;
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("step")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

int train_cmd(const std::string& dir, int64_t stop_after, const std::string& backend) {
  if (backend.rfind("cuda", 0) == 0 && !gpu_present()) {
    std::printf("dp_check: skipped: no GPU\n");
    return 0;
  }
  auto comm = make_comm(CommOptions{});
  if (comm->rank() == 0 && !fs::exists(dir + "/train.bin")) {
    fs::create_directories(dir);
    test::write_synthetic_corpus(dir + "/train.bin", 20000, 1);
    test::write_synthetic_corpus(dir + "/val.bin", 4000, 2);
  }
  comm->barrier()->wait();
  TrainOptions opt;
  opt.quiet = true;
  opt.comm = comm.get();
  opt.stop_after_steps = stop_after;
  opt.bucket_bytes = 64 << 10;  // several buckets even for the tiny model
  opt.backend = backend;
  TrainSummary s = train(recipe(dir), opt);
  if (comm->rank() == 0)
    std::printf("dp_check: trained %lld steps with %d ranks, final loss %.6f\n", (long long)s.steps, comm->size(),
                s.final_train_loss);
  return 0;
}

int compare_cmd(const std::string& a, const std::string& b) {
  int bad = 0;
  auto la = losses(a + "/run"), lb = losses(b + "/run");
  if (la.size() != 20 || lb.size() != 20) {
    std::printf("dp_check: expected 20 logged steps, found %zu and %zu\n", la.size(), lb.size());
    return 1;
  }
  double worst_loss = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    double rel = std::fabs(la[i] - lb[i]) / std::fabs(la[i]);
    if (!std::isfinite(rel)) rel = INFINITY;  // a NaN loss fails (std::max would drop it)
    worst_loss = std::max(worst_loss, rel);
    if (!(rel < 1e-5)) {
      std::printf("dp_check: step %zu loss %.9f vs %.9f (rel %.2e)\n", i + 1, la[i], lb[i], rel);
      ++bad;
    }
  }
  auto ca = load_latest_dist_checkpoint(a + "/run/checkpoints"), cb = load_latest_dist_checkpoint(b + "/run/checkpoints");
  if (!ca || !cb || ca->step() != 20 || cb->step() != 20) {
    std::printf("dp_check: missing final checkpoints\n");
    return 1;
  }
  double worst_w = 0;
  int tensors = 0;
  for (const std::string& name : ca->names()) {
    if (ca->group(name) != "params") continue;
    std::vector<float> x(ca->numel(name)), y(cb->numel(name));
    ca->read(name, 0, x.size(), x.data());
    cb->read(name, 0, y.size(), y.data());
    double mx = 0, diff = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      mx = std::max(mx, double(std::fabs(x[i])));
      diff = std::max(diff, double(std::fabs(x[i] - y[i])));
    }
    double rel = mx > 0 ? diff / mx : diff;
    for (size_t i = 0; i < x.size(); ++i)  // std::max above drops a NaN: a non-finite weight fails
      if (!std::isfinite(x[i]) || !std::isfinite(y[i])) rel = INFINITY;
    worst_w = std::max(worst_w, rel);
    if (!(rel < 3e-5)) {
      std::printf("dp_check: tensor %s differs (rel %.2e)\n", name.c_str(), rel);
      ++bad;
    }
    ++tensors;
  }
  std::printf("dp_check: %s vs %s: %zu steps, worst loss rel diff %.2e; %d parameter tensors, worst rel diff %.2e; "
              "saved by %d and %d ranks\n",
              a.c_str(), b.c_str(), la.size(), worst_loss, tensors, worst_w, ca->world_size(), cb->world_size());
  if (bad == 0) std::printf("dp_check: equivalent\n");
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() >= 2 && a[0] == "train") {
      int64_t stop = -1;
      std::string backend = "cpu";
      for (size_t i = 2; i + 1 < a.size(); i += 2) {
        if (a[i] == "--stop-after") stop = std::stoll(a[i + 1]);
        else if (a[i] == "--backend") backend = a[i + 1];
        else throw Error("dp_check", "unknown option " + a[i]);
      }
      return train_cmd(a[1], stop, backend);
    }
    if (a.size() == 3 && a[0] == "compare") return compare_cmd(a[1], a[2]);
    std::fprintf(stderr, "usage: zaya_dp_check train DIR [--stop-after N] [--backend NAME] | compare DIR_A DIR_B\n");
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "dp_check: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
}
