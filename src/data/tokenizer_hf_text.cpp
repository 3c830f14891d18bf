// Normalizers and pre-tokenizers of tokenizer.json, applied to plain UTF-8 strings (zaya
// needs ids, not offsets, so no alignment tracking).
#include <algorithm>

#include "data/tokenizer_hf_pipeline.h"
#include "data/tokenizer_utf8.h"

namespace zaya::tok {

// Every occurrence of `from` in s, left to right and not overlapping, becomes `to` (an empty
// `from`, which the tokenizer's parser refuses, changes nothing).
void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  size_t pos = s.find(from);
  if (pos == std::string::npos) return;
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t last = 0;
  for (; pos != std::string::npos; pos = s.find(from, last)) {
    out.append(s, last, pos - last);
    out += to;
    last = pos + from.size();
  }
  out.append(s, last, std::string::npos);
  s.swap(out);
}

namespace {

void strip_spaces(std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e) {
      size_t j = b;
      if (!is_unicode_space(utf8_next(s, j))) break;
      b = j;
    }
  if (right)
    while (e > b) {
      size_t j = utf8_prev_start(s, e), k = j;
      if (!is_unicode_space(utf8_next(s, k))) break;
      e = j;
    }
  s = s.substr(b, e - b);
}

struct Seg {
  size_t start, end;
  bool match;
};

// Splits `p` into pieces given its match segments, following Hugging Face's behaviours.
void split_by_segments(Piece&& p, std::vector<Seg> segs, SplitBehavior behavior, bool invert,
                       std::vector<Piece>& out) {
  if (invert)
    for (auto& s : segs) s.match = !s.match;
  std::vector<std::pair<Seg, bool>> acc;  // (range, remove)
  bool prev_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto& s : segs) acc.push_back({s, false});
      break;
    case SplitBehavior::kRemoved:
      for (auto& s : segs) acc.push_back({s, s.match});
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (auto& s : segs) {
        if (s.match && !prev_match && !acc.empty())
          acc.back().first.end = s.end;
        else
          acc.push_back({s, false});
        prev_match = s.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->match && !prev_match && !acc.empty())
          acc.back().first.start = it->start;
        else
          acc.push_back({*it, false});
        prev_match = it->match;
      }
      std::reverse(acc.begin(), acc.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t i = 0; i < segs.size(); ++i) {
        if (i > 0 && segs[i].match == prev_match)
          acc.back().first.end = segs[i].end;
        else
          acc.push_back({segs[i], false});
        prev_match = segs[i].match;
      }
      break;
  }
  if (acc.size() == 1 && !acc[0].second && acc[0].first.start == 0 && acc[0].first.end == p.text.size()) {
    out.push_back(std::move(p));
    return;
  }
  for (const auto& [r, remove] : acc)
    if (!remove && r.end > r.start) out.push_back({p.text.substr(r.start, r.end - r.start), p.at_start && r.start == 0});
}

std::vector<Seg> find_string(const std::string& s, const std::string& pat) {
  std::vector<Seg> segs;
  size_t last = 0;
  for (size_t pos = s.find(pat); pos != std::string::npos; pos = s.find(pat, last)) {
    if (pos > last) segs.push_back({last, pos, false});
    segs.push_back({pos, pos + pat.size(), true});
    last = pos + pat.size();
  }
  if (last < s.size()) segs.push_back({last, s.size(), false});
  return segs;
}

enum class Cls { kLetter, kNumber, kSpace, kOther };
Cls classify(uint32_t cp) {
  if (is_unicode_space(cp)) return Cls::kSpace;
  if (is_unicode_letter(cp)) return Cls::kLetter;
  if (is_unicode_number(cp)) return Cls::kNumber;
  return Cls::kOther;
}

// Matches of the GPT-2 pattern
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<Seg> gpt2_segments(const std::string& s) {
  std::vector<Seg> segs;
  size_t n = s.size(), i = 0;
  auto cls_at = [&](size_t k) {
    size_t j = k;
    return classify(utf8_next(s, j));
  };
  auto run = [&](size_t k, Cls c) {
    while (k < n) {
      size_t j = k;
      if (classify(utf8_next(s, j)) != c) break;
      k = j;
    }
    return k;
  };
  while (i < n) {
    size_t end = i;
    if (s[i] == '\'' && i + 1 < n) {
      char a = s[i + 1], b = i + 2 < n ? s[i + 2] : '\0';
      if (a == 's' || a == 't' || a == 'm' || a == 'd') end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) end = i + 3;
    }
    if (end == i) {
      size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
      Cls c = cls_at(j);
      if (c != Cls::kSpace) {
        end = run(j, c);
      } else {
        size_t k = run(i, Cls::kSpace);
        if (k == n) end = k;
        else if (utf8_prev_start(s, k) > i) end = utf8_prev_start(s, k);
        else end = k;
      }
    }
    segs.push_back({i, end, true});
    i = end;
  }
  return segs;
}

std::vector<Seg> word_segments(const std::string& s) {  // \w+|[^\w\s]+
  std::vector<Seg> segs;
  size_t n = s.size(), i = 0;
  auto kind = [&](size_t k, size_t& next) {
    next = k;
    uint32_t cp = utf8_next(s, next);
    return is_unicode_space(cp) ? 0 : is_word_char(cp) ? 1 : 2;
  };
  while (i < n) {
    size_t j;
    int k = kind(i, j);
    size_t e = j;
    while (e < n) {
      size_t nx;
      if (kind(e, nx) != k) break;
      e = nx;
    }
    segs.push_back({i, e, k != 0});
    i = e;
  }
  return segs;
}

void byte_level_map(std::string& s) {
  const auto& table = byte_to_unicode();
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char b : s) utf8_append(out, table[b]);
  s.swap(out);
}

}  // namespace

const std::vector<uint32_t>& byte_to_unicode() {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256);
    uint32_t extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[b] = keep ? b : extra++;
    }
    return t;
  }();
  return table;
}

void apply_normalizers(const std::vector<NormStep>& steps, std::string& s) {
  for (const auto& st : steps) {
    switch (st.kind) {
      case NormStep::kReplace:
        replace_all(s, st.from, st.to);
        break;
      case NormStep::kPrepend:
        if (!s.empty()) s.insert(0, st.to);
        break;
      case NormStep::kStrip:
        strip_spaces(s, st.left, st.right);
        break;
    }
  }
}

void apply_pre_tokenizers(const std::vector<PreTokStep>& steps, std::vector<Piece>& pieces) {
  std::vector<Piece> next;
  for (const auto& st : steps) {
    next.clear();
    for (auto& p : pieces) {
      switch (st.kind) {
        case PreTokStep::kSplit:
          split_by_segments(std::move(p), find_string(p.text, st.pattern), st.behavior, st.invert, next);
          break;
        case PreTokStep::kMetaspace: {
          replace_all(p.text, " ", st.replacement);
          bool starts = p.text.compare(0, st.replacement.size(), st.replacement) == 0;
          if (!starts && (st.prepend == PreTokStep::kAlways || (st.prepend == PreTokStep::kFirst && p.at_start)))
            p.text.insert(0, st.replacement);
          if (st.split)
            split_by_segments(std::move(p), find_string(p.text, st.replacement), SplitBehavior::kMergedWithNext,
                              false, next);
          else
            next.push_back(std::move(p));
          break;
        }
        case PreTokStep::kByteLevel: {
          if (st.add_prefix_space && p.text.compare(0, 1, " ") != 0) p.text = " " + p.text;
          size_t first = next.size();
          if (st.use_regex)
            split_by_segments(std::move(p), gpt2_segments(p.text), SplitBehavior::kIsolated, false, next);
          else
            next.push_back(std::move(p));
          for (size_t k = first; k < next.size(); ++k) byte_level_map(next[k].text);
          break;
        }
        case PreTokStep::kWhitespace:
          split_by_segments(std::move(p), word_segments(p.text), SplitBehavior::kRemoved, true, next);
          break;
        case PreTokStep::kWhitespaceSplit: {
          std::vector<Seg> segs;
          size_t n = p.text.size(), i = 0;
          while (i < n) {
            size_t j = i;
            bool sp = is_unicode_space(utf8_next(p.text, j));
            size_t e = j;
            while (e < n) {
              size_t k = e;
              if (is_unicode_space(utf8_next(p.text, k)) != sp) break;
              e = k;
            }
            segs.push_back({i, e, sp});
            i = e;
          }
          split_by_segments(std::move(p), segs, SplitBehavior::kRemoved, false, next);
          break;
        }
      }
    }
    pieces.swap(next);
  }
}

}  // namespace zaya::tok
