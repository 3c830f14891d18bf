// Phases, mixtures and the pure sample function (see mixture.h).
#include "data/mixture.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.h"

namespace zaya {

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

[[noreturn]] void fail_phase(size_t p, const PhaseSpec& ph, const std::string& what, const std::string& hint = {}) {
  fail("data",
       "phase " + std::to_string(int64_t(p)) + (ph.name.empty() ? "" : " ('" + ph.name + "')") + ": " + what,
       hint);
}

}  // namespace

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_string(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then finalised
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return mix64(h);
}

uint64_t permute_index(uint64_t index, uint64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 64 - __builtin_clzll(n - 1);  // 2^bits >= n
  const int half = (bits + 1) / 2;
  const uint64_t mask = (uint64_t(1) << half) - 1;
  uint64_t k[4];
  for (int r = 0; r < 4; ++r) k[r] = hash2(key, uint64_t(r));
  uint64_t x = index;
  do {
    uint64_t l = x >> half, rr = x & mask;
    for (int r = 0; r < 4; ++r) {
      const uint64_t nl = rr;
      rr = l ^ (mix64(rr ^ k[r]) & mask);
      l = nl;
    }
    x = (l << half) | rr;
  } while (x >= n);  // cycle walking: at most a few rounds since 2^(2 half) < 4n
  return x;
}

// ---------------------------------------------------------------------------------------------
// PhasePlan

PhasePlan::PhasePlan(std::vector<PhaseSpec> phases) : phases_(std::move(phases)) {
  if (phases_.empty()) fail("data", "the run has no phases", "add at least one [[phases]] entry with a mixture");
  std::set<std::string> names;
  std::map<std::string, std::string> dir_of;
  int64_t samples = 0, tokens = 0;
  for (size_t p = 0; p < phases_.size(); ++p) {
    const PhaseSpec& ph = phases_[p];
    const bool last = p + 1 == phases_.size();
    if (ph.name.empty()) fail_phase(p, ph, "'name' is empty");
    if (!names.insert(ph.name).second) fail_phase(p, ph, "the name is used by an earlier phase");
    if (ph.seq_len < 1) fail_phase(p, ph, "'seq_len' is " + std::to_string(ph.seq_len) + ", expected >= 1");
    if (ph.tokens < 0 || (ph.tokens == 0 && !last))
      fail_phase(p, ph,
                 "'tokens' is " + std::to_string(ph.tokens) +
                     ", expected > 0 (only the last phase may be 0 = unbounded)");
    if (ph.tokens % ph.seq_len != 0)
      fail_phase(p, ph,
                 "'tokens' is " + std::to_string(ph.tokens) + ", not a multiple of seq_len " +
                     std::to_string(ph.seq_len),
                 "use " + std::to_string(ph.tokens / ph.seq_len * ph.seq_len) + " or " +
                     std::to_string((ph.tokens / ph.seq_len + 1) * ph.seq_len));
    if (!(ph.rope_theta >= 0) || !std::isfinite(ph.rope_theta))
      fail_phase(p, ph, "'rope_theta' must be >= 0 (0 = unchanged)");
    if (!(ph.lr_scale > 0) || !std::isfinite(ph.lr_scale)) fail_phase(p, ph, "'lr_scale' must be > 0");
    if (ph.mixture.empty()) fail_phase(p, ph, "the mixture is empty");
    std::set<std::string> ds;
    for (const DatasetSpec& d : ph.mixture) {
      if (d.name.empty()) fail_phase(p, ph, "a mixture entry has an empty name");
      if (!ds.insert(d.name).second) fail_phase(p, ph, "dataset '" + d.name + "' appears twice in the mixture");
      if (d.dir.empty()) fail_phase(p, ph, "dataset '" + d.name + "' has an empty dir");
      if (!(d.weight > 0) || !std::isfinite(d.weight))
        fail_phase(p, ph, "dataset '" + d.name + "' has weight " + std::to_string(d.weight) + ", expected > 0");
      auto [it, fresh] = dir_of.emplace(d.name, d.dir);
      if (!fresh && it->second != d.dir)
        fail_phase(p, ph, "dataset '" + d.name + "' is '" + d.dir + "' here but '" + it->second + "' in an earlier phase",
                   "a dataset name identifies one directory for the whole run");
    }
    sample_start_.push_back(samples);
    token_start_.push_back(tokens);
    if (__builtin_add_overflow(tokens, ph.tokens, &tokens)) fail_phase(p, ph, "the token budgets overflow int64");
    samples += ph.tokens / ph.seq_len;
  }
}

int64_t PhasePlan::sample_end(size_t p) const {
  return p + 1 < phases_.size() ? sample_start_[p + 1] : kNever;
}

int64_t PhasePlan::token_end(size_t p) const { return p + 1 < phases_.size() ? token_start_[p + 1] : kNever; }

size_t PhasePlan::phase_at_tokens(int64_t tokens) const {
  auto it = std::upper_bound(token_start_.begin(), token_start_.end(), tokens);
  return it == token_start_.begin() ? 0 : size_t(it - token_start_.begin()) - 1;
}

size_t PhasePlan::phase_of_sample(int64_t sample) const {
  auto it = std::upper_bound(sample_start_.begin(), sample_start_.end(), sample);
  return it == sample_start_.begin() ? 0 : size_t(it - sample_start_.begin()) - 1;
}

int64_t PhasePlan::tokens_before_sample(int64_t sample) const {
  const size_t p = phase_of_sample(sample);
  return token_start_[p] + (sample - sample_start_[p]) * phases_[p].seq_len;
}

int64_t PhasePlan::max_seq_len() const {
  int64_t m = 0;
  for (const auto& p : phases_) m = std::max(m, p.seq_len);
  return m;
}

uint64_t PhasePlan::fingerprint() const {
  uint64_t h = 0x7a617961ull;
  for (const PhaseSpec& p : phases_) {
    h = hash2(h, hash_string(p.name));
    h = hash2(h, uint64_t(p.tokens));
    h = hash2(h, uint64_t(p.seq_len));
    for (const DatasetSpec& d : p.mixture) {
      h = hash2(h, hash_string(d.name));
      uint64_t w;
      std::memcpy(&w, &d.weight, 8);
      h = hash2(h, w);
    }
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// MixtureSampler

MixtureSampler::MixtureSampler(PhasePlan plan, const std::vector<std::vector<uint64_t>>& dataset_tokens)
    : plan_(std::move(plan)) {
  ZAYA_CHECK(dataset_tokens.size() == plan_.size(), "one token-count list per phase");
  std::map<std::pair<std::string, int64_t>, int64_t> visits;  // (name, seq_len) -> visits so far
  for (size_t p = 0; p < plan_.size(); ++p) {
    const PhaseSpec& ph = plan_.phase(p);
    ZAYA_CHECK(dataset_tokens[p].size() == ph.mixture.size(), "one token count per dataset");
    const size_t n = ph.mixture.size();
    Phase out;
    // Largest-remainder apportionment of kMixtureBlock slots, at least one each.
    double total = 0;
    for (const auto& d : ph.mixture) total += d.weight;
    if (int64_t(n) > kMixtureBlock)
      fail_phase(p, ph, "more than " + std::to_string(kMixtureBlock) + " datasets");
    std::vector<int64_t> slots(n);
    std::vector<std::pair<double, size_t>> rem;
    int64_t given = 0;
    for (size_t d = 0; d < n; ++d) {
      const double exact = ph.mixture[d].weight / total * double(kMixtureBlock);
      slots[d] = std::max<int64_t>(1, int64_t(std::floor(exact)));
      given += slots[d];
      rem.push_back({exact - std::floor(exact), d});
    }
    std::stable_sort(rem.begin(), rem.end(), [](auto a, auto b) { return a.first > b.first; });
    for (size_t i = 0; given < kMixtureBlock; i = (i + 1) % n, ++given) ++slots[rem[i].second];
    while (given > kMixtureBlock) {  // only after the at-least-one rule: take from the largest
      auto it = std::max_element(slots.begin(), slots.end());
      --*it;
      --given;
    }
    out.cum.push_back(0);
    for (size_t d = 0; d < n; ++d) out.cum.push_back(out.cum.back() + slots[d]);
    const bool last = p + 1 == plan_.size();
    const int64_t samples = last ? 0 : plan_.sample_end(p) - plan_.sample_start(p);
    const int64_t blocks = (samples + kMixtureBlock - 1) / kMixtureBlock;
    for (size_t d = 0; d < n; ++d) {
      const DatasetSpec& ds = ph.mixture[d];
      const uint64_t tok = dataset_tokens[p][d];
      if (tok < uint64_t(ph.seq_len) + 1)
        fail_phase(p, ph,
                   "dataset '" + ds.name + "' (" + ds.dir + ") has " + std::to_string(tok) +
                       " training tokens, fewer than seq_len + 1 = " + std::to_string(ph.seq_len + 1),
                   "add data to the dataset or shorten seq_len");
      out.windows.push_back(int64_t((tok - 1) / uint64_t(ph.seq_len)));
      int64_t& v = visits[{ds.name, ph.seq_len}];
      out.visit0.push_back(v);
      // Upper bound of this phase's visits (whole blocks): a seed-independent offset, so at a
      // phase boundary at most one block's quota of the stream's positions is left unused.
      v += blocks * slots[d];
      out.stream.push_back(hash2(hash_string(ds.name), uint64_t(ph.seq_len)));
    }
    phases_.push_back(std::move(out));
  }
}

int64_t MixtureSampler::block_slots(size_t phase, size_t dataset) const {
  return phases_[phase].cum[dataset + 1] - phases_[phase].cum[dataset];
}

SampleRef MixtureSampler::sample_at(uint64_t seed, int64_t sample) const {
  ZAYA_CHECK(sample >= 0 && !phases_.empty(), "sample index must be >= 0 on a built sampler");
  const size_t p = plan_.phase_of_sample(sample);
  const Phase& ph = phases_[p];
  const int64_t local = sample - plan_.sample_start(p);
  const int64_t block = local / kMixtureBlock, j = local % kMixtureBlock;
  const uint64_t block_key = hash2(hash2(seed, 0x6d6978ull + p), uint64_t(block));
  const int64_t slot = int64_t(permute_index(uint64_t(j), uint64_t(kMixtureBlock), block_key));
  const size_t d = size_t(std::upper_bound(ph.cum.begin(), ph.cum.end(), slot) - ph.cum.begin()) - 1;
  const int64_t k = ph.visit0[d] + block * (ph.cum[d + 1] - ph.cum[d]) + (slot - ph.cum[d]);
  const int64_t w = ph.windows[d];
  SampleRef r;
  r.phase = int32_t(p);
  r.dataset = int32_t(d);
  r.seq_len = plan_.phase(p).seq_len;
  r.epoch = k / w;
  const uint64_t window_key = hash2(hash2(seed, ph.stream[d]), uint64_t(r.epoch));
  r.start = int64_t(permute_index(uint64_t(k % w), uint64_t(w), window_key)) * r.seq_len;
  return r;
}

}  // namespace zaya
