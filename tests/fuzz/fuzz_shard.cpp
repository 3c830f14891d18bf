// libFuzzer target: arbitrary bytes as a token shard (.zshard). parse_shard must either accept
// them (and then the header, sections and document index satisfy every invariant the reader
// relies on) or throw zaya::Error naming the file; it must never read outside the buffer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "data/shard_reader.h"

namespace {

void check_accepted(const uint8_t* data, size_t size, const zaya::ShardHeader& h) {
  if (h.version < zaya::kShardVersionNoMask || h.version > zaya::kShardVersion || h.file_size != size) std::abort();
  // One encoding per shard: version 2 exactly when the loss mask flag is set, no other flag, and
  // the mask fields and reserved bytes zero where they are unused.
  if ((h.version == 2) != h.has_loss_mask() || (h.flags & ~zaya::kShardFlagLossMask) != 0) std::abort();
  for (size_t i = h.has_loss_mask() ? zaya::shard_field::kReserved : zaya::shard_field::kMaskOffset;
       i < zaya::shard_field::kHeaderCrc; ++i)
    if (data[i] != 0) std::abort();
  if (h.tokens_offset != zaya::kShardHeaderBytes || h.tokens_bytes != h.token_count * 4) std::abort();
  if (h.tokens_offset + h.tokens_bytes > size) std::abort();
  if (h.index_offset != (h.tokens_offset + h.tokens_bytes + 7) / 8 * 8) std::abort();
  if (h.index_bytes != (h.document_count + 1) * 8) std::abort();
  const uint64_t index_end = h.index_offset + h.index_bytes;
  if (h.has_loss_mask()) {  // version 2: the mask section follows the index and ends the file
    if (h.version < 2 || h.mask_offset != index_end || h.mask_bytes != h.token_count) std::abort();
    if (h.mask_offset + h.mask_bytes != size) std::abort();
    if (h.mask_bytes > 0) {
      volatile uint8_t last = data[h.mask_offset + h.mask_bytes - 1];
      (void)last;
    }
  } else if (index_end != size || h.mask_offset != 0 || h.mask_bytes != 0) {
    std::abort();
  }
  uint64_t prev = 0;
  for (uint64_t i = 0; i <= h.document_count; ++i) {
    uint64_t v;
    std::memcpy(&v, data + h.index_offset + i * 8, 8);
    if (v < prev || v > h.token_count || (i == 0 && v != 0)) std::abort();
    if (i > 0 && v > prev) {  // touch the document's first and last token
      volatile uint8_t a = data[h.tokens_offset + prev * 4];
      volatile uint8_t b = data[h.tokens_offset + v * 4 - 1];
      (void)a;
      (void)b;
    }
    prev = v;
  }
  if (prev != h.token_count) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string kSource = "fuzz.zshard";
  for (zaya::ShardVerify v : {zaya::ShardVerify::Structure, zaya::ShardVerify::Full}) {
    try {
      zaya::ShardHeader h = zaya::parse_shard(data, size, kSource, v);
      check_accepted(data, size, h);
      if (v == zaya::ShardVerify::Full)
        for (uint64_t i = 0; i < h.token_count; ++i) {
          uint32_t t;
          std::memcpy(&t, data + h.tokens_offset + i * 4, 4);
          if (t >= h.vocab_size) std::abort();
          if (h.has_loss_mask() && data[h.mask_offset + i] > 1) std::abort();
        }
    } catch (const zaya::Error& e) {
      if (std::string(e.what()).find(kSource) == std::string::npos) std::abort();  // errors name the file
    }
  }
  return 0;
}
