// UTF-8 helpers for the tokenizers: validation, lenient decoding (each maximal invalid
// subpart becomes U+FFFD, like WHATWG TextDecoder), code point iteration and Unicode
// character classes used by pre-tokenizers.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace zaya::tok {

// Length of the well-formed sequence at p[0..n) (> 0), or minus the length of its maximal
// invalid subpart (< 0). n must be > 0.
int utf8_seq_len(const unsigned char* p, size_t n);
bool utf8_valid(std::string_view s);
// Copies s, replacing each maximal invalid subpart with U+FFFD.
std::string utf8_sanitize(std::string_view s);

// Length of the code point whose (valid) lead byte is c.
inline size_t utf8_lead_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}
// Decodes the code point at s[i] of valid UTF-8 and advances i past it.
inline uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  unsigned c = p[0];
  if (c < 0x80) { i += 1; return c; }
  if (c < 0xE0) { i += 2; return ((c & 0x1F) << 6) | (p[1] & 0x3F); }
  if (c < 0xF0) { i += 3; return ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F); }
  i += 4;
  return ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}
// Start of the code point that ends just before byte i (i > 0) of valid UTF-8.
inline size_t utf8_prev_start(std::string_view s, size_t i) {
  do { --i; } while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  return i;
}
void utf8_append(std::string& out, uint32_t cp);

// Unicode White_Space (Rust's char::is_whitespace), exact.
bool is_unicode_space(uint32_t cp);
// Letter / number / word-character classes (regex \p{L}, \p{N}, \w). Exact for ASCII;
// for other code points they use the C library's Unicode tables (C.UTF-8), which are close
// to but not exactly the Unicode general categories.
bool is_unicode_letter(uint32_t cp);
bool is_unicode_number(uint32_t cp);
bool is_word_char(uint32_t cp);

}  // namespace zaya::tok
