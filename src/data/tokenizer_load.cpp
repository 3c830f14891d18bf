// load_tokenizer(): picks the implementation from the path. A directory is searched for
// tokenizer.json, then tokenizer.model; a file is chosen by extension, else by content.
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_hf.h"
#include "data/tokenizer_sp.h"

namespace zaya {

namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
      fs::path p = fs::path(path) / name;
      if (fs::is_regular_file(p, ec)) return load_tokenizer(p.string());
    }
    fail("tokenizer", path + ": directory has neither tokenizer.json nor tokenizer.model",
         "point at the model directory or the tokenizer file itself");
  }
  if (!fs::exists(path, ec))
    fail("tokenizer", path + ": no such file or directory", "check the path; run scripts/setup.sh to fetch data");
  std::string ext = fs::path(path).extension().string();
  if (ext == ".json") return load_hf_tokenizer(path);
  if (ext == ".model") return load_sp_tokenizer(path);
  // Unknown extension: a JSON document starts with '{' (after whitespace).
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c) && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) {
  }
  return c == '{' ? load_hf_tokenizer(path) : load_sp_tokenizer(path);
}

}  // namespace zaya
