// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78; the iSCSI / ext4 / RFC 3720 CRC):
// checksums for checkpoint files and tensors. Uses the SSE4.2 crc32 instruction when the CPU
// has it and a slicing-by-8 table otherwise; both give identical results.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace zaya {

// Continues a CRC-32C over `n` more bytes. Start with crc = 0; crc32c(crc32c(0, a), b) equals
// the CRC of a followed by b. crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c(0, data, n); }
// The table-driven path only (what crc32c uses on CPUs without SSE4.2); for tests.
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);

// The CRC-32C of A followed by B, from crc(A), crc(B) and B's length in bytes: lets
// independently checksummed pieces (tensors, ranks) be combined without re-reading them.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Manifest spelling: exactly 8 lowercase hex digits.
std::string checksum_hex(uint32_t crc);
// Parses 8 hex digits (either case); returns false for anything else.
bool parse_checksum_hex(const std::string& s, uint32_t* out);

}  // namespace zaya
