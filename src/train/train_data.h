// Where the trainer's tokens come from, per data-parallel rank:
//  * a flat token file (data.train / data.val, the built-in demo), windows drawn by
//    WindowSampler; or
//  * shard datasets streamed by the prefetching Loader: the recipe's [[phases]] (mixtures of
//    [[data.datasets]] with per-phase seq_len / RoPE theta / LR scale), or one shard directory
//    given as data.train (one open-ended phase).
// Both follow the loader's global-stream rule (data/loader.h): step s trains global samples
// [F(s), F(s) + B(s)); rank r of R reads samples F + j*R + r, so the stream is the same for any
// number of ranks and a run resumes on a different rank count with nothing skipped or repeated.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/token_file.h"
#include "model/model.h"
#include "train/recipe.h"
#include "train/sampler.h"
#include "train/schedule.h"

namespace zaya {

class DataParallel;

// The recipe's data as loader phases: its [[phases]] over [[data.datasets]], or one open-ended
// phase over data.train when that is a shard directory; empty for a flat token file.
std::vector<PhaseSpec> recipe_phases(const Recipe& r);

// One micro-batch of this rank.
struct TrainMicroBatch {
  int64_t rows = 0, seq_len = 0;
  int32_t phase = 0;
  std::vector<int32_t> inputs, targets;  // [rows, seq_len]
  std::vector<int32_t> segment_start;    // [rows, seq_len] when documents reset, else empty
};

class TrainData {
 public:
  // Opens the data (building the demo corpus on first use). Throws naming the file / key.
  // rank of ranks: the data-parallel rank (a context-parallel group shares one).
  TrainData(const Recipe& r, int rank, int ranks, const BatchRamp& ramp);
  ~TrainData();

  bool phased() const { return loader_ != nullptr; }
  int64_t vocab_size() const { return vocab_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  // The phase active at optimizer step `step` (its first micro-batch decides); for token files
  // a fixed single phase built from data.seq_len.
  const PhaseSpec& phase(size_t p) const { return phases_[p]; }
  size_t phases() const { return phases_.size(); }
  std::string describe() const;
  // Unigram cross-entropy of the val set (token-file mode; 0 otherwise).
  double unigram_baseline() const;

  // Micro-batch m of this rank at step `step` (first_sample = F(step)).
  void next(int64_t step, int64_t first_sample, int64_t m, TrainMicroBatch& out);

  // Data cursor for checkpoints ("" in token-file mode: the step alone positions it).
  std::string cursor_json() const;
  // Positions the stream at `step` (first global sample `sample`), from a saved cursor if given.
  void seek(int64_t step, int64_t sample, const std::string& cursor_json);

  // Held-out loss (sum, count) of `model` on phase p's evaluation windows, split over all of
  // dp's ranks and summed through dp; NAN when there is no held-out data.
  double evaluate(Model& model, size_t phase, DataParallel& dp);

 private:
  const Recipe& r_;
  int rank_, ranks_;
  int64_t micro_;
  bool reset_docs_;
  std::vector<PhaseSpec> phases_;
  int64_t vocab_ = 0, max_seq_len_ = 0;
  TokenFile train_, val_;
  std::unique_ptr<WindowSampler> sampler_, val_sampler_;
  std::unique_ptr<Loader> loader_;
  std::map<size_t, std::unique_ptr<EvalSet>> eval_sets_;
};

}  // namespace zaya
