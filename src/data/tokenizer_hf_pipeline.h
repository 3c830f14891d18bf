// The text stages of a tokenizer.json around the BPE model: normalizers, pre-tokenizers,
// post-processor template and decoders, each parsed into a flat list of steps (Sequence
// components are flattened). Parsing errors name the file and the component.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zaya::tok {

struct NormStep {
  enum Kind { kReplace, kPrepend, kStrip } kind;
  std::string from, to;  // Replace: from -> to; Prepend: to
  bool left = false, right = false;  // Strip
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokStep {
  enum Kind { kSplit, kMetaspace, kByteLevel, kWhitespace, kWhitespaceSplit } kind;
  std::string pattern;  // Split
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  std::string replacement;  // Metaspace (UTF-8 of the replacement char)
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
  bool split = true;               // Metaspace
  bool add_prefix_space = false;   // ByteLevel
  bool use_regex = true;           // ByteLevel
};

struct DecStep {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace, kByteLevel } kind;
  std::string from, to;  // Replace; Strip: from = content
  size_t start = 0, stop = 0;  // Strip
  std::string replacement;     // Metaspace
  bool prepend = true;         // Metaspace: prepend_scheme != never
};

// A piece of text on its way to the model; at_start: begins at offset 0 of the input.
struct Piece {
  std::string text;
  bool at_start;
};

// Post-processor: ids emitted around sequence A when add_special is set.
struct PostTemplate {
  std::vector<int32_t> before, after;
  bool present = false;
};

std::vector<NormStep> parse_normalizer(const nlohmann::json& j, const std::string& file);
std::vector<PreTokStep> parse_pre_tokenizer(const nlohmann::json& j, const std::string& file);
std::vector<DecStep> parse_decoder(const nlohmann::json& j, const std::string& file);
// token_id resolves a token string to an id (-1 if absent).
template <class F>
PostTemplate parse_post_processor(const nlohmann::json& j, const std::string& file, F token_id);

void apply_normalizers(const std::vector<NormStep>& steps, std::string& s);
// Replaces `pieces` by the result of the pre-tokenizer chain.
void apply_pre_tokenizers(const std::vector<PreTokStep>& steps, std::vector<Piece>& pieces);
// Runs the decoder chain over token strings and concatenates the result.
std::string apply_decoders(const std::vector<DecStep>& steps, std::vector<std::string> tokens);

// GPT-2 byte <-> unicode-char table used by ByteLevel.
const std::vector<uint32_t>& byte_to_unicode();

// Every occurrence of `from` in s, left to right and not overlapping, becomes `to` (tokenizer_hf_text.cpp).
void replace_all(std::string& s, const std::string& from, const std::string& to);

}  // namespace zaya::tok

#include "data/tokenizer_hf_post.inl"
