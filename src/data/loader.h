// The training data loader: micro-batches of packed windows from a phased mixture of shard
// datasets (mixture.h), with a prefetch thread, a resumable cursor and held-out evaluation
// windows. docs/formats.md ("Mixtures and phases") describes the stream exactly.
//
// Global stream. Step s trains on global samples [F(s), F(s) + B(s)), where B(s) is the global
// batch (LoaderOptions::global_batch, normally BatchRamp::at) and F(s) is the cursor's sample
// (= BatchRamp::sequences_before(s) for a run that never changed its ramp).
//
// Rank split (interleaved): rank r of R takes the step's samples F + r, F + r + R, F + r + 2R,
// ...; its micro-batch m holds rows j = m*micro .. m*micro + micro - 1 of that list, i.e.
// global samples F + j*R + r. So micro-batch m of all ranks together is the contiguous range
// [F + m*micro*R, F + (m+1)*micro*R), every sample of the step is read by exactly one rank, and
// the stream (which sample index holds which window) does not depend on R. B(s) must be a
// multiple of micro * R.
//
// Phase changes happen between steps: every phase boundary must coincide with a step start
// (checked when the loader starts and on seek; the error names the nearest valid budgets),
// so each micro-batch has one seq_len.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/mixture.h"
#include "data/shard_reader.h"

namespace zaya {

struct LoaderOptions {
  std::vector<PhaseSpec> phases;
  uint64_t seed = 0;
  int64_t micro_batch = 1;  // sequences per micro-batch (per rank)
  int64_t rank = 0, ranks = 1;
  // Global batch (sequences, all ranks) of each step; empty = micro_batch * ranks every step.
  // The trainer passes [ramp](int64_t s) { return ramp.at(s); }. Called from the prefetch
  // thread: it must be a pure function of the step.
  std::function<int64_t(int64_t step)> global_batch;
  int64_t prefetch = 4;  // micro-batches prepared ahead by the prefetch thread; 0 = no thread
  std::optional<uint32_t> expected_tokenizer_hash;
  ShardVerify verify = ShardVerify::Structure;
  bool check_token_ids = true;  // every delivered token id < vocab size (else an error naming the shard)
};

// Where the stream stands: everything needed to continue it. Saved with checkpoints as JSON.
struct LoaderCursor {
  int64_t step = 0;         // optimizer step of the next micro-batch
  int64_t sample = 0;       // global index of that step's first sample
  int64_t micro = 0;        // micro-batches of the step this rank has already delivered
  int64_t ranks = 1;        // R when `micro` > 0 (a mid-step cursor needs the same R and micro_batch)
  int64_t micro_batch = 1;
  uint64_t seed = 0;
  uint64_t plan = 0;        // PhasePlan::fingerprint (a mismatch on seek is logged, not an error)
  bool operator==(const LoaderCursor&) const = default;
};

// {"format":"zaya-loader-cursor","version":1,"step":..,"sample":..,"micro":..,"ranks":..,
//  "micro_batch":..,"seed":"<16 hex>","plan":"<16 hex>"} (64-bit values as hex strings so that
// any JSON reader keeps them exact).
std::string cursor_to_json(const LoaderCursor& c);
LoaderCursor cursor_from_json(const std::string& text);  // throws zaya::Error naming the field

struct MicroBatchInfo {
  int64_t step = 0;
  int64_t micro = 0;          // index of this micro-batch within the step (this rank)
  int64_t micro_batches = 0;  // micro-batches of this rank in the step
  int32_t phase = 0;
  int64_t seq_len = 0;        // inputs / targets are [rows, seq_len]
  int64_t rows = 0;           // = micro_batch
  std::vector<int64_t> samples;   // global sample index of each row
  std::vector<SampleRef> refs;    // dataset and window of each row
  // Document starts, CSR: row i's positions are doc_starts[doc_offsets[i] .. doc_offsets[i+1]).
  // Position t (0 <= t < seq_len) is listed when inputs[i][t] is the first token of a document
  // (so t = 0 only when the window begins exactly at a document start).
  std::vector<int32_t> doc_starts;
  std::vector<int32_t> doc_offsets;
  bool last_in_step() const { return micro + 1 == micro_batches; }
};

// Per-token document starts [seq_len] of one row from its sorted document-start positions (as
// in MicroBatchInfo): segment_start[t] = the largest start <= t, 0 before the first. This is
// the table Model::forward_backward takes for reset_at_document_boundary.
void document_segments(const int32_t* starts, size_t count, int64_t seq_len, int32_t* segment_start);

// Appends to `out`, as positions shift + (s - from), the entries s of the ascending `starts`
// with from <= s < to: the document starts that fall in a window (the loader's windows and
// `zaya eval`'s use this one rule).
void starts_in_range(const uint64_t* begin, const uint64_t* end, uint64_t from, uint64_t to, uint64_t shift,
                     std::vector<int32_t>& out);

class Loader {
 public:
  // Opens every dataset's train split, validates the plan and starts at step 0 (the prefetch
  // thread starts at once). Throws zaya::Error naming the directory / shard / phase.
  explicit Loader(LoaderOptions options);
  ~Loader();  // stops and joins the prefetch thread
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next micro-batch of this rank: inputs and targets [micro_batch, seq_len] (seq_len of
  // the step's phase; size the buffers with max_seq_len()). An error raised while preparing
  // it (also on the prefetch thread) is rethrown here with its original message, and again on
  // every later call until seek().
  void next(int32_t* inputs, int32_t* targets, MicroBatchInfo* info = nullptr);

  // Position of the next micro-batch next() returns.
  LoaderCursor cursor() const;
  // Continue from a cursor (possibly saved with a different rank count at a step boundary).
  void seek(const LoaderCursor& cursor);
  // Same as seek to {step, sample}, e.g. sample = BatchRamp::sequences_before(step).
  void seek_step(int64_t step, int64_t sample);

  // Direct, thread-free read of global sample `sample`: row of seq_len tokens of inputs and
  // targets, plus the row's document starts (appended to *doc_starts if non-null).
  SampleRef read_sample(int64_t sample, int32_t* inputs, int32_t* targets,
                        std::vector<int32_t>* doc_starts = nullptr) const;

  const PhasePlan& plan() const { return sampler_.plan(); }
  const MixtureSampler& sampler() const { return sampler_; }
  int64_t max_seq_len() const { return plan().max_seq_len(); }
  // The train split of phase p's dataset d.
  const ShardDataset& dataset(size_t phase, size_t d) const;
  uint64_t vocab_size() const { return vocab_; }
  const LoaderOptions& options() const { return opt_; }

  struct Open;  // an opened dataset (internal)

 private:
  struct Pos {
    int64_t step = 0, sample = 0, micro = 0;
  };
  struct Item {
    MicroBatchInfo info;
    std::vector<int32_t> in, tg;
    std::exception_ptr error;
  };
  int64_t batch_at(int64_t step) const;
  void check_alignment(int64_t step, int64_t sample) const;
  void produce(Pos& pos, Item& item) const;
  void run();
  void start();
  void stop();

  LoaderOptions opt_;
  std::vector<std::unique_ptr<Open>> open_;
  std::vector<std::vector<size_t>> which_;  // [phase][dataset] -> index into open_
  MixtureSampler sampler_;
  uint64_t vocab_ = 0;

  mutable std::mutex mu_;
  std::condition_variable not_full_, not_empty_;  // producer waits on the first, consumer on the second
  std::deque<std::unique_ptr<Item>> ready_;
  std::vector<std::unique_ptr<Item>> free_;
  std::thread thread_;
  bool stop_ = false;
  Pos consumed_, produced_;
  std::exception_ptr failed_;
};

// Held-out evaluation windows from the val split of a set of datasets (`zaya data prepare
// --val-fraction`): dataset d is tiled into windows [w*seq_len, w*seq_len + seq_len + 1),
// optionally thinned to max_windows evenly spaced ones. No randomness: the same windows at
// every evaluation. Datasets without a val split (or with too few tokens) are skipped and
// listed in skipped().
class EvalSet {
 public:
  static EvalSet open(const std::vector<DatasetSpec>& datasets, int64_t seq_len, int64_t max_windows = 0,
                      std::optional<uint32_t> expected_tokenizer_hash = std::nullopt);
  EvalSet(EvalSet&&) noexcept;
  EvalSet& operator=(EvalSet&&) noexcept;
  ~EvalSet();

  size_t datasets() const { return sets_.size(); }
  const std::string& name(size_t d) const;
  int64_t windows(size_t d) const;
  int64_t seq_len() const { return seq_len_; }
  const std::vector<std::string>& skipped() const { return skipped_; }
  // Windows first .. first+n-1 of dataset d into [n, seq_len] inputs / targets. Throws if the
  // range passes windows(d).
  void fill(size_t d, int64_t first, int64_t n, int32_t* inputs, int32_t* targets,
            std::vector<int32_t>* doc_starts = nullptr) const;

 private:
  EvalSet() = default;
  struct Set;
  std::vector<std::unique_ptr<Set>> sets_;
  std::vector<std::string> skipped_;
  int64_t seq_len_ = 0;
};

}  // namespace zaya
