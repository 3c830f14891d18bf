// Checkpoint stall benchmark: the sharded asynchronous save (ckpt/dist_checkpoint.h, as the
// trainer uses it) against a naive synchronous save of the same training state.
//
// Runs as one process or under `mpirun -np N`. Every rank builds the trainer's state for a
// ZAYA model of >= 500M parameters exactly as `zaya train` does (Model, DataParallel with its
// ZeRO-1 owners, Optimizer with the owned mask, BiasBalancer, TrainState), fills parameters and
// optimizer/balancer state with deterministic random values (so files are not sparse or
// zero), and saves what the trainer saves: owned_pieces(TrainState) plus a meta JSON with
// all_counters().
//
// --warmup unmeasured saves of every variant come first (the writers' staging buffers are
// allocated on first use and kept, as in a long training run); then --rounds rounds.
// Variants, alternated within each round (order reversed on odd rounds), each on a clean
// page cache state (sync() first), after --pause seconds of idle disk (checkpoints are minutes
// apart in training), and deleted after it committed:
//  * async-<staging>: DistCheckpointWriter::begin_save, then simulated training steps (a fixed
//    cblas_sgemm loop on the calling thread, calibrated to --step-seconds), poll() after each
//    step until the save commits. Stall = DistSaveStats::stall_seconds() (begin_save plus
//    poll() waits, the time the training thread is blocked), max over ranks. The writer is
//    long-lived (as in the trainer), so its staging buffers are allocated once. staging
//    "256" is the trainer's default DistWriterOptions (256 MiB in 8 MiB chunks); "full" gives
//    enough staging memory for the whole shard (in --full-chunk-mib chunks, 1 MiB, so that
//    the many small tensors do not each hold an 8 MiB buffer), so begin_save never waits for
//    the disk. We also report the interference: the steps run while the save was in flight
//    took this much longer than
//    the same steps without a save (median of --baseline-steps steps right before), summed,
//    max over ranks; it is time lost to the background I/O that stall_seconds() cannot see.
//    lost = max over ranks of (stall + interference) on that rank: all the time the training
//    loop lost to the save (with several ranks the poll() all_reduce turns one rank's slower
//    steps into the others' waits, so the per-rank sums agree).
//  * naive: every rank's owned pieces go to rank 0 (point-to-point, in 64 MiB chunks, double
//    buffered: rank 0 receives the next chunk while writing the current one), rank 0 writes
//    one file (its own pieces straight from memory, then everyone else's, then a JSON index),
//    fsyncs it and its directory, then a barrier. Stall = wall time of all that on the training
//    thread, max over ranks.
// Bytes that reached the device are read from /proc/diskstats (sectors written by --disk, the
// whole device: other processes' writes count too) from the start of each variant to its
// commit (before anything else syncs: this is what the fsyncs pushed out), and again after a
// sync() that follows the commit (in the JSON).
//
// Prints a table on stdout (rank 0) and a final RESULT line; --json FILE writes everything.
// Run with OMP_NUM_THREADS=1 per rank (bench/run_checkpoint_bench.sh does).
#include <cblas.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/backend.h"
#include "bench_common.h"
#include "ckpt/dist_checkpoint.h"
#include "core/error.h"
#include "dist/comm.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"
#include "train/balancer.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"
#include "train/train_checkpoint.h"

namespace fs = std::filesystem;
using namespace zaya;
using bench::Clock;
using bench::median;
using bench::seconds_since;

namespace {

struct Args {
  std::string root = "/tmp/zaya_ckpt_bench";
  int rounds = 3;
  double step_seconds = 0.5;
  int baseline_steps = 3;
  int warmup = 1;              // unmeasured saves per variant before the rounds (warms staging pools)
  double pause_seconds = 10;   // idle time before each save, after sync() (lets the disk drain)
  int64_t full_chunk_mib = 1;  // chunk_bytes of the "full" staging variant
  std::vector<std::string> staging = {"256", "full"};  // MiB, or "full"
  std::string disk = "vda";
  std::string json_path;
  // Model shape: a zaya1-base-like shape scaled down to ~0.58B parameters.
  int64_t vocab = 32768, d = 1024, layers = 10, heads = 8, kv_heads = 2, head_dim = 128, experts = 16,
          inter = 1024, router = 256;
};

// A CLI11 check for each --staging entry: "full" or a positive number of MiB.
std::string check_staging(const std::string& s) {
  if (s == "full") return "";
  int64_t mib = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), mib);
  if (r.ec == std::errc() && r.ptr == s.data() + s.size() && mib > 0) return "";
  return "staging '" + s + "' is neither 'full' nor a positive number of MiB";
}

void add_options(CLI::App& app, Args& a) {
  app.add_option("--root", a.root, "Where the saves are written (each deleted after it committed)")
      ->capture_default_str();
  app.add_option("--rounds", a.rounds, "Measured rounds (every variant once per round)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "Unmeasured saves of every variant first")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--pause", a.pause_seconds, "Seconds of idle disk (after sync) before each save")
      ->capture_default_str();
  app.add_option("--step-seconds", a.step_seconds, "Duration of a simulated training step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--baseline-steps", a.baseline_steps, "Steps without a save measured before each async save")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--staging", a.staging, "Async variants, comma-separated: staging MiB or full")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::Validator(check_staging, "MiB|full"));
  app.add_option("--full-chunk-mib", a.full_chunk_mib, "Chunk size of the full staging variant, MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--disk", a.disk, "Block device whose written sectors are counted (/proc/diskstats)")
      ->capture_default_str();
  app.add_option("--json", a.json_path, "Write every result to this JSON file");
  app.add_option("--vocab", a.vocab, "Model vocabulary size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--d", a.d, "Model hidden size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--layers", a.layers, "Model blocks")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--experts", a.experts, "Experts per block")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--inter", a.inter, "Expert width")->capture_default_str()->check(CLI::PositiveNumber);
}

ModelConfig bench_config(const Args& a) {
  ModelConfig c = preset_config("zaya1-base");
  c.vocab_size = a.vocab;
  c.hidden_size = a.d;
  c.num_hidden_layers = a.layers;
  c.num_attention_heads = a.heads;
  c.num_key_value_heads = a.kv_heads;
  c.head_dim = a.head_dim;
  c.num_experts = a.experts;
  c.moe_intermediate_size = a.inter;
  c.router_hidden_size = a.router;
  c.max_position_embeddings = 4096;
  c.layer_types.assign(size_t(a.layers), "hybrid");
  c.skip_expert_output = SkipMode::Identity;
  validate_config(c, "bench_checkpoint config");
  return c;
}

// Deterministic pseudo-random floats in [-scale, scale) (splitmix64).
void fill_random(float* p, int64_t n, uint64_t seed, float scale) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (int64_t i = 0; i < n; ++i) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = (float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
  }
}

double reduce_max(Comm& comm, double v) {
  comm.all_reduce(&v, &v, 1, CommType::F64, ReduceOp::Max)->wait();
  return v;
}
std::vector<double> gather_doubles(Comm& comm, double v) {
  std::vector<double> out(size_t(comm.size()));
  comm.all_gather(&v, out.data(), std::vector<int64_t>(size_t(comm.size()), 1), CommType::F64)->wait();
  return out;
}
double reduce_sum(Comm& comm, double v) {
  comm.all_reduce(&v, &v, 1, CommType::F64, ReduceOp::Sum)->wait();
  return v;
}
void barrier(Comm& comm) { comm.barrier()->wait(); }

// Every rank's string, on every rank.
std::vector<std::string> gather_text(Comm& comm, const std::string& mine) {
  const int R = comm.size();
  std::vector<int64_t> len(size_t(R), 0), ones(size_t(R), 1);
  int64_t n = int64_t(mine.size());
  comm.all_gather(&n, len.data(), ones, CommType::I64)->wait();
  int64_t total = 0;
  for (int64_t l : len) total += l;
  std::string all(size_t(total), '\0');
  comm.all_gather(mine.data(), all.data(), len, CommType::U8)->wait();
  std::vector<std::string> out;
  int64_t off = 0;
  for (int r = 0; r < R; ++r) {
    out.push_back(all.substr(size_t(off), size_t(len[size_t(r)])));
    off += len[size_t(r)];
  }
  return out;
}

// Sectors (512 B) written by a block device so far; -1 if unknown.
int64_t disk_sectors_written(const std::string& dev) {
  std::ifstream f("/proc/diskstats");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    int64_t major = 0, minor = 0;
    std::string name;
    ss >> major >> minor >> name;
    if (name != dev) continue;
    int64_t v[7] = {};
    for (auto& x : v) ss >> x;  // reads, merged, sectors read, ms reading, writes, merged, sectors written
    return v[6];
  }
  return -1;
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(bytes, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("bench", path + ": write failed: " + std::strerror(errno));
    }
    p += w;
    bytes -= size_t(w);
  }
}

void fsync_path(const std::string& path, bool dir) {
  int fd = ::open(path.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) fail("bench", path + ": cannot open for fsync: " + std::strerror(errno));
  if (::fsync(fd) != 0) fail("bench", path + ": fsync failed: " + std::strerror(errno));
  ::close(fd);
}

// The simulated training step: a fixed number of 1024^3 sgemms on the calling thread.
struct Compute {
  int n = 1024;
  int reps = 1;
  std::vector<float> a, b, c;
  Compute() : a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n) {
    fill_random(a.data(), int64_t(a.size()), 11, 1.0f);
    fill_random(b.data(), int64_t(b.size()), 12, 1.0f);
  }
  void once() {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c.data(), n);
  }
  double step() {
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) once();
    return seconds_since(t0);
  }
};

struct RunResult {
  std::string variant;
  int round = 0;
  double stall = 0, begin = 0, wait = 0, prep = 0, total = 0, write = 0, commit = 0;
  int steps = 0;
  double baseline_step = 0, interference = 0, lost = 0;
  double bytes = 0;               // all ranks
  double disk_bytes = -1;         // sectors written by the device from the start to the commit x 512
  double disk_bytes_synced = -1;  // ... to after a sync() that followed the commit
  std::vector<double> rank_begin, rank_wait, rank_interference;  // per rank (async)
  nlohmann::json to_json() const {
    return {{"variant", variant},
            {"round", round},
            {"stall_s", stall},
            {"begin_s", begin},
            {"wait_s", wait},
            {"prep_s", prep},
            {"total_s", total},
            {"write_s", write},
            {"commit_s", commit},
            {"steps", steps},
            {"baseline_step_s", baseline_step},
            {"interference_s", interference},
            {"lost_s", lost},
            {"bytes", bytes},
            {"disk_bytes", disk_bytes},
            {"disk_bytes_after_sync", disk_bytes_synced},
            {"rank_begin_s", rank_begin},
            {"rank_wait_s", rank_wait},
            {"rank_interference_s", rank_interference}};
  }
};

nlohmann::json make_meta(TrainState& st, int64_t step, const ModelConfig& c, int ranks) {
  nlohmann::json meta;
  meta["step"] = step;
  meta["tokens_seen"] = step * 1000;
  meta["model_config"] = config_to_json(c);
  meta["why"] = "bench";
  meta["ranks"] = ranks;
  meta["counters"] = all_counters(st);
  return meta;
}

void remove_dir(Comm& comm, const std::string& dir) {
  if (comm.rank() == 0) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  barrier(comm);
}

// sync(), a pause, then a barrier: every variant starts without earlier dirty pages and on an
// idle disk, as a periodic checkpoint minutes after the last one would (the dev VM's virtual
// disk swung between ~0.35 and ~2 GB/s from run to run).
void settle(Comm& comm, double pause_seconds) {
  barrier(comm);
  if (comm.rank() == 0) {
    ::sync();
    if (pause_seconds > 0) ::usleep(useconds_t(pause_seconds * 1e6));
  }
  barrier(comm);
}

double baseline_step(Comm& comm, Compute& cp, int steps) {
  std::vector<double> t;
  for (int i = 0; i < steps; ++i) {
    t.push_back(cp.step());
    barrier(comm);  // the poll() all_reduce of a real step keeps ranks in step too
  }
  return median(t);
}

RunResult run_async(Comm& comm, DistCheckpointWriter& writer, const std::string& name,
                    const std::string& root, int64_t step, TrainState& st, const ModelConfig& c, Compute& cp,
                    const Args& a, const std::string& disk) {
  RunResult r;
  r.variant = name;
  settle(comm, a.pause_seconds);
  r.baseline_step = baseline_step(comm, cp, a.baseline_steps);
  const int64_t sec0 = comm.rank() == 0 ? disk_sectors_written(disk) : -1;
  barrier(comm);
  auto t0 = Clock::now();
  nlohmann::json meta = make_meta(st, step, c, comm.size());
  std::vector<DistPiece> pieces = owned_pieces(st);
  const double prep = seconds_since(t0);
  writer.begin_save(root, step, pieces, meta);
  std::optional<DistSaveStats> done;
  double stepped = 0;
  int steps = 0;
  while (!done) {
    stepped += cp.step();
    ++steps;
    done = writer.poll();
    if (steps > 100000) fail("bench", "the save never committed");
  }
  const int64_t sec_commit = comm.rank() == 0 ? disk_sectors_written(disk) : -1;  // fsynced data is there
  const DistSaveStats& s = *done;
  const double interference = stepped - steps * r.baseline_step;
  r.prep = reduce_max(comm, prep);
  r.begin = reduce_max(comm, s.begin_seconds);
  r.wait = reduce_max(comm, s.wait_seconds);
  r.stall = reduce_max(comm, s.stall_seconds());
  r.total = reduce_max(comm, s.total_seconds);
  r.write = reduce_max(comm, s.write_seconds);
  r.commit = reduce_max(comm, s.commit_seconds);
  r.interference = reduce_max(comm, interference);
  r.lost = reduce_max(comm, s.stall_seconds() + interference);
  r.rank_begin = gather_doubles(comm, s.begin_seconds);
  r.rank_wait = gather_doubles(comm, s.wait_seconds);
  r.rank_interference = gather_doubles(comm, interference);
  r.baseline_step = reduce_max(comm, r.baseline_step);
  r.steps = steps;
  r.bytes = double(s.total_bytes);
  if (comm.rank() == 0) {
    ::sync();  // nothing of ours should be left dirty (the writers fsynced)
    const int64_t sec1 = disk_sectors_written(disk);
    if (sec0 >= 0 && sec_commit >= 0) r.disk_bytes = double(sec_commit - sec0) * 512.0;
    if (sec0 >= 0 && sec1 >= 0) r.disk_bytes_synced = double(sec1 - sec0) * 512.0;
  }
  remove_dir(comm, s.dir);
  return r;
}

// Gather-to-rank-0 synchronous save into one file.
struct NaiveSaver {
  static constexpr int64_t kChunkFloats = int64_t(16) << 20;  // 64 MiB
  std::vector<float> buf[2];                                  // rank 0's receive buffers

  RunResult run(Comm& comm, const std::string& root, int64_t step, TrainState& st, const ModelConfig& c,
                const std::string& disk, double pause_seconds) {
    const int rank = comm.rank(), R = comm.size();
    if (rank == 0 && R > 1 && buf[0].empty())
      for (auto& b : buf) b.assign(size_t(kChunkFloats), 0.0f);  // persistent, like the writer's staging
    RunResult r;
    r.variant = "naive";
    settle(comm, pause_seconds);
    const int64_t sec0 = rank == 0 ? disk_sectors_written(disk) : -1;
    // The same preparation as the async save, outside the timed part there too.
    nlohmann::json meta = make_meta(st, step, c, R);
    std::vector<DistPiece> pieces = owned_pieces(st);
    barrier(comm);
    auto t0 = Clock::now();
    // Every rank's piece table (name, group, shape, offset, length) to rank 0 (all of them get it:
    // one small collective).
    std::string table;
    for (const DistPiece& p : pieces) {
      nlohmann::json e = {{"name", p.name},
                          {"group", p.group},
                          {"shape", p.shape},
                          {"offset", p.offset},
                          {"length", p.length}};
      table += e.dump() + "\n";
    }
    const std::vector<std::string> tables = gather_text(comm, table);
    uint64_t bytes = 0;
    if (rank == 0) {
      // Remote chunks in the order they will arrive: rank, then piece, then chunk.
      struct Chunk {
        int from;
        int64_t floats;
      };
      std::vector<Chunk> chunks;
      nlohmann::json index = nlohmann::json::array();
      uint64_t file_off = 0;
      for (int src = 0; src < R; ++src) {
        std::istringstream ss(tables[size_t(src)]);
        std::string line;
        while (std::getline(ss, line)) {
          nlohmann::json e = nlohmann::json::parse(line);
          const int64_t len = e.at("length").get<int64_t>();
          e["rank"] = src;
          e["file_offset"] = file_off;
          file_off += uint64_t(len) * 4;
          index.push_back(e);
          if (src > 0)
            for (int64_t o = 0; o < len; o += kChunkFloats)
              chunks.push_back({src, std::min(kChunkFloats, len - o)});
        }
      }
      const std::string dir = root + "/step-" + std::to_string(step);
      fs::create_directories(dir);
      const std::string path = dir + "/checkpoint.bin";
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) fail("bench", path + ": cannot create: " + std::strerror(errno));
      CommHandle pending;
      auto post = [&](size_t k) {
        if (k < chunks.size())
          pending = comm.recv(buf[k % 2].data(), chunks[k].floats, CommType::F32, chunks[k].from,
                              int(k % 20000) + 100);
      };
      post(0);
      for (const DistPiece& p : pieces) write_all(fd, p.data, p.length * 4, path);
      for (size_t k = 0; k < chunks.size(); ++k) {
        pending->wait();
        pending.reset();
        post(k + 1);  // the next chunk arrives while this one is written
        write_all(fd, buf[k % 2].data(), size_t(chunks[k].floats) * 4, path);
      }
      const std::string trailer = nlohmann::json{{"meta", meta}, {"tensors", index}}.dump();
      write_all(fd, trailer.data(), trailer.size(), path);
      const uint64_t trailer_size = trailer.size();
      write_all(fd, &trailer_size, 8, path);
      if (::fsync(fd) != 0) fail("bench", path + ": fsync failed: " + std::strerror(errno));
      ::close(fd);
      fsync_path(dir, true);
      fsync_path(root, true);
      bytes = file_off;
    } else {
      size_t k = 0;
      for (const DistPiece& p : pieces)
        for (uint64_t o = 0; o < p.length; o += uint64_t(kChunkFloats), ++k) {
          const int64_t n = int64_t(std::min<uint64_t>(uint64_t(kChunkFloats), p.length - o));
          comm.send(p.data + o, n, CommType::F32, 0, int(k % 20000) + 100)->wait();
        }
    }
    barrier(comm);
    const double stall = seconds_since(t0);
    const int64_t sec_commit = rank == 0 ? disk_sectors_written(disk) : -1;
    r.stall = r.total = r.lost = reduce_max(comm, stall);
    r.bytes = reduce_max(comm, double(bytes));
    if (rank == 0) {
      ::sync();
      const int64_t sec1 = disk_sectors_written(disk);
      if (sec0 >= 0 && sec_commit >= 0) r.disk_bytes = double(sec_commit - sec0) * 512.0;
      if (sec0 >= 0 && sec1 >= 0) r.disk_bytes_synced = double(sec1 - sec0) * 512.0;
    }
    remove_dir(comm, root + "/step-" + std::to_string(step));
    return r;
  }
};

// Peak resident memory of this process (VmHWM), bytes; 0 if unknown.
double peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return 0;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app(
      "bench_checkpoint: training-loop stall of the sharded async checkpoint save against a naive sync save");
  add_options(app, a);
  CLI11_PARSE(app, argc, argv);  // --help and bad options: CLI11's message and exit code
  try {
    std::unique_ptr<Comm> comm = make_comm(CommOptions{});
    const int rank = comm->rank(), R = comm->size();
    const bool lead = rank == 0;
    auto say = [&](const std::string& s) {
      if (lead) {
        std::printf("%s\n", s.c_str());
        std::fflush(stdout);
      }
    };

    // ---- the trainer's state ----
    const ModelConfig c = bench_config(a);
    const ParamCounts pc = count_params(c);
    auto be = make_cpu_backend();
    Model model(c, *be);
    const ParamLayout& layout = model.layout();
    fill_random(model.params(), layout.total, 1234, 0.05f);  // same on every rank (replicated)
    OptimizerConfig oc;
    DataParallel dp(*comm, layout, oc.ns_steps);
    Optimizer optim(layout, oc, *be, dp.owned_mask());
    fill_random(optim.moment1(), optim.moment1_size(), 100 + uint64_t(rank), 0.01f);
    if (optim.moment2_size() > 0)
      fill_random(optim.moment2(), optim.moment2_size(), 200 + uint64_t(rank), 1e-4f);
    BiasBalancer balancer(layout, BalancerConfig{}, *be);
    fill_random(balancer.adam_m().data(), int64_t(balancer.adam_m().size()), 300, 0.01f);
    fill_random(balancer.adam_v().data(), int64_t(balancer.adam_v().size()), 301, 1e-4f);
    TrainState st{model, optim, balancer, dp};

    std::vector<DistPiece> pieces = owned_pieces(st);
    uint64_t my_bytes = 0;
    int64_t my_param_floats = 0, my_state_floats = 0;
    for (const DistPiece& p : pieces) {
      my_bytes += p.length * 4;
      (p.group == "params" ? my_param_floats : my_state_floats) += int64_t(p.length);
    }
    const double total_bytes = reduce_sum(*comm, double(my_bytes));
    const double max_rank_bytes = reduce_max(*comm, double(my_bytes));
    const double state_floats = reduce_sum(*comm, double(my_state_floats));

    // Staging budgets. A number: that many MiB with the default chunk_bytes (8 MiB), like the
    // trainer (whose DistWriterOptions are the defaults: 256 MiB). "full": every chunk of every
    // piece resident at once, so begin_save never waits for the disk; a piece's chunks are
    // chunk_bytes each and its last one, possibly short, still takes a whole buffer, so the
    // small tensors would waste most of 8 MiB chunks: "full" uses --full-chunk-mib (1 MiB).
    const uint64_t full_chunk = uint64_t(a.full_chunk_mib) << 20;
    uint64_t full_staging = 0;
    for (const DistPiece& p : pieces)
      full_staging += (p.length * 4 + full_chunk - 1) / full_chunk * full_chunk;
    full_staging = uint64_t(reduce_max(*comm, double(full_staging)));
    struct Variant {
      std::string name;
      uint64_t staging, chunk;
      std::unique_ptr<DistCheckpointWriter> writer;
    };
    std::vector<Variant> variants;
    for (const std::string& s : a.staging) {
      DistWriterOptions wo;
      wo.keep_last = 1;
      if (s == "full") {
        wo.staging_bytes = full_staging;
        wo.chunk_bytes = full_chunk;
      } else {
        wo.staging_bytes = uint64_t(std::stoll(s)) << 20;
      }
      variants.push_back({"async-" + (s == "full" ? std::string("full") : s + "MiB"), wo.staging_bytes,
                          std::min(wo.chunk_bytes, wo.staging_bytes),
                          std::make_unique<DistCheckpointWriter>(*comm, wo)});
    }

    // ---- compute calibration: the same number of sgemms per step on every rank ----
    Compute cp;
    cp.once();
    std::vector<double> t;
    for (int i = 0; i < 3; ++i) {
      auto t0 = Clock::now();
      cp.once();
      t.push_back(seconds_since(t0));
    }
    const double per = reduce_max(*comm, median(t));
    cp.reps = std::max(1, int(std::lround(a.step_seconds / per)));

    const char* omp = std::getenv("OMP_NUM_THREADS");
    say("bench_checkpoint: " + std::to_string(R) + " rank(s) over " + comm->name() +
        ", OMP_NUM_THREADS=" + (omp ? omp : "unset"));
    say("model: vocab " + std::to_string(c.vocab_size) + ", d " + std::to_string(c.hidden_size) + ", " +
        std::to_string(c.num_hidden_layers) + " blocks, " + std::to_string(c.num_experts) + " experts of " +
        std::to_string(c.moe_intermediate_size) + ": " + std::to_string(pc.total) + " parameters (" +
        fmt("%.3f", pc.total / 1e9) + " B), " + std::to_string(layout.params.size()) + " tensors");
    say("state saved: " + fmt("%.2f", total_bytes / 1e9) + " GB in all (parameters " +
        fmt("%.2f", pc.total * 4 / 1e9) + " GB + optimizer/balancer state " +
        fmt("%.2f", state_floats * 4 / 1e9) + " GB), largest rank " + fmt("%.2f", max_rank_bytes / 1e9) +
        " GB");
    for (const Variant& v : variants)
      say(v.name + ": staging " + std::to_string(v.staging >> 20) + " MiB per rank in " +
          std::to_string(v.chunk >> 20) + " MiB chunks, " +
          std::to_string(DistWriterOptions{}.writer_threads) + " writer threads");
    say("simulated step: " + std::to_string(cp.reps) + " x sgemm 1024^3 (" +
        fmt("%.1f", 2.0 * 1024 * 1024 * 1024 / per / 1e9) + " GFLOP/s) = ~" + fmt("%.2f", cp.reps * per) +
        " s");

    // ---- rounds ----
    fs::create_directories(a.root);
    NaiveSaver naive;
    std::vector<RunResult> results;
    std::vector<std::string> order;
    for (const Variant& v : variants) order.push_back(v.name);
    order.push_back("naive");
    int64_t step = 1000;
    auto run_variant = [&](const std::string& name) {
      ++step;
      if (name == "naive") return naive.run(*comm, a.root + "/naive", step, st, c, a.disk, a.pause_seconds);
      Variant& v =
          *std::find_if(variants.begin(), variants.end(), [&](const Variant& x) { return x.name == name; });
      return run_async(*comm, *v.writer, name, a.root + "/" + name, step, st, c, cp, a, a.disk);
    };
    for (int w = 0; w < a.warmup; ++w)
      for (const std::string& name : order) {
        RunResult r = run_variant(name);
        say("warm-up save " + std::to_string(w + 1) + ", " + name + ": stall " + fmt("%.3f", r.stall) +
            " s, commit " + fmt("%.2f", r.total) + " s (not counted)");
      }
    say("");
    say("round variant          stall_s  begin_s   wait_s commit_s  total_s steps base_step interf_s   "
        "lost_s     GB  disk_GB  MB/s(stall) MB/s(total)");
    for (int round = 0; round < a.rounds; ++round) {
      std::vector<std::string> ord = order;
      if (round % 2) std::reverse(ord.begin(), ord.end());
      for (const std::string& name : ord) {
        RunResult r = run_variant(name);
        r.round = round + 1;
        results.push_back(r);
        char line[512];
        std::snprintf(
            line, sizeof line,
            "%5d %-15s %8.3f %8.3f %8.3f %8.3f %8.2f %5d %9.3f %8.2f %8.2f %6.2f %8.2f %12.0f %11.0f",
            r.round, r.variant.c_str(), r.stall, r.begin, r.wait, r.commit, r.total, r.steps, r.baseline_step,
            r.interference, r.lost, r.bytes / 1e9, r.disk_bytes / 1e9, r.bytes / 1e6 / r.stall,
            r.bytes / 1e6 / r.total);
        say(line);
      }
    }

    // ---- medians ----
    nlohmann::json summary = nlohmann::json::object();
    say("");
    say("medians over " + std::to_string(a.rounds) + " rounds:");
    say("variant          stall_s  total_s interf_s   lost_s  naive/stall  naive/lost");
    auto med = [&](const std::string& name, auto field) {
      std::vector<double> v;
      for (const RunResult& r : results)
        if (r.variant == name) v.push_back(field(r));
      return median(v);
    };
    const double naive_stall = med("naive", [](const RunResult& r) { return r.stall; });
    std::string final_line = "RESULT np=" + std::to_string(R) + " params=" + std::to_string(pc.total) +
                             " state=" + fmt("%.2f", total_bytes / 1e9) +
                             "GB naive_stall=" + fmt("%.2f", naive_stall) + "s";
    for (const std::string& name : order) {
      const double stall = med(name, [](const RunResult& r) { return r.stall; });
      const double total = med(name, [](const RunResult& r) { return r.total; });
      const double interf = med(name, [](const RunResult& r) { return r.interference; });
      const double lost = med(name, [](const RunResult& r) { return r.lost; });
      const double ratio = naive_stall / stall, lost_ratio = naive_stall / lost;
      char line[256];
      std::snprintf(line, sizeof line, "%-15s %8.3f %8.2f %8.2f %8.2f %11.1fx %10.1fx", name.c_str(), stall,
                    total, interf, lost, ratio, lost_ratio);
      say(line);
      summary[name] = {{"stall_s", stall}, {"total_s", total},          {"interference_s", interf},
                       {"lost_s", lost},   {"naive_over_stall", ratio}, {"naive_over_lost", lost_ratio}};
      if (name != "naive")
        final_line += " | " + name + ": stall=" + fmt("%.3f", stall) + "s commit=" + fmt("%.1f", total) +
                      "s ratio=" + fmt("%.1f", ratio) + "x (" + (ratio >= 10 ? "meets" : "misses") +
                      " >=10x), lost=" + fmt("%.2f", lost) + "s";
    }
    const double rss_sum = reduce_sum(*comm, peak_rss_bytes()), rss_max = reduce_max(*comm, peak_rss_bytes());
    say("peak resident memory: " + fmt("%.2f", rss_sum / 1e9) + " GB over all ranks (largest rank " +
        fmt("%.2f", rss_max / 1e9) + " GB)");
    say("");
    say(final_line);

    if (lead && !a.json_path.empty()) {
      nlohmann::json j;
      j["ranks"] = R;
      j["parameters"] = pc.total;
      j["model_config"] = config_to_json(c);
      j["state_bytes"] = total_bytes;
      j["max_rank_bytes"] = max_rank_bytes;
      j["step_seconds"] = cp.reps * per;
      j["omp_num_threads"] = omp ? omp : "";
      j["runs"] = nlohmann::json::array();
      for (const RunResult& r : results) j["runs"].push_back(r.to_json());
      j["medians"] = summary;
      j["result"] = final_line;
      j["peak_rss_bytes_all_ranks"] = rss_sum;
      std::ofstream(a.json_path) << j.dump(2) << "\n";
    }
    variants.clear();
    barrier(*comm);
    if (lead) {  // our directories, then the root if nothing else is in it
      std::error_code ec;
      for (const std::string& name : order) fs::remove_all(a.root + "/" + name, ec);
      fs::remove(a.root, ec);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
    return 1;
  }
}
