// The golden gradient fixtures (tests/fixtures/<case>/grads.safetensors, from
// tests/reference/make_grad_fixtures.py): the list of cases, and a case's token batch
// (ids.json) with its next-token targets. Shared by tests/unit/test_model_grads.cpp and
// tests/gpu/test_gpu_model.cpp.
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_helpers.h"

namespace zaya::test {

// The fixture directories that hold grads.safetensors, sorted by name.
inline std::vector<std::string> grad_cases() {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(source_path("tests/fixtures")))
    if (fs::exists(e.path() / "grads.safetensors")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// B sequences of T tokens, row-major; targets[b, t] = ids[b, t + 1], and -1 at t = T - 1.
struct FixtureBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids, targets;
};

// The batch of the fixture in `dir` (dir/ids.json: a list of equal-length token lists).
inline FixtureBatch load_fixture_batch(const std::string& dir) {
  auto seqs = nlohmann::json::parse(std::ifstream(dir + "/ids.json")).get<std::vector<std::vector<int32_t>>>();
  FixtureBatch b;
  b.B = int64_t(seqs.size());
  b.T = int64_t(seqs[0].size());
  for (auto& seq : seqs) {
    b.ids.insert(b.ids.end(), seq.begin(), seq.end());
    for (int64_t t = 0; t < b.T; ++t) b.targets.push_back(t + 1 < b.T ? seq[size_t(t + 1)] : -1);
  }
  return b;
}

}  // namespace zaya::test
