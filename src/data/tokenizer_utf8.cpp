// UTF-8 validation and lenient decoding (maximal-subpart U+FFFD substitution) plus the
// character classes the pre-tokenizers need (table generated from Unicode data).
#include "data/tokenizer_utf8.h"


namespace zaya::tok {

int utf8_seq_len(const unsigned char* p, size_t n) {
  unsigned c = p[0];
  if (c < 0x80) return 1;
  int need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (static_cast<size_t>(k) >= n) return -k;
    unsigned b = p[k];
    if (b < lo || b > hi) return -k;
    lo = 0x80, hi = 0xBF;
  }
  return need + 1;
}

bool utf8_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // Skip ASCII eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    int len = utf8_seq_len(p + i, n - i);
    if (len < 0) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    int len = utf8_seq_len(p + i, n - i);
    if (len > 0) {
      out.append(s.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";
      i += static_cast<size_t>(-len);
    }
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_unicode_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

#include "data/tokenizer_unicode_classes.inc"

static uint8_t unicode_class(uint32_t cp) {
  size_t lo = 0, hi = sizeof(kUnicodeClassRuns) / sizeof(kUnicodeClassRuns[0]);
  while (hi - lo > 1) {  // last run with first <= cp
    size_t mid = (lo + hi) / 2;
    if (kUnicodeClassRuns[mid].first <= cp) lo = mid;
    else hi = mid;
  }
  return kUnicodeClassRuns[lo].cls;
}

bool is_unicode_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return unicode_class(cp) & 1;
}

bool is_unicode_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return unicode_class(cp) & 2;
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return cp == '_' || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') || (cp >= '0' && cp <= '9');
  return unicode_class(cp) & 4;
}

}  // namespace zaya::tok
