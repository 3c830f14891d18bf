// A flat token file: a small versioned header followed by uint32 token ids, documents
// separated by EOS. The demo corpus and tests use it; the bundled shard format of the data
// pipeline supersedes it for large corpora.
//   bytes 0-7   magic "ZAYATOK1"
//   bytes 8-15  u64 vocab size
//   bytes 16-23 u64 token count
//   bytes 24-31 u64 document count
//   then        token count x u32 (little-endian)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zaya {

struct TokenFile {
  uint64_t vocab_size = 0;
  uint64_t documents = 0;
  std::vector<uint32_t> tokens;
};

void write_token_file(const std::string& path, const TokenFile& f);
// Validates the header, the size and every id (< vocab size); errors name the file.
TokenFile read_token_file(const std::string& path);

}  // namespace zaya
