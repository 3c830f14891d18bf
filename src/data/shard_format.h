// The bundled token shard format (.zshard): the pre-tokenised, mmap-able training data written
// by `zaya data prepare` and read by ShardReader / ShardDataset. docs/formats.md describes it
// byte by byte; this header is the single source of the constants.
//
// Version 1 holds tokens and a document index. Version 2 adds a loss mask (flag bit 0, always
// set in version 2): one byte per token after the index, 1 where the token is a training target, 0 where it
// is context only (a supervised fine-tuning prompt). Writers emit version 1 for a shard
// without a mask, so such shards stay readable by a zaya that knows only version 1.
//
//   offset  size  field
//   0       8     magic "ZAYASHRD"
//   8       4     u32 format version: 1 (no loss mask) or 2 (with one)
//   12      4     u32 header size in bytes (kShardHeaderBytes = 128)
//   16      4     u32 tokenizer hash: CRC-32C of the tokenizer file's bytes
//   20      4     u32 flags: 0 in version 1; 1 in version 2 (bit 0: the loss mask)
//   24      8     u64 vocab size (every token id is < vocab size)
//   32      8     u64 token count T
//   40      8     u64 document count D
//   48      8     u64 tokens offset (= 128)
//   56      8     u64 tokens bytes (= 4 T)
//   64      8     u64 index offset (first multiple of 8 at or after tokens offset + tokens bytes)
//   72      8     u64 index bytes (= 8 (D + 1))
//   80      4     u32 CRC-32C of the tokens section
//   84      4     u32 CRC-32C of the index section
//   88      8     u64 file size in bytes (= the end of the last section)
//   96      8     u64 loss mask offset (= index offset + index bytes; 0 without a mask)
//   104     8     u64 loss mask bytes (= T; 0 without a mask)
//   112     4     u32 CRC-32C of the loss mask section (0 without a mask)
//   116     8     reserved, zero
//   124     4     u32 CRC-32C of header bytes 0..123
//   then the tokens section (T x u32), zero padding to 8 bytes, the index section
//   ((D + 1) x u64: document d spans tokens [index[d], index[d+1]); index[0] = 0, index[D] = T),
//   and with a mask the loss mask section (T x u8, each 0 or 1).
// All integers are little-endian.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace zaya {

static_assert(std::endian::native == std::endian::little, "zaya's shard format assumes a little-endian host");

inline constexpr char kShardMagic[8] = {'Z', 'A', 'Y', 'A', 'S', 'H', 'R', 'D'};
inline constexpr uint32_t kShardVersion = 2;        // the newest version this zaya reads
inline constexpr uint32_t kShardVersionNoMask = 1;  // written for shards without a loss mask
inline constexpr uint32_t kShardFlagLossMask = 1;   // flags bit 0
inline constexpr uint32_t kShardHeaderBytes = 128;
inline constexpr const char* kShardExtension = ".zshard";
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kManifestFormat = "zaya-shards";
inline constexpr uint32_t kManifestVersion = 1;

// The decoded header (all fields; magic and header CRC are implied).
struct ShardHeader {
  uint32_t version = kShardVersionNoMask;
  uint32_t header_bytes = kShardHeaderBytes;
  uint32_t tokenizer_hash = 0;
  uint32_t flags = 0;
  uint64_t vocab_size = 0;
  uint64_t token_count = 0;
  uint64_t document_count = 0;
  uint64_t tokens_offset = 0;
  uint64_t tokens_bytes = 0;
  uint64_t index_offset = 0;
  uint64_t index_bytes = 0;
  uint32_t tokens_crc = 0;
  uint32_t index_crc = 0;
  uint64_t file_size = 0;
  uint64_t mask_offset = 0;  // loss mask section (0 and 0 without one)
  uint64_t mask_bytes = 0;
  uint32_t mask_crc = 0;
  bool has_loss_mask() const { return (flags & kShardFlagLossMask) != 0; }
};

namespace shard_detail {
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void store_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
}  // namespace shard_detail

// Field offsets inside the 128-byte header.
namespace shard_field {
inline constexpr size_t kMagic = 0, kVersion = 8, kHeaderBytes = 12, kTokenizerHash = 16, kFlags = 20,
                        kVocabSize = 24, kTokenCount = 32, kDocumentCount = 40, kTokensOffset = 48,
                        kTokensBytes = 56, kIndexOffset = 64, kIndexBytes = 72, kTokensCrc = 80,
                        kIndexCrc = 84, kFileSize = 88, kMaskOffset = 96, kMaskBytes = 104, kMaskCrc = 112,
                        kReserved = 116, kHeaderCrc = 124;
}

// The layout a writer produces for T tokens and D documents (offsets, sizes, file size), with
// or without a loss mask section (the version follows: 2 with one, 1 without).
inline ShardHeader shard_layout(uint64_t tokens, uint64_t documents, bool loss_mask = false) {
  ShardHeader h;
  h.version = loss_mask ? kShardVersion : kShardVersionNoMask;
  h.flags = loss_mask ? kShardFlagLossMask : 0;
  h.token_count = tokens;
  h.document_count = documents;
  h.tokens_offset = kShardHeaderBytes;
  h.tokens_bytes = tokens * 4;
  h.index_offset = (h.tokens_offset + h.tokens_bytes + 7) / 8 * 8;
  h.index_bytes = (documents + 1) * 8;
  h.file_size = h.index_offset + h.index_bytes;
  if (loss_mask) {
    h.mask_offset = h.file_size;
    h.mask_bytes = tokens;
    h.file_size += h.mask_bytes;
  }
  return h;
}

// Serialises a header into 128 bytes, reserved bytes zero, with the header CRC computed by
// `crc` (pass zaya::crc32c; kept as a parameter so this header needs no library).
template <class Crc>
void encode_shard_header(const ShardHeader& h, uint8_t out[kShardHeaderBytes], Crc crc) {
  using namespace shard_detail;
  using namespace shard_field;
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out + kMagic, kShardMagic, 8);
  store_u32(out + kVersion, h.version);
  store_u32(out + kHeaderBytes, h.header_bytes);
  store_u32(out + kTokenizerHash, h.tokenizer_hash);
  store_u32(out + kFlags, h.flags);
  store_u64(out + kVocabSize, h.vocab_size);
  store_u64(out + kTokenCount, h.token_count);
  store_u64(out + kDocumentCount, h.document_count);
  store_u64(out + kTokensOffset, h.tokens_offset);
  store_u64(out + kTokensBytes, h.tokens_bytes);
  store_u64(out + kIndexOffset, h.index_offset);
  store_u64(out + kIndexBytes, h.index_bytes);
  store_u32(out + kTokensCrc, h.tokens_crc);
  store_u32(out + kIndexCrc, h.index_crc);
  store_u64(out + kFileSize, h.file_size);
  store_u64(out + kMaskOffset, h.mask_offset);
  store_u64(out + kMaskBytes, h.mask_bytes);
  store_u32(out + kMaskCrc, h.mask_crc);
  store_u32(out + kHeaderCrc, crc(out, size_t(kHeaderCrc)));
}

// Reads the header fields from 128 bytes without any validation (parse_shard validates).
inline ShardHeader decode_shard_header_unchecked(const uint8_t* in) {
  using namespace shard_detail;
  using namespace shard_field;
  ShardHeader h;
  h.version = load_u32(in + kVersion);
  h.header_bytes = load_u32(in + kHeaderBytes);
  h.tokenizer_hash = load_u32(in + kTokenizerHash);
  h.flags = load_u32(in + kFlags);
  h.vocab_size = load_u64(in + kVocabSize);
  h.token_count = load_u64(in + kTokenCount);
  h.document_count = load_u64(in + kDocumentCount);
  h.tokens_offset = load_u64(in + kTokensOffset);
  h.tokens_bytes = load_u64(in + kTokensBytes);
  h.index_offset = load_u64(in + kIndexOffset);
  h.index_bytes = load_u64(in + kIndexBytes);
  h.tokens_crc = load_u32(in + kTokensCrc);
  h.index_crc = load_u32(in + kIndexCrc);
  h.file_size = load_u64(in + kFileSize);
  h.mask_offset = load_u64(in + kMaskOffset);
  h.mask_bytes = load_u64(in + kMaskBytes);
  h.mask_crc = load_u32(in + kMaskCrc);
  return h;
}

}  // namespace zaya
