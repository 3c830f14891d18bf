// Manifest layout, self-checksum and field checks shared by both checkpoint formats (see
// manifest_common.h).
#include "ckpt/manifest_common.h"

#include <time.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "ckpt/checksum.h"
#include "ckpt/file_io.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace zaya::manifest_common {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// The manifest starts with exactly this text followed by 8 hex digits and '"'.
constexpr const char* kManifestHead = "{\n  \"manifest_checksum\": \"";

}  // namespace

std::string format_manifest_text(const ojson& man) {
  std::string out = "{\n";
  bool first = true;
  for (auto it = man.begin(); it != man.end(); ++it) {
    out += first ? "" : ",\n";
    first = false;
    out += "  " + ojson(it.key()).dump() + ": ";
    if (it->is_array() && (it.key() == "files" || it.key() == "tensors")) {
      out += "[";
      for (size_t i = 0; i < it->size(); ++i) out += (i ? ",\n    " : "\n    ") + (*it)[i].dump();
      out += it->empty() ? "]" : "\n  ]";
    } else {
      std::string v = it->dump(2);
      for (size_t pos = v.find('\n'); pos != std::string::npos; pos = v.find('\n', pos + 3)) v.insert(pos + 1, "  ");
      out += v;
    }
  }
  out += "\n}\n";
  const size_t head = std::strlen(kManifestHead);
  ZAYA_CHECK(out.compare(0, head, kManifestHead) == 0 && out.compare(head, 9, "00000000\"") == 0, "manifest layout");
  out.replace(head, 8, checksum_hex(crc32c(out.data(), out.size())));
  return out;
}

std::string check_manifest_checksum(const std::string& text) {
  const size_t head = std::strlen(kManifestHead);
  uint32_t stored = 0;
  if (text.size() < head + 9 || text.compare(0, head, kManifestHead) != 0 || text[head + 8] != '"' ||
      !parse_checksum_hex(text.substr(head, 8), &stored))
    return "corrupt or truncated (does not start with the manifest_checksum field)";
  std::string zeroed = text;
  zeroed.replace(head, 8, "00000000");
  const uint32_t actual = crc32c(zeroed.data(), zeroed.size());
  if (actual != stored)
    return "checksum mismatch (manifest says " + checksum_hex(stored) + ", contents give " + checksum_hex(actual) +
           "): the manifest is corrupt or truncated";
  return "";
}

std::string check_step_matches_dir(const std::string& dir, uint64_t step) {
  int64_t dir_step = 0;
  std::string base = fs::path(dir).lexically_normal().filename().string();
  if (base.empty()) base = fs::path(dir).lexically_normal().parent_path().filename().string();
  if (ckpt_io::parse_step_dir_name(base, &dir_step) && uint64_t(dir_step) != step)
    return "field 'step' is " + std::to_string(step) + " but the directory is " + base;
  return "";
}

bool get_uint(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = uint64_t(v.get<int64_t>());
    return true;
  }
  return false;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool shape_numel(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n) || n > (uint64_t(1) << 62)) return false;
  *out = n;
  return true;
}

bool valid_group(const std::string& g) {
  if (g.empty() || g.size() > 64) return false;
  for (char c : g)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

bool plain_file_name(const std::string& s) {
  if (s.empty() || s == "." || s == ".." || s.size() > 255) return false;
  for (char c : s)
    if (c == '/' || c == '\\' || c == '\0') return false;
  return true;
}

std::string utc_now_iso(int64_t* unix_seconds) {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  *unix_seconds = int64_t(t);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace zaya::manifest_common
