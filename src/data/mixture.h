// Data mixtures and training phases (ZAYA1 trained in phases whose mixtures shift from web text
// toward code / math / reasoning, with a context extension in the last phase).
//
// A run is a sequence of phases. Phase p trains `tokens` tokens (seq_len tokens per sample,
// so tokens / seq_len samples) drawn from a weighted mixture of shard datasets. The global
// sample index i (0, 1, 2, ... over the whole run, across phases and data-parallel ranks) is
// the whole sampling state: sample_at(seed, i) is a pure function returning the phase, the
// dataset and the window start of sample i. docs/formats.md ("Mixtures and phases") gives the
// exact construction; in short:
//
//  * Phase boundaries are exact: phase p covers samples [sample_start(p), sample_end(p)) and
//    tokens [token_start(p), token_end(p)), with token_end - token_start = tokens. The last
//    phase never ends (samples past its budget stay in it); its budget may be 0 = unbounded.
//  * Dataset choice is stratified, not i.i.d.: the phase's samples are cut into blocks of
//    kMixtureBlock; in every block dataset d gets exactly c_d slots (c_d = weight share of
//    kMixtureBlock, largest-remainder rounding, at least 1), and a seeded permutation of the
//    block decides which sample gets which slot. Proportions are exact per block and the
//    choice is O(1) per sample.
//  * Windows come from a seeded permutation per epoch: dataset d of a phase is tiled into
//    W = (tokens - 1) / seq_len windows [w*seq_len, w*seq_len + seq_len + 1) (every token is a
//    target exactly once per epoch); the k-th visit of d is window perm_epoch(k mod W) of epoch
//    k / W. An epoch thus visits every window exactly once, in a fresh order each epoch.
//    The visit counter of a (dataset name, seq_len) stream continues across phases.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zaya {

struct DatasetSpec {
  std::string name;     // identifies the dataset's sample stream (the dir may move)
  std::string dir;      // shard directory written by `zaya data prepare`
  double weight = 1.0;  // relative; a phase's weights need not sum to 1
};

struct PhaseSpec {
  std::string name;
  int64_t tokens = 0;   // trained tokens in this phase (a multiple of seq_len); last phase: 0 = unbounded
  int64_t seq_len = 0;  // tokens per sample (each sample reads seq_len + 1 tokens)
  std::vector<DatasetSpec> mixture;
  double rope_theta = 0;  // 0 = unchanged
  double lr_scale = 1;    // multiplies the learning-rate schedule; 1 = unchanged
};

// Samples per mixture block (see above).
inline constexpr int64_t kMixtureBlock = 1 << 16;

// The phases of a run with their exact sample and token boundaries. Validates on construction
// (throws zaya::Error, component "data", naming the phase and the field).
class PhasePlan {
 public:
  PhasePlan() = default;
  explicit PhasePlan(std::vector<PhaseSpec> phases);

  size_t size() const { return phases_.size(); }
  const PhaseSpec& phase(size_t p) const { return phases_[p]; }
  const std::vector<PhaseSpec>& phases() const { return phases_; }

  // Boundaries of phase p. The last phase's ends are INT64_MAX (it never ends).
  int64_t sample_start(size_t p) const { return sample_start_[p]; }
  int64_t sample_end(size_t p) const;
  int64_t token_start(size_t p) const { return token_start_[p]; }
  int64_t token_end(size_t p) const;

  // The phase active once `tokens` tokens have been trained: the p with
  // token_start(p) <= tokens < token_end(p).
  size_t phase_at_tokens(int64_t tokens) const;
  size_t phase_of_sample(int64_t sample) const;
  // Tokens trained before global sample `sample`.
  int64_t tokens_before_sample(int64_t sample) const;
  int64_t max_seq_len() const;
  // Hash of everything that shapes the sample stream (names, budgets, seq_lens, weights);
  // not the directories, which may move.
  uint64_t fingerprint() const;

 private:
  std::vector<PhaseSpec> phases_;
  std::vector<int64_t> sample_start_, token_start_;
};

// One sample of the global stream.
struct SampleRef {
  int32_t phase = 0;
  int32_t dataset = 0;   // index into the phase's mixture
  int64_t start = 0;     // first token of the window in the dataset's train split
  int64_t seq_len = 0;   // the window is tokens [start, start + seq_len + 1)
  int64_t epoch = 0;     // epoch of this dataset stream the window belongs to
  bool operator==(const SampleRef&) const = default;
};

// sample_at over a plan, given each phase dataset's train-split token count.
class MixtureSampler {
 public:
  MixtureSampler() = default;
  // dataset_tokens[p][d]: tokens in the train split of phase p's dataset d. Throws if a
  // dataset is too short for one window (naming the dataset and its dir).
  MixtureSampler(PhasePlan plan, const std::vector<std::vector<uint64_t>>& dataset_tokens);

  const PhasePlan& plan() const { return plan_; }
  // Pure: the same (seed, sample) always gives the same SampleRef. sample >= 0.
  SampleRef sample_at(uint64_t seed, int64_t sample) const;
  int64_t windows(size_t phase, size_t dataset) const { return phases_[phase].windows[dataset]; }
  // Slots of dataset d in every block of kMixtureBlock samples of phase p.
  int64_t block_slots(size_t phase, size_t dataset) const;

 private:
  struct Phase {
    std::vector<int64_t> cum;      // slot ranges: dataset d owns [cum[d], cum[d+1]) of a block
    std::vector<int64_t> windows;  // per dataset
    std::vector<int64_t> visit0;   // visits of the (name, seq_len) stream in earlier phases
    std::vector<uint64_t> stream;  // hash of (name, seq_len): keys the window permutations
  };
  PhasePlan plan_;
  std::vector<Phase> phases_;
};

// A seeded bijection of [0, n) (balanced 4-round Feistel network on the next even power of
// two, cycle-walking back into range). O(1) expected per call.
uint64_t permute_index(uint64_t index, uint64_t n, uint64_t key);

// splitmix64 finaliser and a two-value hash built on it.
uint64_t mix64(uint64_t x);
inline uint64_t hash2(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b + 0x632be59bd9b4e019ull)); }
uint64_t hash_string(const std::string& s);

}  // namespace zaya
