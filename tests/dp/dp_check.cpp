// Data-parallel equivalence check, run under mpirun (tests/dp/dp_equivalence.sh):
//
//   zaya_dp_check train DIR [--steps N] [--stop-after N] [--backend NAME] [--device-comm] [--cp N]
//                           [--seq-len T] [--batch N] [--phased [--phase-cp N] [--resets] [--sft]]
//                           [--choices]
//                                              trains the fixed tiny recipe into DIR/run with
//                                              however many ranks it was launched with (on the
//                                              GPU: --backend cuda-fp32, scripts/gpu_device_checks.sh;
//                                              --device-comm: gradients reduced on the device over
//                                              NCCL, as `zaya train --device-comm`; --cp N:
//                                              context parallelism in groups of N ranks;
//                                              --seq-len T, --batch N: sequences of T tokens
//                                              instead of 32, N per step instead of 6 (the
//                                              plain recipe);
//                                              --phased: a two-phase curriculum on shards whose
//                                              second phase has context_parallel --phase-cp;
//                                              --resets: with --phased, every document in a
//                                              packed sequence runs as a fresh sequence
//                                              (data.reset_at_document_boundary);
//                                              --sft: with --phased, the second dataset is
//                                              prompt/completion data (a loss mask: the loss
//                                              and gradients are means over its completions);
//                                              --choices: [eval] choices scores 7 questions at
//                                              every evaluation, split over the ranks, and rank 0
//                                              checks the last accuracy against one process
//                                              scoring the exported model)
//   zaya_dp_check compare DIR_A DIR_B [--steps N] [--weight-tol X]
//                                              same per-step losses (rel diff < 1e-5) and the
//                                              same final parameters within rounding (per tensor
//                                              max|a-b| / max|a| < 3e-5: ranks sum gradients in
//                                              a different order, and 20 Muon steps amplify
//                                              those float32 differences; 8.4e-6 measured).
//                                              --weight-tol X replaces 3e-5: context parallelism
//                                              also sums each key's attention gradient from
//                                              per-chunk parts, and AdamW's first, sign-like
//                                              updates turn rounding in near-zero gradients
//                                              (conv weights, embedding rows) into lr-sized
//                                              differences: 3.0e-5 measured after 20 steps,
//                                              4.4e-5 after 5; cp_equivalence.sh passes 1e-4
//                                              (the per-step gradients themselves agree within
//                                              3e-6: tests/unit/test_context_parallel.cpp)
//
// The recipe: zaya-tiny on a synthetic successor-chain language, 20 steps (--steps: the host
// emulation of the GPU runs 10) of 6 sequences (divisible by 1, 2 and 3 ranks), checkpoints every
// 5 steps, an eval every 10.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ckpt/dist_checkpoint.h"
#include "core/error.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "eval/multiple_choice.h"
#include "model/model_io.h"
#include "model/params.h"
#include "train/trainer.h"
#ifdef ZAYA_CUDA
#include "backend/cuda/cuda_factory.h"
#endif
#ifdef ZAYA_SIMT
#include "simt_register.h"  // zaya_simt_dp_check: the GPU paths on the host emulation of the GPU
#endif

#include "../common/small_tokenizer.h"
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

Recipe recipe(const std::string& dir, int64_t steps) {
  Recipe r = test::synthetic_recipe(dir);
  r.seed = 11;
  r.batch.micro_batch = 1;
  r.batch.global_batch = 6;
  r.schedule.total_steps = steps;
  r.checkpoint.every = 5;
  r.checkpoint.keep = 10;
  r.eval.every = 10;
  r.eval.batches = 3;
  r.logging.plot = false;
  return r;
}

// --phased: two shard datasets and a curriculum: phase "short" (4 steps of 8 sequences of 16
// tokens) then "long" (32 tokens, a mixture of both) to the end; --phase-cp N sets the long
// phase's context_parallel (a layout change at step 5, as ZAYA1's 32K phase).
// sft: b is prompt/completion data, mixed into both phases.
Recipe phased_recipe(const std::string& dir, int64_t steps, int64_t phase_cp, bool sft) {
  Recipe r = recipe(dir, steps);
  r.batch.global_batch = 8;
  r.data.datasets = {{"a", dir + "/a"}, {"b", dir + "/b"}};
  r.phases = {{"short", 4 * 8 * 16, 16, {{"a", 1.0}}, 0, 1.0}, {"long", 0, 32, {{"a", 1.0}, {"b", 3.0}}, 5e4, 0.5}};
  if (sft) r.phases[0].mixture.push_back({"b", 1.0});
  r.phases[1].context_parallel = phase_cp;
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

struct TrainFlags {
  int64_t steps = 20, stop_after = -1, context_parallel = 1, phase_cp = 0, seq_len = 0, batch = 0;
  std::string backend = "cpu";
  bool device_comm = false, phased = false, choices = false, resets = false, sft = false;
};

// --choices: a small SentencePiece tokenizer (its ids need a 512-id vocabulary, which the token
// files then declare) and 7 questions in its words: 3 + 2 + 2 per rank on 3 ranks, 4 + 3 on 2.
void write_choice_files(const std::string& dir) {
  for (const std::string& path : {dir + "/train.bin", dir + "/val.bin"}) {
    TokenFile f = read_token_file(path);
    f.vocab_size = 512;
    write_token_file(path, f);
  }
  test::train_small_tokenizer(dir + "/tok");
  std::ofstream out(dir + "/questions.jsonl");
  const char* lines[] = {
      R"({"context": "The cat sat on the", "choices": [" mat", " park"], "answer": 0})",
      R"({"context": "A dog ran in the", "choices": [" park", " mat", " south"], "answer": 0})",
      R"({"context": "Birds fly", "choices": [" south", " mat"], "answer": 0})",
      R"({"context": "The dog sat on", "choices": [" the mat", " south"], "answer": 0})",
      R"({"context": "A cat ran", "choices": [" in the park", " fly"], "answer": 1})",
      R"({"context": "Birds sat on the", "choices": [" dog", " mat", " cat"], "answer": 1})",
      R"({"context": "The", "choices": [" cat", " birds"], "answer": 0})"};
  for (const char* line : lines) out << line << '\n';
}

// The accuracy the ranks measured together at the last step against rank 0 scoring every
// question alone with the exported model (the same weights): the counts of the ranks' shards
// must add up to exactly the whole set's.
int check_choices(const Recipe& r, const TrainSummary& s, const std::string& backend) {
  auto be = make_backend(backend);
  auto model = load_model(r.run_dir + "/model", *be);
  auto tok = load_tokenizer(r.data.tokenizer);
  const MultipleChoiceResult whole =
      evaluate_multiple_choice(*model, *tok, load_choice_questions(r.eval.choices));
  std::printf(
      "dp_check: multiple choice: the ranks measured accuracy %.6f (per byte %.6f); one process scores the "
      "final model %.6f (%.6f) over %lld questions\n",
      s.final_choice_accuracy, s.final_choice_accuracy_norm, whole.accuracy, whole.accuracy_norm,
      (long long)whole.questions);
  return whole.accuracy == s.final_choice_accuracy && whole.accuracy_norm == s.final_choice_accuracy_norm ? 0
                                                                                                          : 1;
}

int train_cmd(const std::string& dir, const TrainFlags& f) {
  if (f.backend.rfind("cuda", 0) == 0 && !gpu_present()) {
    std::printf("dp_check: skipped: no GPU\n");
    return 0;
  }
  auto comm = make_comm(CommOptions{});
  if (comm->rank() == 0) {
    if (!fs::exists(dir + "/train.bin")) {
      fs::create_directories(dir);
      test::write_synthetic_corpus(dir + "/train.bin", 20000, 1);
      test::write_synthetic_corpus(dir + "/val.bin", 4000, 2);
      if (f.phased) test::write_synthetic_shard_datasets(dir, f.sft);
    }
    if (f.choices && !fs::exists(dir + "/questions.jsonl")) write_choice_files(dir);
  }
  comm->barrier()->wait();
  TrainOptions opt;
  opt.quiet = true;
  opt.comm = comm.get();
  opt.stop_after_steps = f.stop_after;
  opt.bucket_bytes = 64 << 10;  // several buckets even for the tiny model
  opt.backend = f.backend;
  opt.device_comm = f.device_comm;
  Recipe r = f.phased ? phased_recipe(dir, f.steps, f.phase_cp, f.sft) : recipe(dir, f.steps);
  r.parallel.context_parallel = f.context_parallel;
  if (f.seq_len > 0) r.data.seq_len = f.seq_len;
  if (f.batch > 0) r.batch.global_batch = f.batch;
  r.data.reset_at_document_boundary = f.resets;
  if (f.choices) {
    r.data.tokenizer = dir + "/tok.model";
    r.eval.choices = dir + "/questions.jsonl";
  }
  TrainSummary s = train(r, opt);
  if (comm->rank() == 0)
    std::printf("dp_check: trained %lld steps (%lld context parallel) with %d ranks over %s, final loss %.6f\n",
                (long long)s.steps, (long long)s.context_parallel_steps, comm->size(), s.data_comm.c_str(),
                s.final_train_loss);
  if (f.device_comm && comm->size() > 1 && s.data_comm != "nccl") {
    std::printf("dp_check: --device-comm was asked for, but the gradients went over '%s'\n", s.data_comm.c_str());
    return 1;
  }
  if (f.choices && f.stop_after < 0 && comm->rank() == 0) return check_choices(r, s, f.backend);
  return 0;
}

int compare_cmd(const std::string& a, const std::string& b, int64_t steps, double weight_tol) {
  int bad = 0;
  auto la = losses(a + "/run"), lb = losses(b + "/run");
  if (int64_t(la.size()) != steps || int64_t(lb.size()) != steps) {
    std::printf("dp_check: expected %lld logged steps, found %zu and %zu\n", (long long)steps, la.size(), lb.size());
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
  if (!ca || !cb || ca->step() != steps || cb->step() != steps) {
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
    if (!(rel < weight_tol)) {
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
#ifdef ZAYA_SIMT
  simt::register_emulated_gpu();
#endif
  try {
    std::vector<std::string> a(argv + 1, argv + argc);
    // --steps N anywhere after the command (default 20)
    int64_t steps = 20;
    for (size_t i = 1; i + 1 < a.size(); ++i)
      if (a[i] == "--steps") {
        steps = std::stoll(a[i + 1]);
        if (steps < 1) throw Error("dp_check", "--steps must be at least 1");
        a.erase(a.begin() + std::ptrdiff_t(i), a.begin() + std::ptrdiff_t(i) + 2);
        break;
      }
    if (a.size() >= 2 && a[0] == "train") {
      TrainFlags f;
      f.steps = steps;
      for (size_t i = 2; i < a.size(); ++i) {
        if (a[i] == "--device-comm" || a[i] == "--phased" || a[i] == "--choices" || a[i] == "--resets" ||
            a[i] == "--sft") {
          (a[i] == "--phased"    ? f.phased
           : a[i] == "--choices" ? f.choices
           : a[i] == "--resets"  ? f.resets
           : a[i] == "--sft"     ? f.sft
                                 : f.device_comm) = true;
          continue;
        }
        if (i + 1 >= a.size()) throw Error("dp_check", "option " + a[i] + " needs a value");
        if (a[i] == "--stop-after")
          f.stop_after = std::stoll(a[i + 1]);
        else if (a[i] == "--backend")
          f.backend = a[i + 1];
        else if (a[i] == "--cp")
          f.context_parallel = std::stoll(a[i + 1]);
        else if (a[i] == "--phase-cp")
          f.phase_cp = std::stoll(a[i + 1]);
        else if (a[i] == "--seq-len")
          f.seq_len = std::stoll(a[i + 1]);
        else if (a[i] == "--batch")
          f.batch = std::stoll(a[i + 1]);
        else throw Error("dp_check", "unknown option " + a[i]);
        ++i;
      }
      return train_cmd(a[1], f);
    }
    // --weight-tol X (default 3e-5; see the header)
    double weight_tol = 3e-5;
    if (a.size() == 5 && a[0] == "compare" && a[3] == "--weight-tol") {
      weight_tol = std::stod(a[4]);
      a.resize(3);
    }
    if (a.size() == 3 && a[0] == "compare") return compare_cmd(a[1], a[2], steps, weight_tol);
    std::fprintf(
        stderr,
        "usage: zaya_dp_check train DIR [--steps N] [--stop-after N] [--backend NAME] "
        "[--device-comm] [--cp N] [--phased [--phase-cp N] [--resets] [--sft]] [--choices] | compare DIR_A "
        "DIR_B [--steps N] [--weight-tol X]\n");
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "dp_check: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
}
