// What the manifests of both checkpoint formats share (docs/checkpoint-format.md): the
// self-checksummed manifest.json layout, JSON and shape field checks, file and group name
// rules, the "created" timestamp, and the check of "step" against the step-* directory name.
// Internal to src/ckpt (checkpoint.cpp, format version 1, and dist_manifest.cpp, version 2).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zaya::manifest_common {

constexpr const char* kFormatName = "zaya-checkpoint";
constexpr const char* kManifestName = "manifest.json";

// The manifest.json text of `man`: one top-level field per line (nested values indented), one
// line per element of "files" and "tensors", so a manifest of thousands of tensors stays
// readable and greppable. The first field of `man` must be "manifest_checksum": "00000000";
// its digits become the CRC-32C of the whole text with those digits as "00000000".
std::string format_manifest_text(const nlohmann::ordered_json& man);
// Checks the self-checksum of manifest.json text (see format_manifest_text); "" or the problem.
std::string check_manifest_checksum(const std::string& text);
// "" or the problem when `dir` is named step-<n> with n != step.
std::string check_step_matches_dir(const std::string& dir, uint64_t step);

// A non-negative JSON integer; false for anything else.
bool get_uint(const nlohmann::json& v, uint64_t* out);

// "[2, 3]"
std::string shape_text(const std::vector<int64_t>& shape);
// numel of a shape; false for negative dimensions or more than 2^62 elements.
bool shape_numel(const std::vector<int64_t>& shape, uint64_t* out);
// 1-64 characters of [A-Za-z0-9_-].
bool valid_group(const std::string& g);
// A file name without directory parts (no '/', '\\', NUL; not "." or "..").
bool plain_file_name(const std::string& s);

// The current UTC time as "2024-01-02T03:04:05Z"; *unix_seconds gets it as a Unix time.
std::string utc_now_iso(int64_t* unix_seconds);

}  // namespace zaya::manifest_common
