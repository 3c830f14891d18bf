// dist_ckpt_check: sharded checkpoints across processes. Run under `mpirun -np N` (or alone,
// as one rank). Every value of the test state is a pure function of (tensor, element), so any
// world size can check any checkpoint.
//
//   dist_ckpt_check save ROOT        N ranks save steps 10 and 20, each rank owning a different
//                                    mix (whole tensors by LPT, uneven flat slices of the
//                                    optimizer state, one tensor on the last rank); poll() in a
//                                    mock training loop that overwrites the tensors; then a
//                                    failure on one rank must fail the save on every rank and a
//                                    conflicting piece table must be refused on every rank;
//                                    finally the ranks reload step 20 and check every value.
//   dist_ckpt_check load ROOT        M ranks (any M) load the latest checkpoint (step 20,
//                                    whatever N saved it) and check what they own and the rest.
//   dist_ckpt_check big-save ROOT STEP MIB [PID_DIR]
//                                    saves one MIB-MiB tensor sliced over the ranks at STEP,
//                                    writing each rank's pid to PID_DIR/pid.RANK first (the
//                                    kill -9 test, dist_ckpt_kill_test.sh).
//   dist_ckpt_check slow-disk ROOT  (ROOT unused) agree_after_disk_work with the last rank's
//                                    disk work taking 12 s (run it under a shorter comm
//                                    watchdog): no rank may time out, its error reaches every
//                                    rank, and an exception thrown by rank 0's work is agreed too.
//   dist_ckpt_check big-verify ROOT STEP MIB
//                                    the latest checkpoint under ROOT is STEP, verifies, and
//                                    holds big-save's values.
// Rank 0 prints "dist_ckpt_check: <mode> ... OK"; every rank exits 0, or 1 on any failure.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../common/error_of.h"
#include "ckpt/dist_agree.h"
#include "ckpt/dist_checkpoint.h"
#include "ckpt/ownership.h"
#include "core/error.h"
#include "dist/comm.h"
#include "rank_checks.h"

namespace fs = std::filesystem;
using namespace zaya;

namespace {

using rank_checks::expect;
using rank_checks::g_failures;
using rank_checks::g_rank;
using test::error_of;

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h % 1000;
}

// Exactly representable: an integer below 2^20, times 0.25, plus a small integer.
float value(const std::string& name, uint64_t i, int64_t salt = 0) {
  return float((i * 7919 + name_hash(name)) % 1000003) * 0.25f + float(salt);
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string group;
  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);
    return n;
  }
};

const std::vector<TensorSpec>& specs() {
  static const std::vector<TensorSpec> s = {
      {"embed", {97, 33}, "params"},
      {"blocks.0.attn.w", {64, 48}, "params"},
      {"blocks.0.mlp.w", {128, 40}, "params"},
      {"blocks.1.mlp.w", {128, 40}, "params"},
      {"norm", {33}, "params"},
      {"opt.m.blocks.0.mlp.w", {128, 40}, "optimizer"},
      {"opt.v.blocks.0.mlp.w", {128, 40}, "optimizer"},
      {"opt.m.embed", {97, 33}, "optimizer"},
      {"balancer.bias", {2, 5}, "balancer"},
      {"empty", {0}, "params"},
  };
  return s;
}

struct Range {
  uint64_t offset = 0, length = 0;
};

// What `rank` of `ranks` owns of each tensor: params whole by LPT, optimizer state in uneven
// flat slices (rank r's share grows with r, so boundaries fall mid-row), the balancer on the
// last rank, "empty" on rank 0.
std::map<std::string, std::vector<Range>> ownership(int rank, int ranks) {
  std::map<std::string, std::vector<Range>> out;
  std::vector<double> costs;
  std::vector<std::string> params;
  for (const auto& t : specs())
    if (t.group == "params" && t.name != "empty") {
      params.push_back(t.name);
      costs.push_back(double(t.numel()));
    }
  const std::vector<int> owner = assign_whole_tensors(costs, ranks);
  for (size_t i = 0; i < params.size(); ++i)
    if (owner[i] == rank)
      for (const auto& t : specs())
        if (t.name == params[i]) out[t.name].push_back({0, t.numel()});
  const uint64_t total_weight = uint64_t(ranks) * uint64_t(ranks + 1) / 2;
  for (const auto& t : specs()) {
    if (t.group == "optimizer") {
      const uint64_t n = t.numel();
      const uint64_t lo = n * (uint64_t(rank) * uint64_t(rank + 1) / 2) / total_weight;
      const uint64_t hi = n * (uint64_t(rank + 1) * uint64_t(rank + 2) / 2) / total_weight;
      out[t.name].push_back({lo, hi - lo});
    }
    if (t.group == "balancer" && rank == ranks - 1) out[t.name].push_back({0, t.numel()});
    if (t.name == "empty" && rank == 0) out[t.name].push_back({0, 0});
  }
  return out;
}

// This rank's buffers and the pieces describing them.
struct Local {
  std::map<std::string, std::vector<std::vector<float>>> buffers;
  std::vector<DistPiece> pieces;
  Local(int rank, int ranks, int64_t salt) {
    for (const auto& [name, ranges] : ownership(rank, ranks)) {
      const TensorSpec* spec = nullptr;
      for (const auto& t : specs())
        if (t.name == name) spec = &t;
      for (const Range& r : ranges) {
        std::vector<float> v(r.length);
        for (uint64_t i = 0; i < r.length; ++i) v[i] = value(name, r.offset + i, salt);
        buffers[name].push_back(std::move(v));
        pieces.push_back({name, spec->shape, r.offset, r.length, buffers[name].back().data(), spec->group});
      }
    }
    // Fix the pointers (vectors of vectors may have moved while growing).
    std::map<std::string, size_t> next;
    for (DistPiece& p : pieces) p.data = buffers[p.name][next[p.name]++].data();
  }
  void scribble() {
    for (auto& [name, list] : buffers)
      for (auto& v : list)
        for (float& x : v) x = -1.0f;
  }
};

// Checks every tensor of the test state in `ck`: this rank's ranges (for `ranks` ranks) and
// then each whole tensor.
void check_state(const DistCheckpoint& ck, int rank, int ranks, int64_t salt, const std::string& where) {
  for (const auto& [name, ranges] : ownership(rank, ranks))
    for (const Range& r : ranges) {
      std::vector<float> got(r.length + 1, 777.0f);
      ck.read(name, r.offset, r.length, got.data());
      uint64_t bad = 0;
      for (uint64_t i = 0; i < r.length; ++i) bad += got[i] != value(name, r.offset + i, salt);
      expect(bad == 0 && got[r.length] == 777.0f,
             where + ": owned range of " + name + " has " + std::to_string(bad) + " wrong values");
    }
  for (const auto& t : specs()) {
    expect(ck.contains(t.name), where + ": missing " + t.name);
    if (!ck.contains(t.name)) continue;
    expect(ck.shape(t.name) == t.shape && ck.group(t.name) == t.group, where + ": shape/group of " + t.name);
    std::vector<float> got(t.numel());
    ck.read(t.name, t.shape, got.data());
    uint64_t bad = 0;
    for (uint64_t i = 0; i < t.numel(); ++i) bad += got[i] != value(t.name, i, salt);
    expect(bad == 0, where + ": " + t.name + " has " + std::to_string(bad) + " wrong values");
  }
}

DistWriterOptions small_staging() {
  DistWriterOptions o;
  o.staging_bytes = 64 << 10;  // far smaller than the state: begin_save must block and go on
  o.chunk_bytes = 16 << 10;
  o.writer_threads = 2;
  return o;
}

void run_save(Comm& comm, const std::string& root) {
  const int rank = comm.rank(), ranks = comm.size();
  if (rank == 0) fs::remove_all(root);
  comm.barrier()->wait();
  {
    DistWriterOptions o = small_staging();
    o.keep_last = 0;
    DistCheckpointWriter writer(comm, o);
    // A mock training loop: save at step 10, keep "training" (overwriting the tensors), poll at
    // every step boundary until the save commits.
    Local s10(rank, ranks, 10);
    writer.begin_save(root, 10, s10.pieces, {{"step", 10}, {"world", ranks}});
    s10.scribble();
    int steps = 0;
    std::optional<DistSaveStats> done;
    while (!done && steps < 100000) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++steps;
      done = writer.poll();
    }
    expect(done && done->committed && done->step == 10, "step 10 did not commit through poll()");
    if (done) expect(done->world_size == ranks, "stats world_size");
    Local s20(rank, ranks, 20);
    writer.begin_save(root, 20, s20.pieces, {{"step", 20}, {"world", ranks}});
    DistSaveStats st = writer.finish();
    expect(st.committed && st.dir == root + "/step-00000020", "step 20 did not commit: " + st.dir);
    expect(st.total_bytes >= st.bytes, "total bytes");
    if (rank == 0)
      std::printf("dist_ckpt_check: rank 0 wrote %llu of %llu bytes; stalled %.4f s, wrote in %.4f s\n",
                  (unsigned long long)st.bytes, (unsigned long long)st.total_bytes, st.stall_seconds(),
                  st.write_seconds);
  }

  // One rank's failure fails the save on every rank, and step 20 stays the latest.
  {
    const int bad_rank = ranks - 1;
    DistWriterOptions o = small_staging();
    int copies = 0;
    o.copy = [&](void* dst, const void* src, size_t n) {
      if (rank == bad_rank && ++copies == 2) throw std::runtime_error("simulated copy failure");
      std::memcpy(dst, src, n);
    };
    DistCheckpointWriter writer(comm, o);
    Local s30(rank, ranks, 30);
    writer.begin_save(root, 30, s30.pieces, {{"step", 30}});
    std::string e = error_of([&] { writer.finish(); });
    expect(e.find("simulated copy failure") != std::string::npos, "the failing save did not fail here: '" + e + "'");
    if (ranks > 1)
      expect(e.find("rank " + std::to_string(bad_rank) + ":") != std::string::npos, "error does not name the rank: " + e);
    comm.barrier()->wait();
    expect(!fs::exists(root + "/step-00000030"), "a failed save appeared as step-00000030");
    expect(!fs::exists(root + "/.tmp-step-00000030"), "a failed save left its temporary directory");
  }

  // A piece table that conflicts across ranks is refused on every rank, naming the tensor.
  {
    DistCheckpointWriter writer(comm, small_staging());
    Local s40(rank, ranks, 40);
    std::vector<float> norm(33, 1.0f);
    std::vector<DistPiece> pieces = s40.pieces;
    if (rank == ranks - 1 && ranks > 1) pieces.push_back({"norm", {33}, 0, 33, norm.data(), "params"});  // again
    if (ranks == 1)
      for (auto& p : pieces)
        if (p.name == "norm") p.length = 30;  // a gap instead
    std::string e = error_of([&] { writer.begin_save(root, 40, pieces, {}); });
    expect(e.find("'norm'") != std::string::npos &&
               e.find(ranks > 1 ? "owned twice" : "gap") != std::string::npos,
           "conflicting pieces were not refused naming 'norm': '" + e + "'");
    expect(!writer.pending(), "a refused save is pending");
  }

  auto ck = load_latest_dist_checkpoint(root, comm);
  expect(ck.has_value() && ck->step() == 20, "the latest checkpoint is not step 20");
  if (ck) {
    expect(ck->world_size() == ranks, "world_size " + std::to_string(ck->world_size()));
    expect(ck->meta()["world"] == ranks, "meta");
    check_state(*ck, rank, ranks, 20, "reload");
    auto older = open_dist_checkpoint(root + "/step-00000010");
    check_state(older, rank, ranks, 10, "step 10");
  }
}

void run_load(Comm& comm, const std::string& root) {
  auto ck = load_latest_dist_checkpoint(root, comm);
  expect(ck.has_value() && ck->step() == 20, "the latest checkpoint under " + root + " is not step 20");
  if (!ck) return;
  // The collective read (read_dist_tensors): each rank its own ranges, then one whole tensor.
  // It comes first: with ZAYA_CKPT_TEST_DISK_DELAY_MS the last rank's first read is slow, and
  // must not keep the others in one collective.
  std::vector<DistRead> reads;
  std::vector<std::vector<float>> got;
  std::vector<std::pair<std::string, Range>> what;
  for (const auto& [name, ranges] : ownership(comm.rank(), comm.size()))
    for (const Range& r : ranges) what.push_back({name, r});
  got.resize(what.size() + 1);
  for (size_t k = 0; k < what.size(); ++k) {
    got[k].assign(what[k].second.length, 777.0f);
    reads.push_back({what[k].first, {}, what[k].second.offset, what[k].second.length, got[k].data()});
  }
  const TensorSpec& whole = specs().front();
  got.back().assign(whole.numel(), 777.0f);
  reads.push_back({whole.name, whole.shape, 0, 0, got.back().data()});
  read_dist_tensors(*ck, comm, reads);
  uint64_t bad = 0;
  for (size_t k = 0; k < what.size(); ++k)
    for (uint64_t i = 0; i < what[k].second.length; ++i)
      bad += got[k][i] != value(what[k].first, what[k].second.offset + i, 20);
  for (uint64_t i = 0; i < whole.numel(); ++i) bad += got.back()[i] != value(whole.name, i, 20);
  expect(bad == 0, "read_dist_tensors: " + std::to_string(bad) + " wrong values");
  check_state(*ck, comm.rank(), comm.size(), 20, "load");
  // A read that fails on the last rank fails on every rank, naming it.
  std::vector<DistRead> missing;
  std::vector<float> one(1);
  if (comm.rank() == comm.size() - 1) missing.push_back({"no.such.tensor", {}, 0, 1, one.data()});
  std::string err;
  try {
    read_dist_tensors(*ck, comm, missing);
  } catch (const Error& e) {
    err = e.message();
  }
  const std::string who = comm.size() > 1 ? "rank " + std::to_string(comm.size() - 1) + ": " : "";
  expect(
      err.find(who) != std::string::npos && err.find("no tensor named 'no.such.tensor'") != std::string::npos,
      "the last rank's failed read, on every rank: '" + err + "'");
  // A shape mismatch keeps its hint on every rank.
  std::vector<DistRead> mismatched;
  if (comm.rank() == comm.size() - 1)
    mismatched.push_back({whole.name, std::vector<int64_t>{7}, 0, 0, one.data()});
  std::string hint;
  err.clear();
  try {
    read_dist_tensors(*ck, comm, mismatched);
  } catch (const Error& e) {
    err = e.message();
    hint = e.hint();
  }
  expect(err.find(who) != std::string::npos && err.find("expected [7]") != std::string::npos &&
             hint.find("does not match this model config") != std::string::npos,
         "the last rank's shape mismatch, on every rank: '" + err + "' (hint '" + hint + "')");
  if (comm.rank() == 0)
    std::printf("dist_ckpt_check: loaded step 20 saved by %d ranks with %d ranks\n", ck->world_size(), comm.size());
}

// One flat tensor "big" sliced evenly over the ranks, plus "small" on rank 0.
std::vector<DistPiece> big_pieces(int rank, int ranks, uint64_t numel, int64_t salt, std::vector<float>* mine,
                                  std::vector<float>* small) {
  const uint64_t lo = numel * uint64_t(rank) / uint64_t(ranks), hi = numel * uint64_t(rank + 1) / uint64_t(ranks);
  mine->resize(hi - lo);
  for (uint64_t i = lo; i < hi; ++i) (*mine)[i - lo] = value("big", i, salt);
  std::vector<DistPiece> pieces = {{"big", {int64_t(numel)}, lo, hi - lo, mine->data(), "params"}};
  if (rank == 0) {
    small->assign(100, float(salt));
    pieces.push_back({"small", {10, 10}, 0, 100, small->data(), "optimizer"});
  }
  return pieces;
}

void run_big_save(Comm& comm, const std::string& root, int64_t step, uint64_t mib, const std::string& pid_dir) {
  if (!pid_dir.empty()) {
    std::ofstream(pid_dir + "/pid." + std::to_string(comm.rank())) << ::getpid() << "\n";
  }
  std::vector<float> mine, small;
  auto pieces = big_pieces(comm.rank(), comm.size(), mib << 18, step, &mine, &small);
  DistWriterOptions o;
  o.staging_bytes = 4 << 20;
  o.chunk_bytes = 1 << 20;
  o.keep_last = 2;
  DistCheckpointWriter writer(comm, o);
  writer.begin_save(root, step, pieces, {{"step", step}});
  std::optional<DistSaveStats> done;
  while (!done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    done = writer.poll();
  }
  if (comm.rank() == 0)
    std::printf("dist_ckpt_check: big-save committed %s (%llu bytes; stall %.3f s, write %.3f s)\n",
                done->dir.c_str(), (unsigned long long)done->total_bytes, done->stall_seconds(), done->write_seconds);
}

void run_big_verify(const std::string& root, int64_t step, uint64_t mib) {
  std::vector<std::string> warnings;
  DistLoadOptions o;
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  auto ck = load_latest_dist_checkpoint(root, o);
  expect(ck.has_value(), "no valid checkpoint under " + root);
  if (!ck) return;
  expect(ck->step() == step, "the latest checkpoint is step " + std::to_string(ck->step()) + ", expected " +
                                 std::to_string(step));
  expect(warnings.empty(), "warnings while loading: " + (warnings.empty() ? std::string() : warnings.front()));
  CheckpointReport r = verify_dist_checkpoint(ck->dir());
  expect(r.ok(), "verify: " + (r.ok() ? std::string() : r.problems.front()));
  const uint64_t numel = mib << 18;
  std::vector<float> got(numel);
  ck->read("big", {int64_t(numel)}, got.data());
  uint64_t bad = 0;
  for (uint64_t i = 0; i < numel; ++i) bad += got[i] != value("big", i, ck->step());
  expect(bad == 0, std::to_string(bad) + " wrong values in 'big'");
  for (const auto& c : list_checkpoints(root))
    expect(c.step <= step, "a checkpoint of a later step exists: " + c.dir);
}

void run_slow_disk(Comm& comm) {
  const int last = comm.size() - 1;
  const auto t0 = std::chrono::steady_clock::now();
  std::string err = dist_agree::agree_after_disk_work(comm, 0.2, [&]() -> std::string {
    if (comm.rank() != last) return "";
    std::this_thread::sleep_for(std::chrono::seconds(12));
    return "disk full";
  });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  expect(err == "rank " + std::to_string(last) + ": disk full", "the slow rank's error: '" + err + "'");
  expect(waited >= 11.5,
         "every rank waits for the slow rank's work (waited " + std::to_string(waited) + " s)");
  std::function<std::string()> throwing;
  if (comm.rank() == 0) throwing = []() -> std::string { fail("checkpoint", "cannot rename"); };
  err = dist_agree::agree_after_disk_work(comm, 0.2, throwing);
  expect(err == "rank 0: cannot rename", "rank 0's exception: '" + err + "'");
}

}  // namespace

int main(int argc, char** argv) {
  rank_checks::g_program = "dist_ckpt_check";
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2) {
    std::fprintf(stderr,
                 "usage: dist_ckpt_check save|load|slow-disk ROOT | big-save ROOT STEP MIB [PID_DIR] | "
                 "big-verify ROOT STEP MIB\n");
    return 2;
  }
  const std::string mode = args[0], root = args[1];
  try {
    if (mode == "big-verify") {
      if (args.size() < 4) return 2;
      run_big_verify(root, std::atoll(args[2].c_str()), uint64_t(std::atoll(args[3].c_str())));
      if (g_failures == 0) std::printf("dist_ckpt_check: big-verify step %s OK\n", args[2].c_str());
      return g_failures == 0 ? 0 : 1;
    }
    auto comm = make_comm(CommOptions{});
    g_rank = comm->rank();
    if (mode == "save") run_save(*comm, root);
    else if (mode == "load") run_load(*comm, root);
    else if (mode == "slow-disk")
      run_slow_disk(*comm);
    else if (mode == "big-save" && args.size() >= 4)
      run_big_save(*comm, root, std::atoll(args[2].c_str()), uint64_t(std::atoll(args[3].c_str())),
                   args.size() > 4 ? args[4] : "");
    else {
      std::fprintf(stderr, "dist_ckpt_check: unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    // Every rank's verdict.
    int32_t failed = g_failures > 0, any = 0;
    comm->all_reduce(&failed, &any, 1, CommType::I32, ReduceOp::Max)->wait();
    if (comm->rank() == 0 && any == 0) std::printf("dist_ckpt_check: %s with %d ranks OK\n", mode.c_str(), comm->size());
    return any == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_ckpt_check: rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
}
