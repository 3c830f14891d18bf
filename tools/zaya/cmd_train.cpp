// `zaya train [--recipe FILE] [--set section.key=value ...]`: with no arguments it trains the
// built-in default recipe (a small ZAYA model on the State of the Union demo corpus). Under
// `mpirun -np N` every process is one data-parallel rank (ZeRO-1 over MPI).
// `zaya export --checkpoint DIR --out HFDIR`: a training checkpoint to an HF model directory.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "ckpt/dist_checkpoint.h"
#include "commands.h"
#include "core/error.h"
#include "dist/comm.h"
#include "model/model_io.h"
#include "supervise/heartbeat.h"
#include "train/trainer.h"
#include "train_options.h"

namespace zaya::cli {

void add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a ZAYA model (no arguments: the built-in default recipe)");
  static TrainCliOptions o;
  static int64_t stop_after = -1;
  add_train_options(cmd, o);
  cmd->add_option("--stop-after", stop_after,
                  "Stop after N steps of this process (checkpointed; rerun to resume)");
  cmd->callback([] {
    CommOptions co;
    co.timeout_s = o.comm_timeout;
    std::unique_ptr<Comm> comm = make_comm(co);
    // Ranks sharing a node split its cores, unless OMP_NUM_THREADS says otherwise.
    if (comm->local_size() > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
      const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
      omp_set_num_threads(std::max(1, cores / comm->local_size()));
    }
    TrainSummary s;
    try {
      Recipe r = resolve_recipe(o.recipe_path, o.overrides);
      TrainOptions opt;
      opt.stop_after_steps = stop_after;
      opt.comm = comm.get();
      opt.bucket_bytes = o.bucket_mb << 20;
      opt.backend = o.backend;
      opt.device_comm = o.device_comm;
      opt.comm_timeout_s = o.comm_timeout;
      if (const char* hb = std::getenv(kHeartbeatDirEnv)) opt.heartbeat_dir = hb;
      s = train(r, opt);
    } catch (const Error& e) {
      if (comm->size() == 1) throw;
      // One rank failing must end the job at once, not leave the others in a collective.
      std::fprintf(stderr, "zaya: rank %d of %d: %s error: %s%s%s\n", comm->rank(), comm->size(),
                   e.component().c_str(), e.message().c_str(), e.hint().empty() ? "" : "\n  hint: ",
                   e.hint().c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
    if (comm->rank() != 0) return;
    std::printf("\nrun directory     %s\n", s.run_dir.c_str());
    std::printf("steps             %lld (%lld tokens)\n", (long long)s.steps, (long long)s.tokens);
    if (std::isfinite(s.final_train_loss))
      std::printf("final train loss  %.4f nats/token\n", s.final_train_loss);
    else
      std::printf("final train loss  n/a (no training step logged)\n");
    if (s.final_val_loss > 0 && s.unigram_baseline > 0)
      std::printf("validation loss   %.4f nats/token (unigram baseline %.4f)\n", s.final_val_loss, s.unigram_baseline);
    else if (s.final_val_loss > 0)
      std::printf("validation loss   %.4f nats/token\n", s.final_val_loss);
    if (std::isfinite(s.final_choice_accuracy))
      std::printf("choice accuracy   %.4f (per byte %.4f) on eval.choices\n", s.final_choice_accuracy,
                  s.final_choice_accuracy_norm);
    if (!s.sample.empty()) std::printf("sample            %s\n", s.sample.c_str());
  });
}

void add_export(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "Export a training checkpoint as a Hugging Face model directory");
  static std::string ckpt, out, dtype = "bf16";
  cmd->add_option("--checkpoint", ckpt, "Checkpoint directory (step-XXXXXXXX) or a run's checkpoints/ root")->required();
  cmd->add_option("--out", out, "Output directory")->required();
  cmd->add_option("--dtype", dtype, "f32 or bf16")->capture_default_str();
  cmd->callback([] {
    std::optional<DistCheckpoint> ck;
    if (std::filesystem::exists(std::filesystem::path(ckpt) / "manifest.json")) ck = open_dist_checkpoint(ckpt);
    else ck = load_latest_dist_checkpoint(ckpt);
    if (!ck) fail("export", "no valid checkpoint under " + ckpt);
    if (!ck->meta().contains("model_config")) fail("export", ck->dir() + ": the manifest has no model_config");
    ModelConfig c = config_from_json(ck->meta()["model_config"], ck->dir() + "/manifest.json");
    auto be = make_cpu_backend();
    Model m(c, *be);
    for (const ParamSpec& p : m.layout().params) ck->read(p.name, p.shape, m.params() + p.offset);
    if (dtype != "f32" && dtype != "bf16") fail("export", "--dtype must be f32 or bf16");
    save_model(m, out, dtype == "f32" ? DType::F32 : DType::BF16);
    std::printf("exported %s (step %lld) to %s\n", ck->dir().c_str(), (long long)ck->step(), out.c_str());
  });
}

}  // namespace zaya::cli
