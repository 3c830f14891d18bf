// The training data loader (see loader.h).
#include "data/loader.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

namespace zaya {

namespace {

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

}  // namespace

struct Loader::Open {
  std::string dir;
  ShardDataset ds;
  std::vector<uint64_t> starts;  // global token offset of each shard
};

namespace {

// Window [start, start + L + 1) of an opened dataset into one row of inputs and targets, plus
// the row's document starts. With a loss mask (supervised fine-tuning data), a target whose
// token is context only (mask byte 0) is -1: not counted by the loss.
void read_window(const Loader::Open& o, uint64_t start, int64_t L, bool check, uint64_t vocab, int32_t* in,
                 int32_t* tg, std::vector<int32_t>* doc_starts) {
  const uint64_t need = uint64_t(L) + 1;
  if (start + need > o.ds.tokens())
    fail("internal", "window [" + std::to_string(start) + ", " + std::to_string(start + need) + ") outside " + o.dir);
  size_t s = size_t(std::upper_bound(o.starts.begin(), o.starts.end(), start) - o.starts.begin()) - 1;
  uint64_t t = 0;  // window tokens done
  while (t < need) {
    ZAYA_CHECK(s < o.ds.shard_count(), "window runs past the last shard");
    const ShardReader& sh = o.ds.shard(s);
    const uint64_t local = start + t - o.starts[s];
    const uint64_t take = std::min(need - t, sh.tokens() - local);
    const uint32_t* src = sh.token_span().data() + local;
    if (check) {
      uint32_t mx = 0;
      for (uint64_t u = 0; u < take; ++u) mx = std::max(mx, src[u]);
      if (mx >= vocab || mx > uint32_t(INT32_MAX)) {
        uint64_t u = 0;
        while (src[u] < vocab && src[u] <= uint32_t(INT32_MAX)) ++u;
        fail("data",
             sh.path() + ": token " + std::to_string(local + u) + " has id " + std::to_string(src[u]) +
                 ", not below the vocab size " + std::to_string(vocab),
             "the shard is corrupt; check it with full verification or re-run `zaya data prepare`");
      }
    }
    // Window position t + u feeds inputs[t + u] (if < L) and targets[t + u - 1] (if > 0).
    const uint64_t in_end = std::min<uint64_t>(t + take, uint64_t(L));
    if (in_end > t) std::memcpy(in + t, src, size_t(in_end - t) * 4);
    const uint64_t tg_from = std::max<uint64_t>(t, 1);
    if (t + take > tg_from) {
      std::memcpy(tg + tg_from - 1, src + (tg_from - t), size_t(t + take - tg_from) * 4);
      if (sh.has_loss_mask()) {
        const uint8_t* mask = sh.loss_mask_span().data() + local;
        for (uint64_t u = tg_from; u < t + take; ++u)
          if (mask[u - t] == 0) tg[u - 1] = -1;
      }
    }
    if (doc_starts && t < uint64_t(L)) {  // starts at window positions < L (inputs)
      auto idx = sh.index().subspan(0, size_t(sh.documents()));
      starts_in_range(idx.data(), idx.data() + idx.size(), local, local + std::min(take, uint64_t(L) - t), t,
                      *doc_starts);
    }
    t += take;
    ++s;
  }
}

}  // namespace

void starts_in_range(const uint64_t* begin, const uint64_t* end, uint64_t from, uint64_t to, uint64_t shift,
                     std::vector<int32_t>& out) {
  for (const uint64_t* it = std::lower_bound(begin, end, from); it != end && *it < to; ++it)
    out.push_back(int32_t(shift + (*it - from)));
}

void document_segments(const int32_t* starts, size_t count, int64_t seq_len, int32_t* segment_start) {
  size_t next = 0;
  int32_t current = 0;
  for (int64_t t = 0; t < seq_len; ++t) {
    while (next < count && starts[next] <= t) current = starts[next++];
    segment_start[t] = current;
  }
}

// ---------------------------------------------------------------------------------------------
// Cursor JSON

std::string cursor_to_json(const LoaderCursor& c) {
  nlohmann::ordered_json j;
  j["format"] = "zaya-loader-cursor";
  j["version"] = 1;
  j["step"] = c.step;
  j["sample"] = c.sample;
  j["micro"] = c.micro;
  j["ranks"] = c.ranks;
  j["micro_batch"] = c.micro_batch;
  j["seed"] = hex64(c.seed);
  j["plan"] = hex64(c.plan);
  return j.dump();
}

LoaderCursor cursor_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("data", std::string("loader cursor: invalid JSON: ") + e.what());
  }
  if (!j.is_object() || j.value("format", "") != "zaya-loader-cursor")
    fail("data", "loader cursor: 'format' is not \"zaya-loader-cursor\"");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int64_t>() != 1)
    fail("data", "loader cursor: 'version' must be 1");
  auto i64 = [&](const char* k, int64_t lo) {
    if (!j.contains(k) || !j[k].is_number_integer()) fail("data", std::string("loader cursor: '") + k + "' must be an integer");
    const int64_t v = j[k].get<int64_t>();
    if (v < lo)
      fail("data", std::string("loader cursor: '") + k + "' is " + std::to_string(v) +
                       ", expected >= " + std::to_string(lo));
    return v;
  };
  auto h64 = [&](const char* k) {
    if (!j.contains(k) || !j[k].is_string()) fail("data", std::string("loader cursor: '") + k + "' must be a hex string");
    const std::string s = j[k].get<std::string>();
    if (s.empty() || s.size() > 16 || s.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      fail("data", std::string("loader cursor: '") + k + "' is '" + s + "', expected up to 16 hex digits");
    return uint64_t(std::stoull(s, nullptr, 16));
  };
  LoaderCursor c;
  c.step = i64("step", 0);
  c.sample = i64("sample", 0);
  c.micro = i64("micro", 0);
  c.ranks = i64("ranks", 1);
  c.micro_batch = i64("micro_batch", 1);
  c.seed = h64("seed");
  c.plan = h64("plan");
  return c;
}

// ---------------------------------------------------------------------------------------------
// Loader

Loader::Loader(LoaderOptions options) : opt_(std::move(options)) {
  if (opt_.micro_batch < 1)
    fail("data", "micro_batch is " + std::to_string(opt_.micro_batch) + ", expected >= 1");
  if (opt_.ranks < 1 || opt_.rank < 0 || opt_.rank >= opt_.ranks)
    fail("data", "rank " + std::to_string(opt_.rank) + " of " + std::to_string(opt_.ranks) +
                     " ranks is out of range");
  if (opt_.prefetch < 0) fail("data", "prefetch is " + std::to_string(opt_.prefetch) + ", expected >= 0");
  PhasePlan plan(opt_.phases);
  std::map<std::string, size_t> by_dir;
  std::vector<std::vector<uint64_t>> tokens(plan.size());
  std::optional<uint32_t> tok_hash = opt_.expected_tokenizer_hash;
  std::string first_dir;
  for (size_t p = 0; p < plan.size(); ++p) {
    which_.emplace_back();
    for (const DatasetSpec& d : plan.phase(p).mixture) {
      auto it = by_dir.find(d.dir);
      if (it == by_dir.end()) {
        auto o = std::make_unique<Open>();
        o->dir = d.dir;
        o->ds = ShardDataset::open(d.dir, {"train", tok_hash, opt_.verify});
        if (!tok_hash) {
          tok_hash = o->ds.manifest().tokenizer_hash;
          first_dir = d.dir;
          vocab_ = o->ds.vocab_size();
        } else if (vocab_ == 0) {
          vocab_ = o->ds.vocab_size();
        }
        if (o->ds.vocab_size() != vocab_)
          fail("data", d.dir + ": vocab size " + std::to_string(o->ds.vocab_size()) + " differs from " +
                           std::to_string(vocab_) + (first_dir.empty() ? "" : " (" + first_dir + ")"),
               "all datasets of a run must be prepared with the same tokenizer");
        uint64_t at = 0;
        for (size_t s = 0; s < o->ds.shard_count(); ++s) {
          o->starts.push_back(at);
          at += o->ds.shard(s).tokens();
        }
        it = by_dir.emplace(d.dir, open_.size()).first;
        open_.push_back(std::move(o));
      }
      which_[p].push_back(it->second);
      tokens[p].push_back(open_[it->second]->ds.tokens());
    }
  }
  sampler_ = MixtureSampler(std::move(plan), tokens);
  check_alignment(0, 0);
  start();
}

Loader::~Loader() { stop(); }

const ShardDataset& Loader::dataset(size_t phase, size_t d) const { return open_[which_[phase][d]]->ds; }

int64_t Loader::batch_at(int64_t step) const {
  const int64_t g = opt_.micro_batch * opt_.ranks;
  const int64_t b = opt_.global_batch ? opt_.global_batch(step) : g;
  if (b < 1 || b % g != 0)
    fail("data",
         "the global batch of step " + std::to_string(step) + " is " + std::to_string(b) +
             " sequences, not a positive multiple of micro_batch " + std::to_string(opt_.micro_batch) +
             " x ranks " + std::to_string(opt_.ranks),
         "make the batch ramp's granularity micro_batch x ranks");
  return b;
}

void Loader::check_alignment(int64_t step, int64_t sample) const {
  const PhasePlan& plan = sampler_.plan();
  int64_t s = step, f = sample;
  for (size_t p = 0; p + 1 < plan.size(); ++p) {
    const int64_t boundary = plan.sample_end(p);
    if (boundary <= sample) continue;
    int64_t b = 0;
    while (f < boundary) {
      b = batch_at(s);
      f += b;
      ++s;
    }
    if (f != boundary) {
      const PhaseSpec& ph = plan.phase(p);
      const int64_t lo = (f - b - plan.sample_start(p)) * ph.seq_len, hi = (f - plan.sample_start(p)) * ph.seq_len;
      fail("data",
           "phase " + std::to_string(int64_t(p)) + " ('" + ph.name + "') ends after " +
               std::to_string(ph.tokens) + " tokens (global sample " + std::to_string(boundary) +
               "), inside step " + std::to_string(s - 1) + " (samples [" + std::to_string(f - b) + ", " +
               std::to_string(f) + "))",
           "phase budgets must end on a step boundary; for this phase use tokens = " +
               (lo > 0 ? std::to_string(lo) + " or " : std::string()) + std::to_string(hi));
    }
  }
}

void Loader::produce(Pos& pos, Item& item) const {
  const int64_t B = batch_at(pos.step);
  const int64_t R = opt_.ranks, M = opt_.micro_batch;
  const int64_t nmicro = B / (R * M);
  MicroBatchInfo& info = item.info;
  info.step = pos.step;
  info.micro = pos.micro;
  info.micro_batches = nmicro;
  info.rows = M;
  info.samples.resize(size_t(M));
  info.refs.resize(size_t(M));
  info.doc_starts.clear();
  info.doc_offsets.assign(1, 0);
  for (int64_t q = 0; q < M; ++q) {
    const int64_t j = pos.micro * M + q;
    info.samples[size_t(q)] = pos.sample + j * R + opt_.rank;
    info.refs[size_t(q)] = sampler_.sample_at(opt_.seed, info.samples[size_t(q)]);
  }
  const SampleRef& r0 = info.refs[0];
  info.phase = r0.phase;
  info.seq_len = r0.seq_len;
  const size_t L = size_t(info.seq_len);
  if (item.in.size() < size_t(M) * L) {
    item.in.resize(size_t(M) * L);
    item.tg.resize(size_t(M) * L);
  }
  for (int64_t q = 0; q < M; ++q) {
    const SampleRef& r = info.refs[size_t(q)];
    if (r.phase != r0.phase)
      fail("data",
           "step " + std::to_string(pos.step) + " spans phases " + std::to_string(r0.phase) + " and " +
               std::to_string(r.phase),
           "phase budgets must end on a step boundary");
    read_window(*open_[which_[size_t(r.phase)][size_t(r.dataset)]], uint64_t(r.start), r.seq_len, opt_.check_token_ids,
                vocab_, item.in.data() + size_t(q) * L, item.tg.data() + size_t(q) * L, &info.doc_starts);
    info.doc_offsets.push_back(int32_t(info.doc_starts.size()));
  }
  if (++pos.micro == nmicro) {
    pos.micro = 0;
    pos.sample += B;
    ++pos.step;
  }
}

SampleRef Loader::read_sample(int64_t sample, int32_t* inputs, int32_t* targets,
                              std::vector<int32_t>* doc_starts) const {
  if (sample < 0) fail("data", "sample index " + std::to_string(sample) + " is negative");
  const SampleRef r = sampler_.sample_at(opt_.seed, sample);
  read_window(*open_[which_[size_t(r.phase)][size_t(r.dataset)]], uint64_t(r.start), r.seq_len, opt_.check_token_ids,
              vocab_, inputs, targets, doc_starts);
  return r;
}

void Loader::run() {
  for (;;) {
    std::unique_ptr<Item> item;
    Pos pos;
    {
      std::unique_lock<std::mutex> lk(mu_);
      not_full_.wait(lk, [&] { return stop_ || int64_t(ready_.size()) < opt_.prefetch; });
      if (stop_) return;
      if (!free_.empty()) {
        item = std::move(free_.back());
        free_.pop_back();
      }
      pos = produced_;
    }
    if (!item) item = std::make_unique<Item>();
    item->error = nullptr;
    try {
      produce(pos, *item);
    } catch (...) {
      item->error = std::current_exception();
    }
    const bool failed = item->error != nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      produced_ = pos;
      ready_.push_back(std::move(item));
    }
    not_empty_.notify_one();
    if (failed) return;  // the consumer rethrows; seek() restarts the thread
  }
}

void Loader::start() {
  stop_ = false;
  failed_ = nullptr;
  produced_ = consumed_;
  if (opt_.prefetch > 0) thread_ = std::thread(&Loader::run, this);
}

void Loader::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  not_full_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lk(mu_);
  while (!ready_.empty()) {
    free_.push_back(std::move(ready_.front()));
    ready_.pop_front();
  }
}

void Loader::next(int32_t* inputs, int32_t* targets, MicroBatchInfo* info) {
  if (failed_) std::rethrow_exception(failed_);
  std::unique_ptr<Item> item;
  if (opt_.prefetch == 0) {
    if (free_.empty()) free_.push_back(std::make_unique<Item>());
    item = std::move(free_.back());
    free_.pop_back();
    Pos pos = consumed_;
    try {
      produce(pos, *item);
    } catch (...) {
      failed_ = std::current_exception();
      free_.push_back(std::move(item));
      throw;
    }
  } else {
    std::unique_lock<std::mutex> lk(mu_);
    not_empty_.wait(lk, [&] { return !ready_.empty(); });
    item = std::move(ready_.front());
    ready_.pop_front();
    if (item->error) {
      failed_ = item->error;
      free_.push_back(std::move(item));
      lk.unlock();
      std::rethrow_exception(failed_);
    }
  }
  const MicroBatchInfo& in = item->info;
  const size_t n = size_t(in.rows * in.seq_len);
  std::memcpy(inputs, item->in.data(), n * 4);
  std::memcpy(targets, item->tg.data(), n * 4);
  if (info) *info = in;
  {
    std::lock_guard<std::mutex> lk(mu_);
    consumed_.step = in.step;
    consumed_.micro = in.micro + 1;
    consumed_.sample = in.samples[0] - (in.micro * in.rows) * opt_.ranks - opt_.rank;
    if (consumed_.micro == in.micro_batches) {
      consumed_.sample += in.micro_batches * in.rows * opt_.ranks;
      consumed_.micro = 0;
      ++consumed_.step;
    }
    free_.push_back(std::move(item));
  }
  if (opt_.prefetch > 0) not_full_.notify_one();
}

LoaderCursor Loader::cursor() const {
  std::lock_guard<std::mutex> lk(mu_);
  LoaderCursor c;
  c.step = consumed_.step;
  c.sample = consumed_.sample;
  c.micro = consumed_.micro;
  c.ranks = opt_.ranks;
  c.micro_batch = opt_.micro_batch;
  c.seed = opt_.seed;
  c.plan = plan().fingerprint();
  return c;
}

void Loader::seek(const LoaderCursor& c) {
  if (c.step < 0 || c.sample < 0 || c.micro < 0) fail("data", "loader cursor has a negative field");
  if (c.seed != opt_.seed)
    fail("data", "loader cursor was saved with seed " + std::to_string(c.seed) + ", this run uses " +
                     std::to_string(opt_.seed),
         "resume with the original seed, or start the data stream afresh");
  if (c.micro > 0 && (c.ranks != opt_.ranks || c.micro_batch != opt_.micro_batch))
    fail("data",
         "loader cursor stands inside step " + std::to_string(c.step) + " (micro-batch " +
             std::to_string(c.micro) + ") with " + std::to_string(c.ranks) + " ranks x micro_batch " +
             std::to_string(c.micro_batch) + "; this run has " + std::to_string(opt_.ranks) + " x " +
             std::to_string(opt_.micro_batch),
         "a different rank count or micro-batch can only resume at a step boundary");
  if (c.plan != plan().fingerprint())
    log::warn(
        "data: the phase plan differs from the one the cursor was saved with; the stream continues at global "
        "sample " +
        std::to_string(c.sample) + " under the new plan");
  check_alignment(c.step, c.sample);  // before stopping: a rejected seek leaves the loader as it was
  stop();
  {
    std::lock_guard<std::mutex> lk(mu_);
    consumed_ = Pos{c.step, c.sample, c.micro};
  }
  start();
}

void Loader::seek_step(int64_t step, int64_t sample) {
  LoaderCursor c = cursor();
  c.step = step;
  c.sample = sample;
  c.micro = 0;
  seek(c);
}

// ---------------------------------------------------------------------------------------------
// EvalSet

struct EvalSet::Set {
  std::string name;
  Loader::Open data;
  int64_t tiles = 0, windows = 0;
};

EvalSet::EvalSet(EvalSet&&) noexcept = default;
EvalSet& EvalSet::operator=(EvalSet&&) noexcept = default;
EvalSet::~EvalSet() = default;

EvalSet EvalSet::open(const std::vector<DatasetSpec>& datasets, int64_t seq_len, int64_t max_windows,
                      std::optional<uint32_t> expected_tokenizer_hash) {
  if (seq_len < 1) fail("data", "eval seq_len is " + std::to_string(seq_len) + ", expected >= 1");
  if (max_windows < 0)
    fail("data", "eval max_windows is " + std::to_string(max_windows) + ", expected >= 0 (0 = all)");
  EvalSet e;
  e.seq_len_ = seq_len;
  for (const DatasetSpec& d : datasets) {
    const Manifest m = read_manifest(d.dir);
    auto it = m.splits.find("val");
    if (it == m.splits.end() || it->second.tokens < uint64_t(seq_len) + 1) {
      e.skipped_.push_back(d.name + " (" + d.dir + ": " +
                           (it == m.splits.end() ? std::string("no val split")
                                                 : std::to_string(it->second.tokens) + " val tokens") +
                           ")");
      continue;
    }
    auto s = std::make_unique<Set>();
    s->name = d.name;
    s->data.dir = d.dir;
    s->data.ds = ShardDataset::open(d.dir, {"val", expected_tokenizer_hash, ShardVerify::Structure});
    uint64_t at = 0;
    for (size_t i = 0; i < s->data.ds.shard_count(); ++i) {
      s->data.starts.push_back(at);
      at += s->data.ds.shard(i).tokens();
    }
    s->tiles = int64_t((s->data.ds.tokens() - 1) / uint64_t(seq_len));
    s->windows = max_windows > 0 ? std::min(max_windows, s->tiles) : s->tiles;
    e.sets_.push_back(std::move(s));
  }
  return e;
}

const std::string& EvalSet::name(size_t d) const { return sets_.at(d)->name; }
int64_t EvalSet::windows(size_t d) const { return sets_.at(d)->windows; }

void EvalSet::fill(size_t d, int64_t first, int64_t n, int32_t* inputs, int32_t* targets,
                   std::vector<int32_t>* doc_starts) const {
  const Set& s = *sets_.at(d);
  if (first < 0 || n < 0 || first + n > s.windows)
    fail("data", "eval windows [" + std::to_string(first) + ", " + std::to_string(first + n) +
                     ") requested, but '" + s.name + "' has " + std::to_string(s.windows));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t w = (first + i) * s.tiles / s.windows;  // evenly spaced when thinned
    read_window(s.data, uint64_t(w * seq_len_), seq_len_, true, s.data.ds.vocab_size(), inputs + i * seq_len_,
                targets + i * seq_len_, doc_starts);
  }
}

}  // namespace zaya
