// Reading/writing the flat token file (see token_file.h), written atomically via rename.
#include "data/token_file.h"

#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace zaya {

namespace {
constexpr char kMagic[8] = {'Z', 'A', 'Y', 'A', 'T', 'O', 'K', '1'};
}

void write_token_file(const std::string& path, const TokenFile& f) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) fail("data", "cannot write " + tmp);
    uint64_t header[3] = {f.vocab_size, f.tokens.size(), f.documents};
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    out.write(reinterpret_cast<const char*>(f.tokens.data()), std::streamsize(f.tokens.size() * 4));
    if (!out) fail("data", "short write to " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("data", "cannot rename " + tmp + " to " + path);
}

TokenFile read_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("data", "cannot open token file " + path, "run `zaya data demo` or check data.train in the recipe");
  const uint64_t size = uint64_t(in.tellg());
  in.seekg(0);
  char magic[8];
  uint64_t header[3];
  if (size < 32 || !in.read(magic, 8) || !in.read(reinterpret_cast<char*>(header), sizeof header))
    fail("data", path + ": too short for a token file header (32 bytes)");
  if (std::memcmp(magic, kMagic, 8) != 0) fail("data", path + ": bad magic, expected ZAYATOK1");
  TokenFile f;
  f.vocab_size = header[0];
  f.documents = header[2];
  if (header[1] != (size - 32) / 4 || (size - 32) % 4 != 0)
    fail("data", path + ": header says " + std::to_string(header[1]) + " tokens but the file holds " +
                     std::to_string((size - 32) / 4), "the file is truncated or corrupt; regenerate it");
  f.tokens.resize(header[1]);
  in.read(reinterpret_cast<char*>(f.tokens.data()), std::streamsize(header[1] * 4));
  for (size_t i = 0; i < f.tokens.size(); ++i)
    if (f.tokens[i] >= f.vocab_size)
      fail("data", path + ": token " + std::to_string(f.tokens[i]) + " at index " + std::to_string(i) +
                       " is outside the vocabulary (" + std::to_string(f.vocab_size) + ")");
  return f;
}

}  // namespace zaya
