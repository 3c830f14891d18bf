// CLI helpers shared by generate/score/tokenize.
#include "model_source.h"

#include <filesystem>

#include "core/error.h"

namespace zaya::cli {

std::vector<int32_t> parse_id_list(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument("range");
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      fail("cli", "--ids: '" + item + "' is not a token id", "pass comma-separated non-negative integers, e.g. 2,651,1234");
    }
    i = j + 1;
  }
  return ids;
}

std::unique_ptr<Tokenizer> find_tokenizer(const std::string& explicit_path, const std::string& model_dir) {
  if (!explicit_path.empty()) return load_tokenizer(explicit_path);
  namespace fs = std::filesystem;
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    fs::path p = fs::path(model_dir) / name;
    if (fs::exists(p)) return load_tokenizer(p.string());
  }
  return nullptr;
}

}  // namespace zaya::cli
