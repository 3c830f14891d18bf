// Training data loader throughput (src/data/loader.h): tokens/s delivered by Loader::next for
// micro-batches of seq_len 256 and 4096, with the prefetch thread (prefetch 4) and without it
// (prefetch 0, everything on the calling thread), median of N runs, printed as JSON lines.
//
// The corpus is synthetic: two shard datasets written with ShardWriter (random token ids below a
// 262144 vocabulary, document lengths 20..6000 tokens, 64 MiB shards), mixed 0.7 / 0.3. Each run
// delivers --tokens tokens (inputs) from a fresh position of the stream; one warm-up run first
// (it also pulls the shards into the page cache). busy_consumer_next_us: mean time inside next()
// when the caller does 2 ms of other work between calls (what a training step waits for).
// Options: --dir DIR, --dataset-mtokens 24, --tokens 33554432, --runs 5, --keep (--help lists them).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "data/loader.h"
#include "data/shard_writer.h"

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kVocab = 262144;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// A shard dataset of about `tokens` random tokens (deterministic), written unless present.
void make_dataset(const fs::path& dir, uint64_t tokens, uint64_t seed) {
  if (fs::exists(dir / "manifest.json")) return;
  fs::create_directories(dir);
  zaya::ShardWriter::Options o;
  o.dir = dir.string();
  o.prefix = "train";
  o.target_bytes = 64ull << 20;
  o.vocab_size = kVocab;
  zaya::ShardWriter w(o);
  uint64_t x = seed, done = 0, docs = 0;
  std::vector<uint32_t> doc;
  while (done < tokens) {
    x = zaya::mix64(x);
    doc.resize(20 + x % 5981);
    for (auto& t : doc) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t = uint32_t(3 + (x >> 40) % (kVocab - 3));
    }
    doc.back() = 1;  // EOS
    w.add_document(doc, "synthetic");
    done += doc.size();
    ++docs;
  }
  zaya::Manifest m;
  m.tokenizer_path = "synthetic";
  m.vocab_size = kVocab;
  m.eos_id = 1;
  m.sources.push_back({"synthetic", docs, 0});
  m.splits["train"] = w.finish();
  zaya::write_manifest(dir.string(), m);
}

struct Args {
  std::string dir = (fs::temp_directory_path() / "zaya_loader_bench").string();
  uint64_t mtokens = 24;
  int64_t tokens = 32ll << 20;
  int runs = 5;
  bool keep = false;
};

void add_options(CLI::App& app, Args& a) {
  app.add_option("--dir", a.dir, "Where the synthetic datasets are written (reused if present)")
      ->capture_default_str();
  app.add_option("--dataset-mtokens", a.mtokens, "Size of each of the two datasets, in Mi tokens")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--tokens", a.tokens, "Tokens delivered per timed run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", a.runs, "Timed runs after one warm-up (median reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--keep", a.keep, "Keep the datasets afterwards (default: removed)");
}

}  // namespace

int main(int argc, char** argv) try {
  Args args;
  CLI::App app("bench_loader: training data loader tokens/s, with and without the prefetch thread");
  add_options(app, args);
  CLI11_PARSE(app, argc, argv);  // --help and bad options: CLI11's message and exit code
  const fs::path dir = args.dir;
  const uint64_t mtokens = args.mtokens;
  const int64_t tokens = args.tokens;
  const int runs = args.runs;
  make_dataset(dir / "web", mtokens << 20, 1);
  make_dataset(dir / "code", mtokens << 20, 2);

  struct Shape {
    int64_t seq_len, micro;
  };
  for (Shape sh : {Shape{256, 64}, Shape{4096, 4}}) {
    for (int64_t prefetch : {int64_t(4), int64_t(0)}) {
      zaya::PhaseSpec ph;
      ph.name = "main";
      ph.seq_len = sh.seq_len;
      ph.mixture = {{"web", (dir / "web").string(), 0.7}, {"code", (dir / "code").string(), 0.3}};
      zaya::LoaderOptions o;
      o.phases = {ph};
      o.seed = 1234;
      o.micro_batch = sh.micro;
      o.prefetch = prefetch;
      zaya::Loader loader(o);
      std::vector<int32_t> in(size_t(sh.micro * sh.seq_len)), tg(in.size());
      const int64_t per = sh.micro * sh.seq_len;
      const int64_t batches = std::max<int64_t>(1, tokens / per);
      std::vector<double> rates;
      int64_t step = 0;
      for (int r = 0; r <= runs; ++r) {  // run 0 is the warm-up
        loader.seek_step(step, step * sh.micro);
        step += batches + 1000;
        int64_t sink = 0;
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t b = 0; b < batches; ++b) {
          loader.next(in.data(), tg.data());
          sink += in[size_t(b) % in.size()];
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (sink == 42) std::printf(" ");
        if (r > 0) rates.push_back(double(batches * per) / s);
      }
      // The trainer's view: the consumer computes for 2 ms between calls (sleeping, so the
      // prefetch thread has a core); mean time spent inside next().
      loader.seek_step(step, step * sh.micro);
      double in_next = 0;
      const int calls = 200;
      for (int c = 0; c < calls; ++c) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const auto t0 = std::chrono::steady_clock::now();
        loader.next(in.data(), tg.data());
        in_next += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      std::printf(
          "{\"bench\": \"loader\", \"seq_len\": %lld, \"micro_batch\": %lld, \"prefetch\": %lld, \"runs\": %d, "
          "\"tokens_per_run\": %lld, \"median_mtok_s\": %.1f, \"min_mtok_s\": %.1f, \"max_mtok_s\": %.1f, "
          "\"busy_consumer_next_us\": %.1f}\n",
          (long long)sh.seq_len, (long long)sh.micro, (long long)prefetch, runs, (long long)(batches * per),
          median(rates) / 1e6, *std::min_element(rates.begin(), rates.end()) / 1e6,
          *std::max_element(rates.begin(), rates.end()) / 1e6, in_next / calls * 1e6);
      std::fflush(stdout);
    }
  }
  if (!args.keep) fs::remove_all(dir);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
