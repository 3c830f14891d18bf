// Parses the normalizer, pre_tokenizer and decoder sections of tokenizer.json into flat
// step lists. Anything we do not implement is rejected with the component's name.
#include "core/error.h"
#include "data/tokenizer_hf_pipeline.h"

namespace zaya::tok {

using nlohmann::json;

namespace {

std::string type_of(const json& j, const std::string& file, const char* section) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("tokenizer", file + ": " + section + " must be an object with a string 'type'");
  return j["type"].get<std::string>();
}

[[noreturn]] void unsupported(const std::string& file, const char* section, const std::string& type,
                              const std::string& why, const std::string& hint = {}) {
  fail("tokenizer", file + ": " + section + " type '" + type + "' is not supported" + why, hint);
}

// A {"String": "..."} pattern; Regex patterns are rejected.
std::string string_pattern(const json& j, const std::string& file, const char* section,
                           const std::string& type) {
  const json& p = j.at("pattern");
  if (p.contains("String")) return p["String"].get<std::string>();
  unsupported(file, section, type, " with a Regex pattern (only String patterns)");
}

std::string str_field(const json& j, const char* key, const std::string& dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  return j[key].get<std::string>();
}

void parse_norm(const json& j, const std::string& file, std::vector<NormStep>& out) {
  if (j.is_null()) return;
  std::string type = type_of(j, file, "normalizer");
  if (type == "Sequence") {
    for (const auto& n : j.at("normalizers")) parse_norm(n, file, out);
  } else if (type == "Replace") {
    out.push_back({NormStep::kReplace, string_pattern(j, file, "normalizer", type), j.at("content").get<std::string>()});
  } else if (type == "Prepend") {
    out.push_back({NormStep::kPrepend, {}, j.at("prepend").get<std::string>()});
  } else if (type == "Strip") {
    NormStep s{NormStep::kStrip, {}, {}};
    s.left = j.value("strip_left", false);
    s.right = j.value("strip_right", false);
    out.push_back(s);
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD" || type == "Precompiled") {
    unsupported(file, "normalizer", type, " (zaya has no Unicode normalization tables)",
                "use a tokenizer.json without Unicode normalization, or the SentencePiece .model");
  } else {
    unsupported(file, "normalizer", type, "", "supported: Sequence, Replace, Prepend, Strip");
  }
}

SplitBehavior parse_behavior(const json& j, const std::string& file) {
  std::string b = j.value("behavior", std::string("Isolated"));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  fail("tokenizer", file + ": pre_tokenizer 'Split' behavior '" + b + "' is unknown");
}

PreTokStep::Prepend parse_prepend(const json& j, const std::string& file, const char* section) {
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return PreTokStep::kAlways;
    if (s == "first") return PreTokStep::kFirst;
    if (s == "never") return PreTokStep::kNever;
    fail("tokenizer", file + ": " + section + " 'Metaspace' prepend_scheme '" + s + "' is unknown");
  }
  return j.value("add_prefix_space", true) ? PreTokStep::kAlways : PreTokStep::kNever;
}

void parse_pre(const json& j, const std::string& file, std::vector<PreTokStep>& out) {
  if (j.is_null()) return;
  std::string type = type_of(j, file, "pre_tokenizer");
  PreTokStep s{};
  if (type == "Sequence") {
    for (const auto& p : j.at("pretokenizers")) parse_pre(p, file, out);
    return;
  } else if (type == "Split") {
    s.kind = PreTokStep::kSplit;
    s.pattern = string_pattern(j, file, "pre_tokenizer", type);
    s.behavior = parse_behavior(j, file);
    s.invert = j.value("invert", false);
  } else if (type == "Metaspace") {
    s.kind = PreTokStep::kMetaspace;
    s.replacement = str_field(j, "replacement", "\xE2\x96\x81");
    s.prepend = parse_prepend(j, file, "pre_tokenizer");
    s.split = j.value("split", true);
  } else if (type == "ByteLevel") {
    s.kind = PreTokStep::kByteLevel;
    s.add_prefix_space = j.value("add_prefix_space", false);
    s.use_regex = j.value("use_regex", true);
  } else if (type == "Whitespace") {
    s.kind = PreTokStep::kWhitespace;
  } else if (type == "WhitespaceSplit") {
    s.kind = PreTokStep::kWhitespaceSplit;
  } else {
    unsupported(file, "pre_tokenizer", type, "",
                "supported: Sequence, Split (String pattern), Metaspace, ByteLevel, Whitespace, WhitespaceSplit");
  }
  out.push_back(std::move(s));
}

void parse_dec(const json& j, const std::string& file, std::vector<DecStep>& out) {
  if (j.is_null()) return;
  std::string type = type_of(j, file, "decoder");
  DecStep s{};
  if (type == "Sequence") {
    for (const auto& d : j.at("decoders")) parse_dec(d, file, out);
    return;
  } else if (type == "Replace") {
    s.kind = DecStep::kReplace;
    s.from = string_pattern(j, file, "decoder", type);
    s.to = j.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    s.kind = DecStep::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = DecStep::kFuse;
  } else if (type == "Strip") {
    s.kind = DecStep::kStrip;
    s.from = j.at("content").get<std::string>();
    s.start = j.value("start", size_t{0});
    s.stop = j.value("stop", size_t{0});
  } else if (type == "Metaspace") {
    s.kind = DecStep::kMetaspace;
    s.replacement = str_field(j, "replacement", "\xE2\x96\x81");
    s.prepend = parse_prepend(j, file, "decoder") != PreTokStep::kNever;
  } else if (type == "ByteLevel") {
    s.kind = DecStep::kByteLevel;
  } else {
    unsupported(file, "decoder", type, "",
                "supported: Sequence, Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel");
  }
  out.push_back(std::move(s));
}

template <class T, class F>
std::vector<T> guarded(const json& j, const std::string& file, const char* section, F parse) {
  std::vector<T> out;
  try {
    parse(j, file, out);
  } catch (const json::exception& e) {
    fail("tokenizer", file + ": " + section + ": " + e.what());
  }
  return out;
}

}  // namespace

std::vector<NormStep> parse_normalizer(const json& j, const std::string& file) {
  auto steps = guarded<NormStep>(j, file, "normalizer", parse_norm);
  for (const auto& s : steps)
    if (s.kind == NormStep::kReplace && s.from.empty())
      fail("tokenizer", file + ": normalizer 'Replace' has an empty pattern");
  return steps;
}

std::vector<PreTokStep> parse_pre_tokenizer(const json& j, const std::string& file) {
  auto steps = guarded<PreTokStep>(j, file, "pre_tokenizer", parse_pre);
  for (const auto& s : steps)
    if (s.kind == PreTokStep::kSplit && s.pattern.empty())
      fail("tokenizer", file + ": pre_tokenizer 'Split' has an empty pattern");
  return steps;
}

std::vector<DecStep> parse_decoder(const json& j, const std::string& file) {
  auto steps = guarded<DecStep>(j, file, "decoder", parse_dec);
  for (const auto& s : steps)
    if (s.kind == DecStep::kReplace && s.from.empty())
      fail("tokenizer", file + ": decoder 'Replace' has an empty pattern");
  return steps;
}

}  // namespace zaya::tok
