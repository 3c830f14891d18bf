// The training loop (see trainer.h): one process or many (MPI data parallelism with ZeRO-1).
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "ckpt/dist_checkpoint.h"
#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "eval/multiple_choice.h"
#include "model/context_parallel.h"
#include "model/model_io.h"
#include "serve/generate.h"
#include "supervise/heartbeat.h"
#include "train/balancer.h"
#include "train/data_parallel.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/train_checkpoint.h"
#include "train/train_data.h"
#include "train/train_support.h"

namespace zaya {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double elapsed_seconds(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

std::string fmt_duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) / 60) % 60);
  return buf;
}

// Builds the model config from the recipe (preset or config.json), sized to the vocabulary.
ModelConfig model_config(const Recipe& r, int64_t data_vocab, int64_t max_seq_len) {
  ModelConfig c = !r.model.config.empty() ? load_config_file(r.model.config) : preset_config(r.model.preset);
  if (r.model.vocab_size > 0) c.vocab_size = r.model.vocab_size;
  else if (data_vocab > 0 && r.model.config.empty()) c.vocab_size = data_vocab;
  c.skip_expert_output = r.model.skip_expert_output == "zero" ? SkipMode::Zero : SkipMode::Identity;
  c.max_position_embeddings = std::max(c.max_position_embeddings, max_seq_len);
  validate_config(c, "recipe model");
  if (data_vocab > c.vocab_size)
    fail("train", "the training data uses " + std::to_string(data_vocab) + " token ids but the model vocabulary has " +
                      std::to_string(c.vocab_size), "set model.vocab_size or use a matching tokenizer");
  return c;
}

OptimizerConfig optimizer_config(const Recipe& r) {
  OptimizerConfig oc;
  oc.lr = r.optimizer.lr;
  oc.weight_decay = r.optimizer.weight_decay;
  oc.muon_momentum = r.optimizer.muon_momentum;
  oc.nesterov = r.optimizer.nesterov;
  oc.ns_steps = int(r.optimizer.ns_steps);
  oc.adam_beta1 = r.optimizer.adam_beta1;
  oc.adam_beta2 = r.optimizer.adam_beta2;
  oc.adam_eps = r.optimizer.adam_eps;
  return oc;
}

LrSchedule lr_schedule(const Recipe& r) {
  LrSchedule lrs;
  lrs.shape = parse_lr_shape(r.schedule.kind);
  lrs.peak = r.optimizer.lr;
  lrs.warmup_steps = r.schedule.warmup_steps;
  lrs.total_steps = r.schedule.total_steps;
  lrs.min_lr_ratio = r.schedule.min_lr_ratio;
  lrs.decay_fraction = r.schedule.decay_fraction;
  lrs.validate();
  return lrs;
}

}  // namespace

TrainSummary train(const Recipe& recipe, const TrainOptions& opt) {
  const Recipe& r = recipe;
  std::unique_ptr<Comm> own_comm;
  Comm* comm_ptr = opt.comm;
  if (!comm_ptr) {
    own_comm = make_single_comm();
    comm_ptr = own_comm.get();
  }
  Comm& comm = *comm_ptr;
  const int rank = comm.rank(), ranks = comm.size();
  // Heartbeats for a supervisor (`zaya launch`): "start" now, then one per phase and step.
  HeartbeatWriter heartbeat(opt.heartbeat_dir, rank, ranks);
  heartbeat.beat("start", 0, r.schedule.total_steps);
  // The backend first: a GPU that is missing fails before anything is read or written.
  const int device = comm.local_rank();
  auto be = make_backend(opt.backend, device);
  // Context parallelism: groups of consecutive ranks share each sequence; each group is one
  // data-parallel rank (data_rank of data_ranks) of the global data stream. The group size may
  // differ between phases (ZAYA1 used it for its 32K phase only): the layout follows the phase.
  // Its exchanges go over the job's communicator, staged through host memory on a GPU.
  std::unique_ptr<ContextParallel> cp;
  int64_t cp_size = 0;
  int data_rank = rank, data_ranks = ranks;
  auto set_layout = [&](int64_t size) {
    cp = size > 1 ? std::make_unique<ContextParallel>(comm, int(size), *be) : nullptr;
    cp_size = size;
    data_rank = cp ? cp->group() : rank;
    data_ranks = cp ? cp->groups() : ranks;
  };
  // Every phase's layout is checked now, not when its phase begins.
  std::vector<int64_t> layouts;  // group sizes of the phases, in phase order
  for (size_t p = 0; p < std::max<size_t>(r.phases.size(), 1); ++p) layouts.push_back(context_parallel_of(r, p));
  auto layout_key = [&](size_t p) {  // the recipe key that sets phase p's group size
    return p < r.phases.size() && r.phases[p].context_parallel > 0
               ? "phases[" + std::to_string(p) + "].context_parallel"
               : std::string("parallel.context_parallel");
  };
  for (size_t p = 0; p < layouts.size(); ++p)
    if (ranks % layouts[p] != 0)
      fail("train", layout_key(p) + " = " + std::to_string(layouts[p]) + " does not divide the " +
                        std::to_string(ranks) + " ranks of the job",
           "launch a multiple of it (mpirun -np N)");
  set_layout(layouts.front());
  const bool lead = rank == 0;  // rank 0 logs, writes the run directory and exports
  TrainSummary sum;
  sum.run_dir = r.run_dir;
  const std::string ckpt_dir = checkpoint_dir(r);
  if (lead) {
    fs::create_directories(r.run_dir);
    std::ofstream(r.run_dir + "/recipe.toml") << recipe_to_toml(r);
  }
  auto log = [&](const std::string& s) {
    if (!opt.quiet && lead) log::info(s);
  };

  // ---- batch, data, tokenizer, model ----
  const int64_t micro = r.batch.micro_batch;
  int64_t granularity = micro;  // a multiple of micro x data-parallel ranks in every layout
  for (int64_t size : layouts) {
    const int64_t g = micro * (ranks / size);
    if (r.batch.global_batch % g != 0 || (r.batch.ramp_start > 0 && r.batch.ramp_start % g))
      fail("train", "batch.global_batch (" + std::to_string(r.batch.global_batch) + ") and batch.ramp_start must be " +
                        "multiples of batch.micro_batch x data-parallel ranks (" + std::to_string(micro) + " x " +
                        std::to_string(ranks / size) + (size > 1 ? " = ranks / context_parallel" : "") + ")",
           "every rank runs the same number of micro-batches per step");
    granularity = std::lcm(granularity, g);
  }
  BatchRamp ramp;
  ramp.start_sequences = r.batch.ramp_start;
  ramp.full_sequences = r.batch.global_batch;
  ramp.ramp_steps = r.batch.ramp_steps;
  ramp.granularity = granularity;
  ramp.validate();
  auto data = std::make_unique<TrainData>(r, data_rank, data_ranks, ramp);
  std::unique_ptr<Tokenizer> tok;
  if (!r.data.tokenizer.empty() && fs::exists(r.data.tokenizer)) tok = load_tokenizer(r.data.tokenizer);
  std::vector<ChoiceQuestion> choice_questions;
  if (!r.eval.choices.empty()) {
    if (!tok)
      fail("train",
           "eval.choices needs a tokenizer, and data.tokenizer (" + r.data.tokenizer + ") is not a file");
    try {
      choice_questions = load_choice_questions(r.eval.choices);
    } catch (const Error& e) {
      fail("train", std::string("eval.choices: ") + e.what());
    }
  }
  if (opt.backend != "cpu") log("backend: " + be->name() + " (rank 0 on device " + std::to_string(device) + ")");
  std::unique_ptr<Model> model;
  if (!r.model.init_from.empty()) {
    model = load_model(r.model.init_from, *be);
  } else {
    model = std::make_unique<Model>(model_config(r, data->vocab_size(), data->max_seq_len()), *be);
    model->init_random(uint64_t(r.seed));
  }
  model->set_activation_recompute(r.batch.recompute_activations);
  sum.activation_recompute = model->activation_recompute();
  const ModelConfig& c = model->config();
  // Every chunk must hold the rows the CCA convolution carries into the next one.
  for (size_t p = 0; p < layouts.size(); ++p)
    if (layouts[p] > 1 && data->phase(p).seq_len / (2 * layouts[p]) < c.conv_state_rows())
      fail("train", layout_key(p) + " = " + std::to_string(layouts[p]) + " cuts sequences of " +
                        std::to_string(data->phase(p).seq_len) + " tokens into chunks shorter than the " +
                        std::to_string(c.conv_state_rows()) + " rows the CCA convolution carries",
           "use longer sequences or a smaller context_parallel");
  const double base_theta_full = c.rope_hybrid.theta, base_theta_sliding = c.rope_sliding.theta;
  const ParamLayout& layout = model->layout();
  ParamCounts pc = count_params(c);
  log("model: " + std::to_string(pc.total) + " parameters (" + std::to_string(pc.active) +
      " active/token non-embedding), " + std::to_string(c.num_hidden_layers) + " blocks, " +
      std::to_string(c.num_experts) + " experts, vocab " + std::to_string(c.vocab_size) +
      (model->activation_recompute() ? "; activations recomputed in the backward" : ""));
  log("data: " + data->describe());

  // ---- data parallelism, optimizer, balancer, schedule ----
  DataParallelOptions dpo;
  dpo.bucket_bytes = opt.bucket_bytes;
  dpo.backend = be.get();
  std::unique_ptr<Comm> device_comm;
  if (opt.device_comm && ranks > 1) {
    if (opt.backend == "cpu") fail("train", "--device-comm needs a GPU backend (--backend cuda)");
    CommOptions co;
    co.timeout_s = opt.comm_timeout_s;
    device_comm = make_device_comm(comm, device, co);
    dpo.data_comm = device_comm.get();
  }
  DataParallel dp(comm, layout, int(r.optimizer.ns_steps), dpo);
  sum.data_comm = device_comm ? device_comm->name() : comm.name();
  if (ranks > 1)
    log("data parallel: " + std::to_string(ranks) + " ranks over " + (device_comm ? device_comm->name() : comm.name()) +
        ", ZeRO-1 (whole tensors by " +
        "Newton-Schulz cost), " + std::to_string(dp.buckets()) + " gradient buckets of <= " +
        std::to_string(dpo.bucket_bytes >> 20) + " MiB");
  if (cp)
    log("context parallel: " + std::to_string(data_ranks) + " group" + (data_ranks > 1 ? "s" : "") + " of " +
        std::to_string(cp->size()) + " ranks; every sequence in " + std::to_string(2 * cp->size()) +
        " zig-zag chunks, K/V gathered per layer");
  if (std::any_of(layouts.begin(), layouts.end(), [&](int64_t size) { return size != layouts.front(); })) {
    std::string sizes;
    for (size_t p = 0; p < layouts.size(); ++p)
      sizes += (p ? ", " : "") + data->phase(p).name + " " + std::to_string(layouts[p]);
    log("context parallel group size by phase: " + sizes);
  }
  Optimizer optim(layout, optimizer_config(r), *be, dp.owned_mask());
  BalancerConfig bc;
  bc.lr = r.balancer.lr;
  bc.beta1 = r.balancer.beta1;
  bc.beta2 = r.balancer.beta2;
  bc.balance_skip = r.balancer.balance_skip;
  BiasBalancer balancer(layout, bc, *be);
  if (lead) {
    if (!opt.quiet) std::fprintf(stderr, "%s", optim.routing_table().c_str());
    std::ofstream(r.run_dir + "/routing.txt") << optim.routing_table();
  }
  const LrSchedule lrs = lr_schedule(r);

  float* grads = be->alloc(layout.total);
  struct GradsFree {
    Backend& be;
    float* p;
    ~GradsFree() { be.free(p); }
  } grads_free{*be, grads};

  // ---- checkpoints ----
  TrainState state{*model, optim, balancer, dp};
  int64_t step = 0, tokens_seen = 0, bad_streak = 0;
  DistWriterOptions wo;
  // While training steps run, a background save's commit (the part of a poll() that waits on the
  // disk) is announced as the "checkpoint" phase; the polls that find the files still being
  // written stay in the step phase, so a hang there is still caught by the step timeout.
  bool commit_beats = false;
  wo.before_commit = [&] {
    if (commit_beats) heartbeat.beat("checkpoint", step, r.schedule.total_steps);
  };
  // Staging holds this rank's whole shard, so a save blocks training only for the copy into it
  // (with less, begin_save waits for the disk: docs/benchmarks.md, "Checkpoint stall"). The
  // writer stages in fixed-size chunks and a piece's last chunk takes a whole one, so the budget
  // is the shard rounded up per piece; small chunks keep that rounding small.
  wo.keep_last = int(r.checkpoint.keep);
  wo.chunk_bytes = uint64_t(256) << 10;
  uint64_t staging = 0;
  for (const DistPiece& p : owned_pieces(state))
    staging += (p.length * 4 + wo.chunk_bytes - 1) / wo.chunk_bytes * wo.chunk_bytes;
  wo.staging_bytes = std::max<uint64_t>(staging, wo.chunk_bytes);
  wo.copy = state_copy_fn(state, *be);
  DistCheckpointWriter writer(comm, wo);
  std::vector<double> recent_losses;
  auto save = [&](const char* why) {
    nlohmann::json meta;
    meta["step"] = step;
    meta["tokens_seen"] = tokens_seen;
    meta["sample_cursor"] = ramp.sequences_before(step);
    meta["bad_streak"] = bad_streak;
    meta["recent_losses"] = recent_losses;
    meta["recipe"] = recipe_to_toml(r);
    meta["model_config"] = config_to_json(model->config());
    meta["why"] = why;
    meta["ranks"] = ranks;
    meta["counters"] = all_counters(state);
    const std::string cursor = data->cursor_json();
    if (!cursor.empty()) meta["loader_cursor"] = cursor;
    heartbeat.beat("checkpoint", step, r.schedule.total_steps);
    DistSaveStats st = writer.begin_save(ckpt_dir, step, owned_pieces(state), meta);
    // The rest of the save runs in the background: training, and its heartbeat timeout, resume.
    heartbeat.beat("step", step, r.schedule.total_steps);
    log("checkpoint step " + std::to_string(step) + " (" + why + "): " + std::to_string(st.bytes >> 20) +
        " MiB per rank staged in " + std::to_string(st.begin_seconds).substr(0, 5) + " s, writing in the background");
  };
  auto restore = [&](const DistCheckpoint& ck, bool restore_cursor) {
    restore_state(state, ck, comm);
    if (restore_cursor) {
      const nlohmann::json& m = ck.meta();
      step = m.at("step").get<int64_t>();
      tokens_seen = m.at("tokens_seen").get<int64_t>();
      bad_streak = m.at("bad_streak").get<int64_t>();
      recent_losses = m.at("recent_losses").get<std::vector<double>>();
      data->seek(step, ramp.sequences_before(step), m.value("loader_cursor", std::string()));
    }
  };
  DistLoadOptions lo;
  lo.warn = [&](const std::string& w) {
    if (lead) log::warn(w);
  };
  bool resumed = false;
  if (auto ck = load_latest_dist_checkpoint(ckpt_dir, comm, lo)) {
    restore(*ck, true);
    resumed = true;
    log("resumed from " + ck->dir() + " at step " + std::to_string(step) + " (saved by " +
        std::to_string(ck->world_size()) + " rank" + (ck->world_size() > 1 ? "s" : "") + ")");
  }

  // ---- throughput accounting ----
  const bool backend_has_peak = be->matmul_peak_gflops() > 0;
  MatmulPeak peak([&be, backend_has_peak] {
    return backend_has_peak ? be->matmul_peak_gflops() : measure_sgemm_gflops();
  });
  log(std::string(backend_has_peak ? "measured " + be->name() + " matmul peak " : "measured sgemm peak ") +
      std::to_string(int(peak.gflops())) + " GFLOP/s per process; " +
      std::to_string(int(training_flops_per_token(c, data->phase(0).seq_len) / 1e6)) +
      " MFLOP per trained token");

  std::unique_ptr<MetricsLog> metrics;
  if (lead) metrics = std::make_unique<MetricsLog>(r.run_dir + "/metrics.jsonl", resumed);
  LossCurve curve;
  curve.baseline = data->unigram_baseline();
  sum.unigram_baseline = curve.baseline;
  if (resumed && lead) reload_curve(r.run_dir + "/metrics.jsonl", step, &curve);

  const bool tty = isatty(2) && !opt.quiet && lead;
  auto t_start = clock_type::now();
  int64_t steps_this_run = 0;
  double last_loss = NAN, last_val = NAN, last_choice_acc = NAN, last_choice_acc_norm = NAN;
  // A run resumed at its last step trains nothing here: the last logged training loss stands.
  if (!curve.train_loss.empty()) last_loss = curve.train_loss.back();
  size_t phase = 0;
  TrainMicroBatch mb;
  std::vector<int64_t> counts;
  while (step < r.schedule.total_steps) {
    if (opt.stop_after_steps >= 0 && steps_this_run >= opt.stop_after_steps) break;
    auto t_step = clock_type::now();
    const int64_t batch = ramp.at(step);
    const int64_t first_sample = ramp.sequences_before(step);
    // The step's first micro-batch names its phase; a phase with another context-parallel group
    // size changes the data-parallel layout, and the data stream is reopened for it at this step
    // (a step boundary, where the stream is the same for any number of ranks).
    data->next(step, first_sample, 0, mb);
    phase = size_t(mb.phase);
    if (const int64_t want = context_parallel_of(r, phase); want != cp_size) {
      const int64_t was = cp_size;
      set_layout(want);
      data = std::make_unique<TrainData>(r, data_rank, data_ranks, ramp);
      data->seek(step, first_sample, "");
      data->next(step, first_sample, 0, mb);
      log("step " + std::to_string(step) + ": phase " + data->phase(phase).name + " trains with context_parallel " +
          std::to_string(want) + " (was " + std::to_string(was) + "): " + std::to_string(data_ranks) +
          " data-parallel rank" + (data_ranks > 1 ? "s" : ""));
    }
    {
      const PhaseSpec& ph = data->phase(phase);
      model->set_rope_theta(ph.rope_theta > 0 ? ph.rope_theta : base_theta_full,
                            ph.rope_theta > 0 ? ph.rope_theta : base_theta_sliding);
    }
    const int64_t micro_batches = batch / (micro * data_ranks);
    be->fill(grads, 0.0f, layout.total);
    double sums[2] = {0, 0};  // loss sum, counted tokens (this rank, then all)
    int64_t step_tokens = 0;
    counts.assign(size_t(c.num_hidden_layers * (c.num_experts + 1)), 0);
    for (int64_t m = 0; m < micro_batches; ++m) {
      if (m > 0) data->next(step, first_sample, m, mb);
      const bool last = m + 1 == micro_batches;
      if (last) dp.begin_step(grads);
      std::function<void(int64_t)> block_done;
      if (last && ranks > 1) block_done = [&](int64_t l) { dp.block_done(l); };
      const float loss_scale = 1.0f / float(batch * mb.seq_len);  // the global batch's token count
      StepStats st;
      if (cp) {  // this rank's two chunks of every sequence
        const std::vector<int32_t> ids = cp->split(mb.inputs.data(), mb.rows, mb.seq_len),
                                   targets = cp->split(mb.targets.data(), mb.rows, mb.seq_len);
        // Document starts are positions within the whole sequence, which the chunks keep.
        const std::vector<int32_t> starts = mb.segment_start.empty()
                                                ? std::vector<int32_t>()
                                                : cp->split(mb.segment_start.data(), mb.rows, mb.seq_len);
        st = model->forward_backward(ids.data(), targets.data(), 2 * mb.rows, cp->chunk_len(mb.seq_len),
                                     grads, loss_scale, starts.empty() ? nullptr : starts.data(), block_done,
                                     cp.get());
      } else {
        st = model->forward_backward(mb.inputs.data(), mb.targets.data(), mb.rows, mb.seq_len, grads, loss_scale,
                                     mb.segment_start.empty() ? nullptr : mb.segment_start.data(), block_done);
      }
      sums[0] += st.loss_sum;
      sums[1] += double(st.tokens);
      step_tokens += mb.rows * mb.seq_len;
      for (size_t i = 0; i < counts.size(); ++i) counts[i] += st.expert_counts[i];
    }
    dp.finish_gradients();
    dp.sum(sums, 2);
    dp.sum(counts.data(), int64_t(counts.size()));
    // The loss and gradient are means over the targets counted on every rank (supervised
    // fine-tuning data counts only its completions; docs/training.md, "The step").
    const bool no_targets = sums[1] == 0;
    const double loss = no_targets ? NAN : sums[0] / sums[1];
    const StepGradScale gs = step_grad_scale(std::sqrt(dp.grad_sum_squares(*be, grads)), sums[1],
                                             double(batch) * double(mb.seq_len), r.optimizer.clip_grad_norm);
    const double gnorm = gs.norm;
    step_tokens *= data_ranks;  // the ranks of a context group train the same sequences
    if (cp) ++sum.context_parallel_steps;
    // Loss-spike / NaN policy (every rank sees the same global values, so all decide alike).
    double median = recent_losses.empty() ? loss : median_of(recent_losses);
    const bool bad = !no_targets && (!std::isfinite(loss) || !std::isfinite(gnorm) ||
                                     (recent_losses.size() >= 5 && loss > r.stability.spike_factor * median));
    const double lr = lrs.at(step) * data->phase(phase).lr_scale;
    nlohmann::json rec;
    if (no_targets) {
      // Not a fault: the data had nothing to train here. No update, and no bad-step count.
      rec["event"] = "no_targets";
      log("step " + std::to_string(step) +
          ": no training targets (every position of the step's batch is masked as a prompt): update skipped");
    } else if (bad) {
      ++bad_streak;
      rec["event"] = "bad_step";
      log("step " + std::to_string(step) + ": bad step (loss " + std::to_string(loss) + ", median " +
          std::to_string(median) + ", grad norm " + std::to_string(gnorm) + "): update skipped");
      if (r.stability.policy == "rollback" && bad_streak >= r.stability.max_bad_steps) {
        heartbeat.beat("checkpoint", step, r.schedule.total_steps);
        writer.finish();
        if (auto ck = load_latest_dist_checkpoint(ckpt_dir, comm, lo)) {
          restore(*ck, false);
          log("rolled back parameters and optimizer state to " + ck->dir() + " after " +
              std::to_string(bad_streak) + " bad steps; continuing with fresh data from step " + std::to_string(step));
          rec["event"] = "rollback";
        }
        bad_streak = 0;
      }
    } else {
      bad_streak = 0;
      if (gs.scale != 1.0)
        for (size_t i = 0; i < layout.params.size(); ++i)
          if (dp.owns(i))
            be->scale_inplace(grads + layout.params[i].offset, float(gs.scale), layout.params[i].numel);
      optim.step(model->params(), grads, float(lr));
      dp.gather_parameters(model->params());
      balancer.step(counts, model->params());
      recent_losses.push_back(loss);
      if (recent_losses.size() > 50) recent_losses.erase(recent_losses.begin());
    }
    tokens_seen += step_tokens;
    ++step;
    ++steps_this_run;
    if (!no_targets) last_loss = loss;
    const double dt = elapsed_seconds(t_step);
    const double tok_s = double(step_tokens) / dt;
    const int64_t T = data->phase(phase).seq_len;
    std::string peak_news;
    const double mfu = peak.utilisation(training_flops_per_token(c, T) * tok_s / ranks, &peak_news);
    if (!peak_news.empty() && lead) log::warn(peak_news);
    rec["step"] = step;
    if (!no_targets) rec["loss"] = loss;
    rec["lr"] = lr;
    rec["grad_norm"] = gnorm;
    rec["tokens"] = tokens_seen;
    rec["tok_per_s"] = tok_s;
    rec["mfu"] = mfu;
    rec["batch"] = batch;
    rec["seq_len"] = T;
    // GPU backends: the most device memory this process has held so far (the CPU's is not tracked).
    const double device_gib = double(be->peak_memory_bytes()) / double(int64_t(1) << 30);
    if (device_gib > 0) rec["device_memory_gib"] = device_gib;
    if (data->phases() > 1) rec["phase"] = data->phase(phase).name;
    rec["balance"] = balancer_record(balancer);
    const bool do_eval = r.eval.every > 0 && (step % r.eval.every == 0 || step == r.schedule.total_steps);
    if (do_eval) {
      heartbeat.beat("eval", step, r.schedule.total_steps);
      last_val = data->evaluate(*model, phase, dp);
      rec["val_loss"] = last_val;
      curve.val_steps.push_back(double(step));
      curve.val_loss.push_back(last_val);
      if (!choice_questions.empty()) {
        MultipleChoiceOptions mo;
        mo.max_questions = r.eval.choices_max;
        mo.shard = dp.rank();
        mo.shards = dp.ranks();
        const MultipleChoiceResult mc = evaluate_multiple_choice(*model, *tok, choice_questions, mo);
        double counts[3] = {double(mc.questions), double(mc.correct), double(mc.correct_norm)};
        dp.sum(counts, 3);
        last_choice_acc = counts[1] / counts[0];
        last_choice_acc_norm = counts[2] / counts[0];
        rec["choice_acc"] = last_choice_acc;
        rec["choice_acc_norm"] = last_choice_acc_norm;
        rec["choice_acc_stderr"] = proportion_stderr(last_choice_acc, int64_t(counts[0]));
      }
    }
    if (metrics && r.logging.metrics) metrics->write(rec);
    curve.steps.push_back(double(step));
    curve.train_loss.push_back(loss);
    if (!opt.quiet && lead && (tty || step % r.logging.every == 0 || do_eval)) {
      const double elapsed = elapsed_seconds(t_start);
      const double eta = elapsed / double(steps_this_run) * double(r.schedule.total_steps - step);
      char memory[48] = "";  // the most device memory held so far (GPU backends)
      if (device_gib > 0) std::snprintf(memory, sizeof memory, " | mem %.1f GiB", device_gib);
      char line[320];
      std::snprintf(
          line, sizeof line,
          "step %lld/%lld | loss %.4f%s%s | lr %.2e | gnorm %.2f | %.0f tok/s | MFU %.1f%%%s | ETA %s%s",
          (long long)step, (long long)r.schedule.total_steps, loss,
          do_eval ? (" | val " + std::to_string(last_val).substr(0, 6)).c_str() : "",
          do_eval && !choice_questions.empty()
              ? (" | acc " + std::to_string(last_choice_acc).substr(0, 5)).c_str()
              : "",
          lr, gnorm, tok_s, 100 * mfu, memory, fmt_duration(eta).c_str(),
          data->phases() > 1 ? (" | " + data->phase(phase).name).c_str() : "");
      if (tty) std::fprintf(stderr, "\r\033[K%s%s", line, (step % r.logging.every == 0 || do_eval) ? "\n" : "");
      else std::fprintf(stderr, "%s\n", line);
    }
    if (writer.pending()) {
      // Committing a written save (rank 0: the manifest, fsyncs, the rename) can wait on the disk:
      // before_commit beats "checkpoint" then.
      commit_beats = true;
      const auto done = writer.poll();
      commit_beats = false;
      if (done)
        log("checkpoint " + done->dir + " committed (" + std::to_string(done->total_bytes >> 20) +
            " MiB, training blocked " + std::to_string(done->stall_seconds()).substr(0, 5) + " s)");
    }
    heartbeat.beat("step", step, r.schedule.total_steps);
    if (r.checkpoint.every > 0 && step % r.checkpoint.every == 0) save("periodic");
  }
  if (steps_this_run > 0 && !(r.checkpoint.every > 0 && step % r.checkpoint.every == 0))
    save(step >= r.schedule.total_steps ? "final" : "stopped");
  heartbeat.beat("final", step, r.schedule.total_steps);
  if (writer.pending()) {
    DistSaveStats done = writer.finish();
    log("checkpoint " + done.dir + " committed");
  }
  if (lead && r.logging.plot && !curve.steps.empty())
    write_loss_plot(r.run_dir + "/loss.svg", curve, "zaya training loss (" + r.run_dir + ")");

  sum.steps = step;
  sum.tokens = tokens_seen;
  sum.final_train_loss = last_loss;
  {
    std::vector<float> host(static_cast<size_t>(layout.total));
    be->to_host(host.data(), model->params(), layout.total * 4);
    sum.final_weights_hash = weights_hash(host.data(), layout.total);
  }
  if (step >= r.schedule.total_steps) {
    sum.final_val_loss = std::isfinite(last_val) ? last_val : data->evaluate(*model, phase, dp);
    sum.final_choice_accuracy = last_choice_acc;
    sum.final_choice_accuracy_norm = last_choice_acc_norm;
    if (lead) {
      save_model(*model, r.run_dir + "/model");
      if (tok) {
        std::ofstream(r.run_dir + "/model/tokenizer.model", std::ios::binary)
            << std::ifstream(r.data.tokenizer, std::ios::binary).rdbuf();
        if (r.eval.sample_tokens > 0) {
          std::vector<int32_t> prompt = tok->encode(r.eval.sample_prompt, true);
          std::vector<int32_t> out_ids;
          generate(*model, prompt, r.eval.sample_tokens, SamplingParams{0.7f, 40, 0.95f}, uint64_t(r.seed),
                   [&](int32_t t, const float*) {
                     out_ids.push_back(t);
                     return true;
                   });
          std::vector<int32_t> all = prompt;
          all.insert(all.end(), out_ids.begin(), out_ids.end());
          sum.sample = tok->decode(all, true);  // decode with the prompt: spacing at the seam stays right
        }
      }
    }
  }
  heartbeat.beat("done", step, r.schedule.total_steps);
  return sum;
}

}  // namespace zaya
