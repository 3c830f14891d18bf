// Sharded (format version 2) checkpoints with the single-process communicator: round trip,
// a staging budget far smaller than the state, tiling errors named by tensor, background
// writing with poll(), a failing save that leaves the previous checkpoint intact, fallback
// past a damaged newest checkpoint, arbitrary range reads, reshaping 1 -> 2 -> 3 -> 1 ranks,
// version 1 checkpoints through the same reader, the LPT ownership policy, and `zaya ckpt
// reshape` / `zaya ckpt inspect` on sharded checkpoints.
// Multi-process saves are checked by tests/mpi/dist_ckpt_check.cpp under mpirun.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/dist_checkpoint.h"
#include "ckpt/ownership.h"
#include "core/error.h"
#include "dist/comm.h"

#include "../common/error_of.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zaya;

namespace {

using test::error_of;

struct TempDir {
  std::string path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = (fs::temp_directory_path() /
            ("zaya_dckpt_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(::getpid())))
               .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path) / name).string(); }
};

std::vector<float> ramp(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + 0.5f * float(i);
  return v;
}

// A small training state: a tensor of each group, one empty tensor.
struct State {
  std::map<std::string, std::vector<int64_t>> shapes{
      {"embed", {16, 8}}, {"blocks.0.w", {8, 24}}, {"opt.m.embed", {16, 8}}, {"balancer.bias", {5}}, {"empty", {0, 3}}};
  std::map<std::string, std::string> groups{{"embed", "params"},
                                            {"blocks.0.w", "params"},
                                            {"opt.m.embed", "optimizer"},
                                            {"balancer.bias", "balancer"},
                                            {"empty", "params"}};
  std::map<std::string, std::vector<float>> data;
  explicit State(float seed) {
    float b = seed;
    for (const auto& [name, shape] : shapes) {
      size_t n = 1;
      for (int64_t d : shape) n *= size_t(d);
      data[name] = ramp(n, b);
      b += 1000;
    }
  }
  // Whole tensors, except "blocks.0.w" in three pieces.
  std::vector<DistPiece> pieces() const {
    std::vector<DistPiece> out;
    for (const auto& [name, shape] : shapes) {
      const auto& v = data.at(name);
      if (name == "blocks.0.w") {
        out.push_back({name, shape, 0, 50, v.data(), groups.at(name)});
        out.push_back({name, shape, 50, 1, v.data() + 50, groups.at(name)});
        out.push_back({name, shape, 51, v.size() - 51, v.data() + 51, groups.at(name)});
      } else {
        out.push_back({name, shape, 0, v.size(), v.data(), groups.at(name)});
      }
    }
    return out;
  }
  void expect_equal(const DistCheckpoint& ck) const {
    EXPECT_EQ(ck.names().size(), shapes.size());
    for (const auto& [name, shape] : shapes) {
      ASSERT_TRUE(ck.contains(name)) << name;
      EXPECT_EQ(ck.shape(name), shape) << name;
      EXPECT_EQ(ck.group(name), groups.at(name)) << name;
      std::vector<float> got(data.at(name).size() + 1, -1.0f);
      ck.read(name, shape, got.data());
      got.pop_back();
      EXPECT_EQ(got, data.at(name)) << name;
    }
  }
};

DistWriterOptions quiet(DistWriterOptions o = {}) {
  o.warn = [](const std::string&) {};
  return o;
}

DistLoadOptions quiet_load(std::vector<std::string>* warnings = nullptr, DistVerify v = DistVerify::Full) {
  DistLoadOptions o;
  o.verify = v;
  o.warn = [warnings](const std::string& w) {
    if (warnings) warnings->push_back(w);
  };
  return o;
}

struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

void flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(at));
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x40);
  f.seekp(std::streamoff(at));
  f.write(&c, 1);
}

// ---------------------------------------------------------------------------------------------

TEST(DistCheckpoint, RoundTripSingleRank) {
  TempDir tmp;
  auto comm = make_single_comm();
  State s(1.0f);
  DistCheckpointWriter w(*comm, quiet());
  const json meta = {{"tokens", 12345}, {"cursor", {{"epoch", 2}}}};
  DistSaveStats begun = w.begin_save(tmp.path, 7, s.pieces(), meta);
  EXPECT_TRUE(w.pending());
  EXPECT_EQ(begun.step, 7);
  EXPECT_FALSE(begun.committed);
  // The data was staged: changing the tensors now must not change the checkpoint.
  const State original(1.0f);
  for (auto& [name, v] : s.data)
    for (float& x : v) x = -x;
  DistSaveStats st = w.finish();
  EXPECT_FALSE(w.pending());
  EXPECT_TRUE(st.committed);
  EXPECT_EQ(st.dir, tmp / "step-00000007");
  EXPECT_EQ(st.world_size, 1);
  EXPECT_GT(st.bytes, 0u);
  EXPECT_EQ(st.total_bytes, st.bytes);
  EXPECT_GE(st.write_seconds, 0.0);
  EXPECT_GE(st.stall_seconds(), st.begin_seconds);
  EXPECT_TRUE(fs::exists(tmp / "step-00000007/manifest.json"));
  EXPECT_TRUE(fs::exists(tmp / "step-00000007/rank-00000.bin"));
  EXPECT_EQ(fs::file_size(tmp / "step-00000007/rank-00000.bin"), st.bytes);
  for (const auto& e : fs::directory_iterator(tmp.path))
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();

  DistCheckpoint ck = open_dist_checkpoint(st.dir, quiet_load());
  EXPECT_EQ(ck.step(), 7);
  EXPECT_EQ(ck.version(), 2);
  EXPECT_EQ(ck.world_size(), 1);
  EXPECT_EQ(ck.meta(), meta);
  original.expect_equal(ck);
  EXPECT_EQ(ck.manifest()["tensors"][0]["dtype"], "F32");
  EXPECT_TRUE(verify_dist_checkpoint(st.dir).ok());
  // finish() with nothing pending returns the last save.
  EXPECT_EQ(w.finish().step, 7);
  EXPECT_EQ(w.last_committed().dir, st.dir);
}

TEST(DistCheckpoint, StagingBudgetSmallerThanStateStillCompletes) {
  TempDir tmp;
  auto comm = make_single_comm();
  std::vector<float> big = ramp(300000, 3.0f);  // 1.2 MB through 8 KiB of staging
  std::vector<float> second = ramp(1001, -7.0f);
  size_t copies = 0, copied = 0;
  DistWriterOptions o = quiet();
  o.staging_bytes = 8192;
  o.chunk_bytes = 4096;
  o.writer_threads = 3;
  o.copy = [&](void* dst, const void* src, size_t n) {
    ++copies;
    copied += n;
    std::memcpy(dst, src, n);
  };
  DistCheckpointWriter w(*comm, o);
  std::vector<DistPiece> pieces = {{"big", {300, 1000}, 0, big.size(), big.data(), "params"},
                                   {"second", {1001}, 0, second.size(), second.data(), "optimizer"}};
  w.begin_save(tmp.path, 1, pieces, json::object());
  DistSaveStats st = w.finish();
  EXPECT_EQ(copied, (big.size() + second.size()) * 4);
  EXPECT_EQ(copies, (big.size() * 4 + 4095) / 4096 + (second.size() * 4 + 4095) / 4096);
  DistCheckpoint ck = open_dist_checkpoint(st.dir, quiet_load());
  std::vector<float> got(big.size());
  ck.read("big", {300, 1000}, got.data());
  EXPECT_EQ(got, big);
  got.assign(second.size(), 0);
  ck.read("second", {1001}, got.data());
  EXPECT_EQ(got, second);
}

TEST(DistCheckpoint, GapsOverlapsAndBadPiecesAreRefusedNamingTheTensor) {
  TempDir tmp;
  auto comm = make_single_comm();
  DistCheckpointWriter w(*comm, quiet());
  std::vector<float> v = ramp(100, 0.0f);
  std::vector<DistPiece> gap = {{"layer.w", {10, 10}, 0, 40, v.data(), "params"},
                                {"layer.w", {10, 10}, 50, 50, v.data() + 50, "params"}};
  std::string e = error_of([&] { w.begin_save(tmp.path, 1, gap, {}); });
  EXPECT_NE(e.find("layer.w"), std::string::npos) << e;
  EXPECT_NE(e.find("[40, 50)"), std::string::npos) << e;
  EXPECT_NE(e.find("gap"), std::string::npos) << e;

  std::vector<DistPiece> overlap = {{"layer.w", {10, 10}, 0, 60, v.data(), "params"},
                                    {"layer.w", {10, 10}, 50, 50, v.data() + 50, "params"}};
  e = error_of([&] { w.begin_save(tmp.path, 1, overlap, {}); });
  EXPECT_NE(e.find("layer.w"), std::string::npos) << e;
  EXPECT_NE(e.find("owned twice"), std::string::npos) << e;

  std::vector<DistPiece> tail_gap = {{"layer.w", {10, 10}, 0, 99, v.data(), "params"}};
  e = error_of([&] { w.begin_save(tmp.path, 1, tail_gap, {}); });
  EXPECT_NE(e.find("[99, 100)"), std::string::npos) << e;

  std::vector<DistPiece> outside = {{"layer.w", {10, 10}, 90, 20, v.data(), "params"}};
  e = error_of([&] { w.begin_save(tmp.path, 1, outside, {}); });
  EXPECT_NE(e.find("outside"), std::string::npos) << e;

  std::vector<DistPiece> shapes = {{"layer.w", {10, 10}, 0, 50, v.data(), "params"},
                                   {"layer.w", {100}, 50, 50, v.data() + 50, "params"}};
  e = error_of([&] { w.begin_save(tmp.path, 1, shapes, {}); });
  EXPECT_NE(e.find("disagree on its shape"), std::string::npos) << e;

  std::vector<DistPiece> group = {{"layer.w", {10, 10}, 0, 100, v.data(), "bad group!"}};
  e = error_of([&] { w.begin_save(tmp.path, 1, group, {}); });
  EXPECT_NE(e.find("group"), std::string::npos) << e;

  std::vector<DistPiece> null_data = {{"layer.w", {10, 10}, 0, 100, nullptr, "params"}};
  e = error_of([&] { w.begin_save(tmp.path, 1, null_data, {}); });
  EXPECT_NE(e.find("no data pointer"), std::string::npos) << e;

  EXPECT_FALSE(w.pending());
  EXPECT_FALSE(fs::exists(tmp / "step-00000001"));
  EXPECT_FALSE(fs::exists(tmp / ".tmp-step-00000001"));
  // The writer is still usable after refusals.
  std::vector<DistPiece> good = {{"layer.w", {10, 10}, 0, 100, v.data(), "params"}};
  w.begin_save(tmp.path, 1, good, {});
  EXPECT_TRUE(w.finish().committed);
}

TEST(DistCheckpoint, PollCommitsOnlyAfterTheWritesFinishAndRetentionPrunes) {
  TempDir tmp;
  auto comm = make_single_comm();
  ScopedEnv delay("ZAYA_CKPT_TEST_WRITE_DELAY_MS", "40");
  DistWriterOptions o = quiet();
  o.chunk_bytes = 4096;
  o.staging_bytes = 1 << 20;
  o.writer_threads = 1;
  o.keep_last = 2;
  // before_commit: called once per save, when the files are written and before the commit.
  int commits_announced = 0;
  bool committed_when_announced = false;
  o.before_commit = [&] {
    ++commits_announced;
    if (fs::exists(tmp / "step-00000010")) committed_when_announced = true;
  };
  DistCheckpointWriter w(*comm, o);
  std::vector<float> v = ramp(5 * 1024, 1.0f);  // 5 chunks of 40 ms
  std::vector<DistPiece> pieces = {{"w", {5, 1024}, 0, v.size(), v.data(), "params"}};
  w.begin_save(tmp.path, 10, pieces, {{"step", 10}});
  EXPECT_FALSE(w.poll().has_value());  // still writing
  EXPECT_EQ(commits_announced, 0);      // a poll that finds the files unwritten waits for nothing
  EXPECT_TRUE(w.pending());
  EXPECT_TRUE(fs::exists(tmp / ".tmp-step-00000010"));
  EXPECT_FALSE(fs::exists(tmp / "step-00000010"));
  std::optional<DistSaveStats> done;
  for (int i = 0; i < 200 && !done; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    done = w.poll();
  }
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->committed);
  EXPECT_EQ(commits_announced, 1);
  EXPECT_FALSE(committed_when_announced);
  EXPECT_GE(done->write_seconds, 0.15);
  EXPECT_LT(done->begin_seconds, done->write_seconds);
  EXPECT_TRUE(fs::exists(tmp / "step-00000010/manifest.json"));
  // begin_save while a save is pending finishes it first; keep_last = 2 prunes step 10.
  w.begin_save(tmp.path, 20, pieces, {{"step", 20}});
  w.begin_save(tmp.path, 30, pieces, {{"step", 30}});
  EXPECT_EQ(w.last_committed().step, 20);
  EXPECT_EQ(w.finish().step, 30);
  EXPECT_EQ(commits_announced, 3);  // begin_save and finish() commit through the same path
  auto all = list_checkpoints(tmp.path);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 30);
  EXPECT_EQ(all[1].step, 20);
  auto latest = load_latest_dist_checkpoint(tmp.path, quiet_load());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->meta()["step"], 30);
}

TEST(DistCheckpoint, FailedSaveLeavesThePreviousCheckpointIntact) {
  TempDir tmp;
  auto comm = make_single_comm();
  std::vector<float> v = ramp(4096, 2.0f);
  std::vector<DistPiece> pieces = {{"w", {4096}, 0, v.size(), v.data(), "params"}};
  int calls = 0;
  DistWriterOptions o = quiet();
  o.chunk_bytes = 4096;
  o.copy = [&](void* dst, const void* src, size_t n) {
    if (++calls == 7) throw std::runtime_error("device copy failed (simulated)");
    std::memcpy(dst, src, n);
  };
  DistCheckpointWriter w(*comm, o);
  w.begin_save(tmp.path, 1, pieces, {});
  EXPECT_TRUE(w.finish().committed);
  w.begin_save(tmp.path, 2, pieces, {});  // fails in the 3rd chunk; begin_save itself returns
  std::string e = error_of([&] { w.finish(); });
  EXPECT_NE(e.find("device copy failed (simulated)"), std::string::npos) << e;
  EXPECT_NE(e.find("step 2"), std::string::npos) << e;
  EXPECT_FALSE(w.pending());
  EXPECT_FALSE(fs::exists(tmp / "step-00000002"));
  EXPECT_FALSE(fs::exists(tmp / ".tmp-step-00000002"));
  auto latest = load_latest_dist_checkpoint(tmp.path, quiet_load());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step(), 1);
  // A root that cannot be created fails in begin_save, naming it.
  std::ofstream(tmp / "file") << "x";
  e = error_of([&] { w.begin_save(tmp / "file/sub", 3, pieces, {}); });
  EXPECT_NE(e.find(tmp / "file/sub"), std::string::npos) << e;
}

TEST(DistCheckpoint, DestroyingTheWriterWithAPendingSaveCommitsNothing) {
  TempDir tmp;
  auto comm = make_single_comm();
  ScopedEnv delay("ZAYA_CKPT_TEST_WRITE_DELAY_MS", "30");
  std::vector<float> v = ramp(64 * 1024, 2.0f);
  {
    DistWriterOptions o = quiet();
    o.chunk_bytes = 4096;
    DistCheckpointWriter w(*comm, o);
    w.begin_save(tmp.path, 5, {{"w", {64 * 1024}, 0, v.size(), v.data(), "params"}}, {});
  }
  EXPECT_FALSE(fs::exists(tmp / "step-00000005"));
  EXPECT_FALSE(load_latest_dist_checkpoint(tmp.path, quiet_load()).has_value());
}

TEST(DistCheckpoint, DamagedNewestCheckpointFallsBack) {
  TempDir tmp;
  auto comm = make_single_comm();
  DistCheckpointWriter w(*comm, quiet());
  State s1(1.0f), s2(2.0f), s3(3.0f);
  w.begin_save(tmp.path, 100, s1.pieces(), {{"step", 100}});
  w.begin_save(tmp.path, 200, s2.pieces(), {{"step", 200}});
  w.begin_save(tmp.path, 300, s3.pieces(), {{"step", 300}});
  w.finish();
  // step 300: a flipped data byte; step 200: a truncated rank file. Plus a leftover .tmp-.
  flip_byte(tmp / "step-00000300/rank-00000.bin", 10);  // in balancer.bias, the first piece
  fs::resize_file(tmp / "step-00000200/rank-00000.bin", 12);
  fs::create_directories(tmp / ".tmp-step-00000400");

  std::vector<std::string> warnings;
  auto latest = load_latest_dist_checkpoint(tmp.path, quiet_load(&warnings));
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step(), 100);
  s1.expect_equal(*latest);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("step-00000300"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("checksum mismatch for tensor"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("truncated"), std::string::npos) << warnings[1];

  // The collective loader agrees (one rank here).
  warnings.clear();
  auto agreed = load_latest_dist_checkpoint(tmp.path, *comm, quiet_load(&warnings));
  ASSERT_TRUE(agreed.has_value());
  EXPECT_EQ(agreed->step(), 100);
  EXPECT_EQ(warnings.size(), 2u);

  // Lazy opening accepts step 300, and the damaged piece throws when read.
  DistCheckpoint lazy = open_dist_checkpoint(tmp / "step-00000300", quiet_load(nullptr, DistVerify::Lazy));
  std::vector<float> buf(200);
  std::string e = error_of([&] { lazy.read("balancer.bias", 0, 5, buf.data()); });  // first in the file
  EXPECT_NE(e.find("checksum mismatch for tensor 'balancer.bias'"), std::string::npos) << e;

  CheckpointReport r = verify_dist_checkpoint(tmp / "step-00000300");
  EXPECT_FALSE(r.ok());
  ASSERT_GE(r.problems.size(), 2u);  // the piece and the file
  EXPECT_TRUE(r.manifest.is_object());

  // A manifest with a flipped digit is refused by its self-checksum.
  flip_byte(tmp / "step-00000100/manifest.json", 60);
  e = error_of([&] { open_dist_checkpoint(tmp / "step-00000100", quiet_load()); });
  EXPECT_NE(e.find("manifest"), std::string::npos) << e;
  EXPECT_FALSE(load_latest_dist_checkpoint(tmp.path, quiet_load()).has_value());
}

TEST(DistCheckpoint, ReadsArbitraryRangesAcrossPieces) {
  TempDir tmp;
  auto comm = make_single_comm();
  std::vector<float> v = ramp(10007, -3.0f);
  std::vector<DistPiece> pieces;
  std::mt19937_64 rng(3);
  for (uint64_t at = 0; at < v.size();) {
    uint64_t len = std::min<uint64_t>(1 + rng() % 900, v.size() - at);
    pieces.push_back({"t", {10007}, at, len, v.data() + at, "params"});
    at += len;
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);  // declaration order does not matter
  DistWriterOptions o = quiet();
  o.chunk_bytes = 1000;
  DistCheckpointWriter w(*comm, o);
  w.begin_save(tmp.path, 1, pieces, {});
  DistSaveStats st = w.finish();
  DistCheckpoint ck = open_dist_checkpoint(st.dir, quiet_load(nullptr, DistVerify::Lazy));
  EXPECT_EQ(ck.numel("t"), v.size());
  for (int trial = 0; trial < 300; ++trial) {
    uint64_t a = rng() % (v.size() + 1), b = rng() % (v.size() + 1);
    if (a > b) std::swap(a, b);
    std::vector<float> got(b - a + 1, 12345.0f);
    ck.read("t", a, b - a, got.data());
    EXPECT_EQ(got.back(), 12345.0f);  // nothing past the range
    got.pop_back();
    EXPECT_TRUE(std::equal(got.begin(), got.end(), v.begin() + long(a))) << a << ".." << b;
  }
  std::vector<float> one(1);
  std::string e = error_of([&] { ck.read("t", 10000, 8, one.data()); });
  EXPECT_NE(e.find("cannot read [10000, 10008)"), std::string::npos) << e;
  e = error_of([&] { ck.read("nope", 0, 1, one.data()); });
  EXPECT_NE(e.find("no tensor named 'nope'"), std::string::npos) << e;
  e = error_of([&] { ck.read("t", {7}, one.data()); });
  EXPECT_NE(e.find("expected [7]"), std::string::npos) << e;
}

TEST(DistCheckpoint, ReshapeOneTwoThreeOneKeepsEveryTensor) {
  TempDir tmp;
  auto comm = make_single_comm();
  State s(5.0f);
  DistCheckpointWriter w(*comm, quiet());
  w.begin_save(tmp / "n1", 42, s.pieces(), {{"tokens", 99}});
  const std::string d1 = w.finish().dir;

  // 1 -> 2: every tensor split at its middle element (mid-row), halves to ranks 0 and 1.
  DistReshapeOptions split;
  split.ownership = [](const std::string&, const std::vector<int64_t>& shape) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);
    return std::vector<DistOwnedRange>{{0, 0, n / 2}, {1, n / 2, n - n / 2}};
  };
  const std::string d2 = reshape_dist_checkpoint(open_dist_checkpoint(d1, quiet_load()), tmp / "n2", 2, split);
  DistCheckpoint c2 = open_dist_checkpoint(d2, quiet_load());
  EXPECT_EQ(c2.world_size(), 2);
  EXPECT_EQ(c2.step(), 42);
  EXPECT_EQ(c2.meta()["tokens"], 99);
  EXPECT_EQ(c2.manifest()["reshaped_from"]["world_size"], 1);
  EXPECT_TRUE(fs::exists(d2 + "/rank-00001.bin"));
  s.expect_equal(c2);

  // 2 -> 3 with the default policy (whole tensors, LPT on numel).
  const std::string d3 = reshape_dist_checkpoint(c2, tmp / "n3", 3);
  DistCheckpoint c3 = open_dist_checkpoint(d3, quiet_load());
  EXPECT_EQ(c3.world_size(), 3);
  s.expect_equal(c3);
  std::vector<double> costs;
  for (const auto& n : c2.names()) costs.push_back(numel_cost(c2.shape(n)));
  const std::vector<int> owner = assign_whole_tensors(costs, 3);
  const auto names = c2.names();
  for (const auto& t : c3.manifest()["tensors"]) {
    size_t i = size_t(std::find(names.begin(), names.end(), t["name"].get<std::string>()) - names.begin());
    ASSERT_EQ(t["pieces"].size(), 1u);
    EXPECT_EQ(t["pieces"][0]["rank"], owner[i]) << t["name"];
  }
  EXPECT_TRUE(verify_dist_checkpoint(d3).ok());

  // 3 -> 1.
  const std::string d4 = reshape_dist_checkpoint(c3, tmp / "n4", 1);
  DistCheckpoint c4 = open_dist_checkpoint(d4, quiet_load());
  EXPECT_EQ(c4.world_size(), 1);
  s.expect_equal(c4);
  // The rank files of n1 and n4 hold the same tensors; both verify.
  EXPECT_TRUE(verify_dist_checkpoint(d4).ok());

  // Bad ownership is refused naming the tensor; writing next to the input is refused.
  DistReshapeOptions bad;
  bad.ownership = [](const std::string&, const std::vector<int64_t>& shape) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);
    return std::vector<DistOwnedRange>{{0, 0, n > 0 ? n - 1 : 0}};
  };
  std::string e = error_of([&] { reshape_dist_checkpoint(c4, tmp / "bad", 2, bad); });
  EXPECT_NE(e.find("gap"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(tmp / "bad/step-00000042"));
  e = error_of([&] { reshape_dist_checkpoint(c4, tmp / "n4", 2); });
  EXPECT_NE(e.find("another directory"), std::string::npos) << e;
}

TEST(DistCheckpoint, VersionOneCheckpointsOpenAndReshape) {
  TempDir tmp;
  std::vector<float> a = ramp(60, 1.0f), b = ramp(7, 9.0f);
  save_checkpoint(tmp / "v1", 3,
                  {{"a", {6, 10}, a.data(), "params"}, {"b", {7}, b.data(), "optimizer"}}, {{"tokens", 5}}, 0);
  auto ck = load_latest_dist_checkpoint(tmp / "v1", quiet_load());
  ASSERT_TRUE(ck.has_value());
  EXPECT_EQ(ck->version(), 1);
  EXPECT_EQ(ck->step(), 3);
  EXPECT_EQ(ck->group("b"), "optimizer");
  std::vector<float> got(10);
  ck->read("a", 25, 10, got.data());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), a.begin() + 25));
  const std::string d = reshape_dist_checkpoint(*ck, tmp / "v2", 2);
  DistCheckpoint c2 = open_dist_checkpoint(d, quiet_load());
  EXPECT_EQ(c2.version(), 2);
  EXPECT_EQ(c2.meta()["tokens"], 5);
  got.assign(60, 0);
  c2.read("a", {6, 10}, got.data());
  EXPECT_EQ(got, a);
  // The version 1 loader refuses version 2 with a clear message.
  std::string e = error_of([&] { load_checkpoint(d); });
  EXPECT_NE(e.find("format version 2 is newer"), std::string::npos) << e;
}

// `zaya ckpt reshape` and `zaya ckpt inspect` on sharded checkpoints, with the real binary.
struct CommandResult {
  int status;
  std::string output;
};

CommandResult run_zaya(const std::string& args) {
  const std::string cmd = std::string(ZAYA_BINARY_DIR) + "/bin/zaya " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(DistCheckpointCli, ReshapeAndInspect) {
  TempDir tmp;
  auto comm = make_single_comm();
  State s(4.0f);
  {
    DistCheckpointWriter w(*comm, quiet());
    w.begin_save(tmp / "n1", 8, s.pieces(), {{"tokens", 3}});
    w.finish();
  }
  auto r = run_zaya("ckpt reshape --in " + tmp / "n1" + " --ranks 3 --out " + tmp / "n3");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(3 ranks)"), std::string::npos) << r.output;
  DistCheckpoint c3 = open_dist_checkpoint(tmp / "n3/step-00000008", quiet_load());
  EXPECT_EQ(c3.world_size(), 3);
  s.expect_equal(c3);

  r = run_zaya("ckpt inspect " + tmp / "n3/step-00000008");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("version 2 (sharded), world size 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("blocks.0.w"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("verify      OK"), std::string::npos) << r.output;

  flip_byte(tmp / "n3/step-00000008/rank-00000.bin", 4);
  r = run_zaya("ckpt inspect " + tmp / "n3");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("DAMAGED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checksum mismatch for tensor"), std::string::npos) << r.output;

  r = run_zaya("ckpt reshape --in " + tmp / "n3" + " --ranks 2 --out " + tmp / "n2");  // no valid checkpoint left
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("no valid checkpoint"), std::string::npos) << r.output;
}

TEST(Ownership, LptGreedyIsDeterministic) {
  EXPECT_EQ(assign_whole_tensors({5, 4, 3, 3, 3}, 2), (std::vector<int>{0, 1, 1, 0, 1}));
  EXPECT_EQ(assign_whole_tensors({1, 1, 1, 1}, 3), (std::vector<int>{0, 1, 2, 0}));
  EXPECT_EQ(assign_whole_tensors({2, 10, 2}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(assign_whole_tensors({}, 4), std::vector<int>{});
  EXPECT_EQ(assign_whole_tensors({7, 1}, 3), (std::vector<int>{0, 1}));
  EXPECT_EQ(numel_cost({3, 4}), 12.0);
  EXPECT_EQ(numel_cost({}), 1.0);
  EXPECT_NE(error_of([] { assign_whole_tensors({1}, 0); }).find("ranks"), std::string::npos);
  EXPECT_NE(error_of([] { assign_whole_tensors({-1}, 2); }).find("cost"), std::string::npos);
}

}  // namespace
