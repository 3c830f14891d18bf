// Decoders of tokenizer.json: each step maps the list of token strings to a new list, as in
// Hugging Face's decode_chain; the final strings are concatenated.
#include <unordered_map>

#include "data/tokenizer_hf_pipeline.h"
#include "data/tokenizer_utf8.h"

namespace zaya::tok {

namespace {

int byte_token(const std::string& t) {  // <0xAB> -> 0xAB, else -1
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::vector<std::string> byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  auto flush = [&] {
    if (bytes.empty()) return;
    if (utf8_valid(bytes))
      out.push_back(bytes);
    else
      for (size_t i = 0; i < bytes.size(); ++i) out.push_back("\xEF\xBF\xBD");
    bytes.clear();
  };
  for (auto& t : tokens) {
    int b = byte_token(t);
    if (b >= 0) {
      bytes += static_cast<char>(b);
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  return out;
}

std::string strip_token(const std::string& t, const std::string& content, size_t start, size_t stop) {
  size_t b = 0, e = t.size();
  for (size_t k = 0; k < start && t.compare(b, content.size(), content) == 0 && b < e; ++k) b += content.size();
  for (size_t k = 0; k < stop && e >= b + content.size() && t.compare(e - content.size(), content.size(), content) == 0; ++k)
    e -= content.size();
  return t.substr(b, e - b);
}

// Maps each token's chars back to bytes (a token with a char outside the table keeps its
// UTF-8 bytes), concatenates them and decodes leniently, as one output token.
std::string byte_level_decode(const std::vector<std::string>& tokens) {
  static const std::unordered_map<uint32_t, uint8_t> inv = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    const auto& fwd = byte_to_unicode();
    for (int b = 0; b < 256; ++b) m[fwd[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
    return m;
  }();
  std::string raw, tok;
  for (const auto& t : tokens) {
    tok.clear();
    bool ok = true;
    for (size_t i = 0; i < t.size() && ok;) {
      auto it = inv.find(utf8_next(t, i));
      if (it == inv.end()) ok = false;
      else tok += static_cast<char>(it->second);
    }
    raw += ok ? tok : t;
  }
  return utf8_valid(raw) ? raw : utf8_sanitize(raw);
}

}  // namespace

std::string apply_decoders(const std::vector<DecStep>& steps, std::vector<std::string> tokens) {
  if (steps.empty()) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const auto& st : steps) {
    switch (st.kind) {
      case DecStep::kReplace:
        for (auto& t : tokens) replace_all(t, st.from, st.to);
        break;
      case DecStep::kByteFallback:
        tokens = byte_fallback(tokens);
        break;
      case DecStep::kFuse: {
        std::string all;
        for (auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecStep::kStrip:
        for (auto& t : tokens) t = strip_token(t, st.from, st.start, st.stop);
        break;
      case DecStep::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          const std::string& t = tokens[i];
          for (size_t k = 0; k < t.size();) {
            if (t.compare(k, st.replacement.size(), st.replacement) == 0) {
              if (!(i == 0 && st.prepend)) out += ' ';
              k += st.replacement.size();
            } else {
              out += t[k++];
            }
          }
          tokens[i] = std::move(out);
        }
        break;
      case DecStep::kByteLevel:
        tokens.assign(1, byte_level_decode(tokens));
        break;
    }
  }
  std::string out;
  for (auto& t : tokens) out += t;
  return out;
}

}  // namespace zaya::tok
