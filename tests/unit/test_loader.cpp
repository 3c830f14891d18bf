// The training data loader (src/data/loader.h, src/data/mixture.h): mixture frequencies, epoch
// coverage, exact phase transitions, determinism, the same global stream for 1, 2 and 3
// data-parallel ranks (also across a resume with a different rank count), prefetch thread ==
// direct calls, errors from a bad shard reaching the caller with the file name, cursors, and
// the held-out evaluation windows. The corpus is two datasets prepared with prepare_shards
// through a SentencePiece tokenizer trained here with spm_train.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/loader.h"
#include "data/mixture.h"
#include "data/shard_format.h"
#include "data/shard_reader.h"
#include "data/shard_writer.h"
#include "test_helpers.h"
#include "train/schedule.h"

namespace {

namespace fs = std::filesystem;
using zaya::DatasetSpec;
using zaya::Loader;
using zaya::LoaderCursor;
using zaya::LoaderOptions;
using zaya::MicroBatchInfo;
using zaya::PhaseSpec;

const std::vector<std::string> kWeb = {"the",  "people", "of",    "this", "nation", "will",   "build", "a",
                                       "road", "to",     "peace", "and",  "work",   "across", "every", "state"};
const std::vector<std::string> kCode = {"def", "return", "int", "x", "=", "(", ")", "for", "in", "range", "if",
                                        "else", "{", "}", ";", "0", "1"};

std::string make_text(const std::vector<std::string>& words, uint64_t seed, size_t n) {
  std::string s;
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    if (i) s += (x >> 61) == 0 ? "\n" : " ";
    s += words[(x >> 33) % words.size()];
  }
  return s;
}

std::string jsonl_line(const std::string& text) {
  std::string esc;
  for (char c : text) {
    if (c == '\n') esc += "\\n";
    else if (c == '"') esc += "\\\"";
    else if (c == '\\') esc += "\\\\";
    else esc += c;
  }
  return "{\"text\": \"" + esc + "\"}\n";
}

using zaya::test::expect_error;

struct Row {
  std::vector<int32_t> in, tg, starts;
  bool operator==(const Row&) const = default;
};

class LoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("zaya_loader_test_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_ / "in");
    {
      std::ofstream out(*dir_ / "spm_corpus.txt");
      for (int i = 0; i < 200; ++i) out << make_text(kWeb, uint64_t(i) + 1000, 12) << "\n";
      for (int i = 0; i < 200; ++i) out << make_text(kCode, uint64_t(i) + 5000, 12) << "\n";
    }
    const std::string prefix = (*dir_ / "tok").string();
    const std::string cmd = "spm_train --input=" + (*dir_ / "spm_corpus.txt").string() + " --model_prefix=" + prefix +
                            " --vocab_size=300 --hard_vocab_limit=false --model_type=bpe --character_coverage=1.0 --byte_fallback=true"
                            " --bos_id=1 --eos_id=2 --unk_id=0 --minloglevel=2 > " +
                            (*dir_ / "train.log").string() + " 2>&1";
    status_ = std::system(cmd.c_str());
    if (status_ != 0) return;
    auto corpus = [&](const std::string& name, const std::vector<std::string>& words, int docs, uint64_t seed) {
      std::ofstream out(*dir_ / "in" / (name + ".jsonl"));
      for (int i = 0; i < docs; ++i) out << jsonl_line(make_text(words, seed + uint64_t(i), size_t(8 + (i * 37) % 150)));
    };
    corpus("web", kWeb, 500, 1);
    corpus("code", kCode, 300, 100000);
    prepare("web", 0.1);
    prepare("code", 0.0);
  }
  static void prepare(const std::string& name, double val_fraction) {
    zaya::PrepareOptions o;
    o.tokenizer = (*dir_ / "tok.model").string();
    o.inputs = {(*dir_ / "in" / (name + ".jsonl")).string()};
    o.out_dir = (*dir_ / name).string();
    o.shard_bytes = 16 << 10;  // many small shards: windows cross shard boundaries
    o.val_fraction = val_fraction;
    o.threads = 1;
    zaya::prepare_shards(o);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    if (status_ != 0)
      GTEST_FAIL() << "spm_train failed (status " << status_ << "); install it with scripts/setup.sh (Debian package "
                   << "'sentencepiece')";
  }

  static std::string web() { return (*dir_ / "web").string(); }
  static std::string code() { return (*dir_ / "code").string(); }
  static PhaseSpec phase(const std::string& name, int64_t tokens, int64_t seq_len, double w_web, double w_code) {
    PhaseSpec p;
    p.name = name;
    p.tokens = tokens;
    p.seq_len = seq_len;
    p.mixture = {{"web", web(), w_web}, {"code", code(), w_code}};
    return p;
  }
  static LoaderOptions options(std::vector<PhaseSpec> phases, uint64_t seed = 7, int64_t micro = 2,
                               int64_t prefetch = 3) {
    LoaderOptions o;
    o.phases = std::move(phases);
    o.seed = seed;
    o.micro_batch = micro;
    o.prefetch = prefetch;
    return o;
  }
  // One micro-batch as rows.
  static std::vector<Row> take(Loader& l, MicroBatchInfo* info) {
    const int64_t M = l.options().micro_batch, L = l.max_seq_len();
    std::vector<int32_t> in(size_t(M * L)), tg(size_t(M * L));
    l.next(in.data(), tg.data(), info);
    std::vector<Row> rows;
    for (int64_t q = 0; q < M; ++q) {
      Row r;
      r.in.assign(in.begin() + q * info->seq_len, in.begin() + (q + 1) * info->seq_len);
      r.tg.assign(tg.begin() + q * info->seq_len, tg.begin() + (q + 1) * info->seq_len);
      r.starts.assign(info->doc_starts.begin() + info->doc_offsets[size_t(q)],
                      info->doc_starts.begin() + info->doc_offsets[size_t(q) + 1]);
      rows.push_back(std::move(r));
    }
    return rows;
  }
  // Whole steps of the global stream as seen by R simulated ranks: step -> {global sample -> row}.
  static std::vector<std::map<int64_t, Row>> run_ranks(LoaderOptions base, int64_t R, int64_t steps,
                                                        const LoaderCursor* resume = nullptr,
                                                        LoaderCursor* end = nullptr) {
    std::vector<std::unique_ptr<Loader>> ranks;
    for (int64_t r = 0; r < R; ++r) {
      LoaderOptions o = base;
      o.rank = r;
      o.ranks = R;
      ranks.push_back(std::make_unique<Loader>(o));
      if (resume) ranks.back()->seek(*resume);
    }
    std::vector<std::map<int64_t, Row>> out;
    const int64_t first_step = ranks[0]->cursor().step;
    for (int64_t s = 0; s < steps; ++s) {
      std::map<int64_t, Row> step;
      for (auto& l : ranks) {
        MicroBatchInfo info;
        do {
          auto rows = take(*l, &info);
          EXPECT_EQ(info.step, first_step + s);
          for (size_t q = 0; q < rows.size(); ++q) {
            EXPECT_TRUE(step.emplace(info.samples[q], rows[q]).second) << "sample " << info.samples[q] << " twice";
          }
        } while (!info.last_in_step());
      }
      out.push_back(std::move(step));
    }
    if (end) *end = ranks[0]->cursor();
    return out;
  }

  static inline fs::path* dir_ = nullptr;
  static inline int status_ = -1;
};

TEST_F(LoaderTest, MixtureFrequenciesAndContent) {
  Loader l(options({phase("main", 0, 32, 0.75, 0.25)}));
  const auto& s = l.sampler();
  EXPECT_EQ(s.block_slots(0, 0), 49152);
  EXPECT_EQ(s.block_slots(0, 1), 16384);
  // Exact proportions over a whole block, statistical over a prefix.
  int64_t web = 0;
  for (int64_t i = 0; i < zaya::kMixtureBlock; ++i) web += s.sample_at(7, i).dataset == 0;
  EXPECT_EQ(web, 49152);
  web = 0;
  const int64_t n = 20000;
  for (int64_t i = 0; i < n; ++i) web += s.sample_at(7, zaya::kMixtureBlock * 3 + i).dataset == 0;
  EXPECT_NEAR(double(web) / double(n), 0.75, 0.01);

  // A row is exactly the dataset's tokens at the window, shifted by one for targets, and the
  // document starts agree with the shard index.
  std::vector<int32_t> in(32), tg(32), starts;
  for (int64_t i = 0; i < 300; ++i) {
    starts.clear();
    const zaya::SampleRef r = l.read_sample(i, in.data(), tg.data(), &starts);
    const zaya::ShardDataset& ds = l.dataset(0, size_t(r.dataset));
    EXPECT_EQ(r.start % 32, 0);
    std::vector<uint32_t> want(33);
    ds.read(uint64_t(r.start), 33, want.data());
    std::vector<int32_t> expect_starts;
    for (uint64_t d = 0; d < ds.documents(); ++d) {
      const uint64_t st = ds.document_start(d);
      if (st >= uint64_t(r.start) && st < uint64_t(r.start) + 32) expect_starts.push_back(int32_t(st - uint64_t(r.start)));
    }
    for (int t = 0; t < 32; ++t) {
      ASSERT_EQ(in[size_t(t)], int32_t(want[size_t(t)]));
      ASSERT_EQ(tg[size_t(t)], int32_t(want[size_t(t) + 1]));
    }
    EXPECT_EQ(starts, expect_starts) << "sample " << i;
    // EOS precedes every document start (except at the window's first position).
    for (int32_t p : starts) {
      if (p > 0) {
        EXPECT_EQ(in[size_t(p) - 1], 2);
      }
    }
  }
}

TEST_F(LoaderTest, EpochVisitsEveryWindowOnce) {
  PhaseSpec p = phase("web-only", 0, 64, 1, 1);
  p.mixture.resize(1);
  Loader l(options({p}));
  const int64_t W = l.sampler().windows(0, 0);
  ASSERT_GT(W, 100);
  ASSERT_LT(W, zaya::kMixtureBlock);
  std::map<int64_t, int64_t> visits;
  for (int64_t i = 0; i < W; ++i) {
    zaya::SampleRef r = l.sampler().sample_at(3, i);
    ++visits[r.start];
  }
  // The first block is a permutation of visit numbers, so after one block every window was
  // visited floor(K/W) or ceil(K/W) times, and each full epoch exactly once.
  std::map<int64_t, int64_t> all;
  std::map<int64_t, std::set<int64_t>> by_epoch;
  for (int64_t i = 0; i < zaya::kMixtureBlock; ++i) {
    zaya::SampleRef r = l.sampler().sample_at(3, i);
    ++all[r.start];
    EXPECT_TRUE(by_epoch[r.epoch].insert(r.start).second) << "window " << r.start << " twice in epoch " << r.epoch;
  }
  EXPECT_EQ(int64_t(all.size()), W);
  for (auto [start, c] : all) {
    EXPECT_GE(c, zaya::kMixtureBlock / W);
    EXPECT_LE(c, zaya::kMixtureBlock / W + 1);
  }
  for (int64_t e = 0; e < zaya::kMixtureBlock / W; ++e) EXPECT_EQ(int64_t(by_epoch[e].size()), W);
}

TEST_F(LoaderTest, PhaseTransitionAtExactTokenCount) {
  // Phase A: 64 samples of 32 tokens (2048 tokens), web-heavy; phase B: 64 tokens, code only.
  PhaseSpec a = phase("web", 64 * 32, 32, 0.9, 0.1);
  PhaseSpec b = phase("code-long", 0, 64, 1, 1);
  b.mixture.erase(b.mixture.begin());
  b.rope_theta = 1e6;
  zaya::PhasePlan plan({a, b});
  EXPECT_EQ(plan.phase_at_tokens(0), 0u);
  EXPECT_EQ(plan.phase_at_tokens(2047), 0u);
  EXPECT_EQ(plan.phase_at_tokens(2048), 1u);
  EXPECT_EQ(plan.phase_at_tokens(int64_t(1) << 60), 1u);
  EXPECT_EQ(plan.sample_end(0), 64);
  EXPECT_EQ(plan.token_start(1), 2048);
  EXPECT_EQ(plan.phase_of_sample(63), 0u);
  EXPECT_EQ(plan.phase_of_sample(64), 1u);
  EXPECT_EQ(plan.tokens_before_sample(64), 2048);
  EXPECT_EQ(plan.tokens_before_sample(66), 2048 + 128);
  EXPECT_EQ(plan.max_seq_len(), 64);

  LoaderOptions o = options({a, b}, 7, 4);
  o.global_batch = [](int64_t) { return 8; };
  Loader l(o);
  std::vector<int32_t> in(4 * 64), tg(4 * 64);
  MicroBatchInfo info;
  int64_t tokens = 0;
  for (int k = 0; k < 20; ++k) {
    const int64_t before = tokens;
    l.next(in.data(), tg.data(), &info);
    tokens += info.rows * info.seq_len;
    EXPECT_EQ(size_t(info.phase), plan.phase_at_tokens(before)) << "micro-batch " << k;
    EXPECT_EQ(info.seq_len, info.phase == 0 ? 32 : 64);
    EXPECT_EQ(info.step, k / 2);
    for (const auto& r : info.refs) {
      EXPECT_EQ(r.phase, info.phase);
      if (info.phase == 1) {
        EXPECT_EQ(r.dataset, 0);  // phase 1's only dataset: code
      }
    }
    if (k == 15) {
      EXPECT_EQ(tokens, 2048);
    }
    if (k == 16) {
      EXPECT_EQ(info.phase, 1);
    }
  }
  EXPECT_EQ(plan.phase_of_sample(l.cursor().sample), 1u);

  // A budget that ends inside a step is rejected with the valid neighbours.
  LoaderOptions bad = o;
  bad.phases[0].tokens = 60 * 32;
  expect_error([&] { Loader x(bad); }, {"phase 0 ('web')", "1920 tokens", "step 7", "1792 or 2048"});
  // Plan validation.
  expect_error([&] { zaya::PhasePlan({phase("x", 100, 32, 1, 1), b}); }, {"phase 0 ('x')", "not a multiple of seq_len 32", "96 or 128"});
  expect_error([&] { zaya::PhasePlan({phase("x", 0, 32, 1, 1), b}); }, {"only the last phase may be 0"});
  expect_error([&] { zaya::PhasePlan({phase("x", 64, 32, 1, -1)}); }, {"'code'", "weight"});
  PhaseSpec moved = phase("y", 0, 32, 1, 1);
  moved.mixture[1].dir = web();
  expect_error([&] { zaya::PhasePlan({phase("x", 64, 32, 1, 1), moved}); }, {"dataset 'code'", "earlier phase"});
  expect_error([&] { Loader x(options({phase("x", 0, 100000, 1, 1)})); }, {"fewer than seq_len + 1", "dataset 'code'"});
}

TEST_F(LoaderTest, Determinism) {
  auto stream = [&](uint64_t seed) {
    Loader l(options({phase("main", 0, 48, 0.6, 0.4)}, seed, 3));
    std::vector<std::vector<Row>> out;
    MicroBatchInfo info;
    for (int k = 0; k < 25; ++k) out.push_back(take(l, &info));
    return out;
  };
  const auto a = stream(11), b = stream(11), c = stream(12);
  EXPECT_EQ(a, b);
  int differ = 0;
  for (size_t k = 0; k < a.size(); ++k) differ += a[k] != c[k];
  EXPECT_GE(differ, 20);
}

TEST_F(LoaderTest, SameGlobalStreamForAnyRankCountAndResume) {
  // Batch ramp 12 -> 24 sequences over 4 steps (granularity 12 = micro 2 x 6, divisible by
  // micro x R for R = 1, 2, 3); two phases, the first exactly 6 steps long.
  zaya::BatchRamp ramp;
  ramp.start_sequences = 12;
  ramp.full_sequences = 24;
  ramp.ramp_steps = 4;
  ramp.granularity = 12;
  ramp.validate();
  // Steps 0..5 take at(0..5) sequences; phase 0 ends exactly at sequences_before(6).
  const int64_t phase0_samples = ramp.sequences_before(6);
  LoaderOptions base = options({phase("a", phase0_samples * 32, 32, 0.7, 0.3), phase("b", 0, 48, 0.2, 0.8)}, 5, 2);
  base.global_batch = [ramp](int64_t s) { return ramp.at(s); };
  const int64_t steps = 10;
  const auto one = run_ranks(base, 1, steps);
  for (int64_t R : {2, 3}) {
    const auto many = run_ranks(base, R, steps);
    ASSERT_EQ(many.size(), one.size());
    for (int64_t s = 0; s < steps; ++s) EXPECT_TRUE(many[size_t(s)] == one[size_t(s)]) << R << " ranks, step " << s;
  }
  // Each step covers exactly [sequences_before(s), sequences_before(s+1)).
  for (int64_t s = 0; s < steps; ++s) {
    const auto& m = one[size_t(s)];
    ASSERT_EQ(int64_t(m.size()), ramp.at(s));
    EXPECT_EQ(m.begin()->first, ramp.sequences_before(s));
    EXPECT_EQ(m.rbegin()->first, ramp.sequences_before(s + 1) - 1);
    EXPECT_EQ(int64_t(m.begin()->second.in.size()), s < 6 ? 32 : 48);
  }
  // Resume in the middle (step 4, before the phase change) with a different rank count; the
  // cursor travels as JSON.
  LoaderCursor mid;
  auto first = run_ranks(base, 2, 4, nullptr, &mid);
  EXPECT_EQ(mid.step, 4);
  EXPECT_EQ(mid.sample, ramp.sequences_before(4));
  EXPECT_EQ(mid.micro, 0);
  const LoaderCursor back = zaya::cursor_from_json(zaya::cursor_to_json(mid));
  EXPECT_EQ(back, mid);
  auto rest = run_ranks(base, 3, steps - 4, &back);
  first.insert(first.end(), rest.begin(), rest.end());
  ASSERT_EQ(first.size(), one.size());
  for (int64_t s = 0; s < steps; ++s) EXPECT_TRUE(first[size_t(s)] == one[size_t(s)]) << "resumed, step " << s;
  // Also from the plain step number (a checkpoint without a cursor).
  {
    LoaderOptions o = base;
    Loader l(o);
    l.seek_step(7, ramp.sequences_before(7));
    MicroBatchInfo info;
    auto rows = take(l, &info);
    EXPECT_EQ(info.step, 7);
    EXPECT_EQ(info.samples[0], ramp.sequences_before(7));
    EXPECT_TRUE(rows[0] == one[7].at(info.samples[0]));
  }
  // A mid-step cursor cannot change the rank count.
  {
    LoaderOptions o = base;
    o.ranks = 2;
    Loader l(o);
    MicroBatchInfo info;
    take(l, &info);
    LoaderCursor c = l.cursor();
    EXPECT_EQ(c.micro, 1);
    LoaderOptions o3 = base;
    o3.ranks = 3;
    Loader l3(o3);
    expect_error([&] { l3.seek(c); }, {"inside step 0", "step boundary"});
  }
}

TEST_F(LoaderTest, PrefetchMatchesDirectCalls) {
  std::vector<PhaseSpec> phases = {phase("a", 40 * 16, 16, 1, 1), phase("b", 0, 40, 1, 3)};
  auto stream = [&](int64_t prefetch, std::vector<MicroBatchInfo>* infos) {
    LoaderOptions o = options(phases, 9, 4, prefetch);
    o.global_batch = [](int64_t s) { return s % 2 ? 8 : 4; };  // steps of 4 and 8: 12 per 2 steps
    o.phases[0].tokens = 36 * 16;                             // 6 steps of phase a
    Loader l(o);
    std::vector<std::vector<Row>> out;
    for (int k = 0; k < 40; ++k) {
      infos->emplace_back();
      out.push_back(take(l, &infos->back()));
    }
    return out;
  };
  std::vector<MicroBatchInfo> i0, i3;
  const auto direct = stream(0, &i0), pre = stream(3, &i3);
  ASSERT_EQ(direct, pre);
  for (size_t k = 0; k < i0.size(); ++k) {
    EXPECT_EQ(i0[k].samples, i3[k].samples);
    EXPECT_EQ(i0[k].refs, i3[k].refs);
    EXPECT_EQ(i0[k].doc_offsets, i3[k].doc_offsets);
  }
  // And both equal read_sample row by row.
  LoaderOptions o = options(phases, 9, 4, 0);
  o.phases[0].tokens = 36 * 16;
  o.global_batch = [](int64_t s) { return s % 2 ? 8 : 4; };
  Loader l(o);
  for (size_t k = 0; k < i0.size(); ++k) {
    for (size_t q = 0; q < i0[k].samples.size(); ++q) {
      Row r;
      r.in.resize(size_t(i0[k].seq_len));
      r.tg.resize(size_t(i0[k].seq_len));
      l.read_sample(i0[k].samples[q], r.in.data(), r.tg.data(), &r.starts);
      EXPECT_TRUE(r == direct[k][q]) << "micro-batch " << k << " row " << q;
    }
  }
}

TEST_F(LoaderTest, ErrorsFromABadShardNameTheFile) {
  // Token ids beyond the vocabulary pass structure verification at open and fail when read,
  // i.e. on the prefetch thread.
  const fs::path bad = *dir_ / "code_bad";
  fs::remove_all(bad);
  fs::copy(code(), bad);
  for (const auto& e : fs::directory_iterator(bad)) {
    if (e.path().extension() != ".zshard") continue;
    auto r = zaya::ShardReader::open(e.path().string());
    const uint64_t T = r->tokens();
    r.reset();
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(zaya::kShardHeaderBytes);
    const std::string ff(size_t(T) * 4, '\xff');
    f.write(ff.data(), std::streamsize(ff.size()));
  }
  for (int64_t prefetch : {0, 2}) {
    PhaseSpec p = phase("main", 0, 32, 1, 1);
    p.mixture[1].dir = bad.string();
    Loader l(options({p}, 1, 4, prefetch));
    std::vector<int32_t> in(4 * 32), tg(4 * 32);
    std::string first;
    try {
      for (int k = 0; k < 50; ++k) l.next(in.data(), tg.data());
    } catch (const zaya::Error& e) {
      first = e.what();
    }
    EXPECT_NE(first.find((bad / "train-").string()), std::string::npos) << first;
    EXPECT_NE(first.find(".zshard"), std::string::npos) << first;
    EXPECT_NE(first.find("not below the vocab size"), std::string::npos) << first;
    // Sticky: the same error again.
    expect_error([&] { l.next(in.data(), tg.data()); }, {first.substr(0, first.find(" (hint"))});
  }  // the destructor joins a thread that stopped on an error
  // A shard that fails validation fails at construction, naming the file.
  const fs::path bad2 = *dir_ / "code_magic";
  fs::remove_all(bad2);
  fs::copy(code(), bad2);
  {
    std::fstream f(bad2 / "train-00001.zshard", std::ios::in | std::ios::out | std::ios::binary);
    f.write("NOTSHARD", 8);
  }
  PhaseSpec p = phase("main", 0, 32, 1, 1);
  p.mixture[1].dir = bad2.string();
  expect_error([&] { Loader x(options({p})); }, {(bad2 / "train-00001.zshard").string(), "bad magic"});
  p.mixture[1].dir = (*dir_ / "missing").string();
  expect_error([&] { Loader x(options({p})); }, {"missing"});
}

TEST_F(LoaderTest, CursorRoundTripAndSeek) {
  LoaderOptions o = options({phase("main", 0, 32, 0.5, 0.5)}, 21, 2);
  o.global_batch = [](int64_t) { return 6; };
  Loader l(o);
  MicroBatchInfo info;
  for (int k = 0; k < 7; ++k) take(l, &info);
  const LoaderCursor c = l.cursor();
  EXPECT_EQ(c.step, 2);
  EXPECT_EQ(c.micro, 1);
  EXPECT_EQ(c.sample, 12);
  EXPECT_EQ(c.seed, 21u);
  const std::string js = zaya::cursor_to_json(c);
  EXPECT_NE(js.find("\"format\":\"zaya-loader-cursor\""), std::string::npos) << js;
  EXPECT_EQ(zaya::cursor_from_json(js), c);
  std::vector<std::vector<Row>> after;
  for (int k = 0; k < 5; ++k) after.push_back(take(l, &info));
  // Seek back on the same loader and on a fresh one (mid-step, same ranks): same data.
  l.seek(c);
  EXPECT_EQ(l.cursor(), c);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(take(l, &info), after[size_t(k)]) << k;
  Loader fresh(o);
  fresh.seek(zaya::cursor_from_json(js));
  for (int k = 0; k < 5; ++k) EXPECT_EQ(take(fresh, &info), after[size_t(k)]) << k;
  // Malformed cursors and a different seed.
  expect_error([] { zaya::cursor_from_json("{"); }, {"invalid JSON"});
  expect_error([] { zaya::cursor_from_json("{\"format\":\"zaya-loader-cursor\",\"version\":1}"); }, {"'step'"});
  LoaderCursor other = c;
  other.seed = 22;
  expect_error([&] { fresh.seek(other); }, {"seed 22", "21"});
  const auto sixth = take(l, &info);  // l and fresh both stand after the 5 micro-batches
  EXPECT_EQ(take(fresh, &info), sixth);  // a rejected seek leaves the loader where it was
  EXPECT_EQ(info.step, 4);
  EXPECT_EQ(info.micro, 0);
}

TEST_F(LoaderTest, EvalWindowsFromTheValSplit) {
  auto e = zaya::EvalSet::open({{"web", web(), 1}, {"code", code(), 1}}, 32);
  ASSERT_EQ(e.datasets(), 1u);  // code was prepared without a val split
  ASSERT_EQ(e.skipped().size(), 1u);
  EXPECT_NE(e.skipped()[0].find("no val split"), std::string::npos);
  auto val = zaya::ShardDataset::open(web(), {"val", std::nullopt, zaya::ShardVerify::Structure});
  EXPECT_EQ(e.windows(0), int64_t((val.tokens() - 1) / 32));
  std::vector<int32_t> in(3 * 32), tg(3 * 32);
  e.fill(0, 2, 3, in.data(), tg.data());
  std::vector<uint32_t> want(32 * 3 + 1);
  val.read(64, want.size(), want.data());
  for (size_t t = 0; t < 96; ++t) {
    ASSERT_EQ(in[t], int32_t(want[t]));
    ASSERT_EQ(tg[t], int32_t(want[t + 1]));
  }
  auto thin = zaya::EvalSet::open({{"web", web(), 1}}, 32, 5);
  EXPECT_EQ(thin.windows(0), 5);
  expect_error([&] { thin.fill(0, 4, 2, in.data(), tg.data()); }, {"eval windows [4, 6)", "'web' has 5"});
}

TEST(LoaderUnits, DocumentSegmentsAndPermutation) {
  const int32_t starts[] = {0, 3, 7};
  int32_t seg[10];
  zaya::document_segments(starts, 3, 10, seg);
  EXPECT_EQ(std::vector<int32_t>(seg, seg + 10), (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 3, 7, 7, 7}));
  const int32_t s2[] = {5};
  zaya::document_segments(s2, 1, 8, seg);
  EXPECT_EQ(std::vector<int32_t>(seg, seg + 8), (std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5, 5}));
  zaya::document_segments(s2, 0, 8, seg);
  EXPECT_EQ(std::vector<int32_t>(seg, seg + 8), std::vector<int32_t>(8, 0));
  for (uint64_t n : {1ull, 2ull, 3ull, 17ull, 1000ull, 4097ull}) {
    std::vector<bool> seen(n);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t j = zaya::permute_index(i, n, 99);
      ASSERT_LT(j, n);
      EXPECT_FALSE(seen[j]);
      seen[j] = true;
    }
  }
}

}  // namespace
