// Checkpoint save (temp directory + fsync + rename commit, pruning) and load (manifest and
// checksum validation, fallback to older checkpoints). Format: docs/checkpoint-format.md.
#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include "ckpt/checksum.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace zaya {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kComponent = "checkpoint";
constexpr const char* kFormatName = "zaya-checkpoint";
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kTmpPrefix = ".tmp-";
// The manifest starts with exactly this text followed by 8 hex digits and '"'; the digits are
// the CRC-32C of the whole file with those digits replaced by "00000000".
constexpr const char* kManifestHead = "{\n  \"manifest_checksum\": \"";

[[noreturn]] void fail_ck(const std::string& message, const std::string& hint = {}) {
  fail(kComponent, message, hint);
}

std::string errno_text() { return std::strerror(errno); }

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string step_dir_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08lld", (long long)step);
  return buf;
}

// "step-<digits>" -> step; false for anything else.
bool parse_step_dir_name(const std::string& name, int64_t* step) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return false;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + (name[i] - '0');
  }
  *step = v;
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

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// numel of a validated (non-negative) shape; false on overflow past 2^62 elements.
bool shape_numel(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n) || n > (uint64_t(1) << 62)) return false;
  }
  *out = n;
  return true;
}

void default_warn(const std::string& msg) { std::fprintf(stderr, "zaya: warning: %s\n", msg.c_str()); }

CheckpointWarn warner(const CheckpointWarn& w) { return w ? w : CheckpointWarn(default_warn); }

// ---------------------------------------------------------------------------------------------
// Durable file-system primitives.

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_ck(path + ": write failed: " + errno_text());
    }
    if (w == 0) fail_ck(path + ": short write");
    p += w;
    n -= size_t(w);
  }
}

// Creates `path` with `text`, fsynced before returning.
void write_file_durable(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_ck(path + ": cannot create: " + errno_text());
  try {
    write_all(fd, text.data(), text.size(), path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::fsync(fd) != 0) {
    std::string err = errno_text();
    ::close(fd);
    fail_ck(path + ": fsync failed: " + err);
  }
  if (::close(fd) != 0) fail_ck(path + ": close failed: " + errno_text());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_ck(dir + ": cannot open directory to fsync: " + errno_text());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems do not support fsync on directories; their renames are durable anyway.
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    fail_ck(dir + ": fsync of the directory failed: " + std::strerror(err));
}

// Reads up to n bytes at offset; returns the count read.
size_t read_at(int fd, void* buf, size_t n, uint64_t offset) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, static_cast<char*>(buf) + got, n - got, off_t(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return got;
    }
    if (r == 0) break;
    got += size_t(r);
  }
  return got;
}

// Removes a directory tree so that a crash midway never leaves a damaged step-* directory:
// it is first renamed to a .tmp-* name (which loaders ignore and the next save removes).
void remove_dir_safely(const std::string& root, const std::string& name, const CheckpointWarn& warn) {
  const std::string from = join(root, name);
  const std::string doomed = join(root, std::string(kTmpPrefix) + "delete-" + name + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(doomed, ec);
  if (::rename(from.c_str(), doomed.c_str()) != 0) {
    warn("cannot remove old checkpoint " + from + ": rename failed: " + errno_text());
    return;
  }
  fs::remove_all(doomed, ec);
  if (ec) warn("cannot fully remove " + doomed + ": " + ec.message());
}

void remove_stale_tmp(const std::string& root, const std::string& keep, const CheckpointWarn& warn) {
  std::error_code ec;
  fs::directory_iterator it(root, ec), end;
  if (ec) return;
  std::vector<fs::path> stale;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    std::string name = it->path().filename().string();
    if (name.rfind(kTmpPrefix, 0) == 0 && name != keep) stale.push_back(it->path());
  }
  for (const auto& p : stale) {
    std::error_code rec;
    fs::remove_all(p, rec);
    if (rec) warn("cannot remove stale " + p.string() + ": " + rec.message());
  }
}

std::string utc_now_iso(int64_t* unix_seconds) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  *unix_seconds = int64_t(t);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Save helpers

struct SavedFile {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Writes one group's safetensors file and returns its size and whole-file CRC. The file CRC
// is assembled from the header bytes (read back, they are small) and the tensor CRCs already
// computed from memory: write_safetensors lays the tensors out back to back in order.
SavedFile write_group(const std::string& dir, const std::string& group, const std::vector<const CheckpointTensor*>& ts,
                      const std::vector<uint32_t>& crcs, const std::vector<uint64_t>& nbytes) {
  SavedFile out;
  out.name = group + ".safetensors";
  const std::string path = join(dir, out.name);
  std::vector<TensorToWrite> tw;
  tw.reserve(ts.size());
  for (const CheckpointTensor* t : ts) tw.push_back({t->name, DType::F32, t->shape, t->data});
  try {
    write_safetensors(path, tw, {{"format", kFormatName}});
  } catch (const Error& e) {
    fail_ck("cannot write " + path + ": " + e.message());
  }

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_ck(path + ": cannot reopen after writing: " + errno_text());
  struct stat st {};
  uint8_t len8[8];
  bool ok = ::fstat(fd, &st) == 0 && read_at(fd, len8, 8, 0) == 8;
  uint64_t hlen = 0;
  for (int i = 7; ok && i >= 0; --i) hlen = (hlen << 8) | len8[i];
  std::string header;
  if (ok && hlen < (uint64_t(1) << 32)) {
    header.resize(static_cast<size_t>(hlen));
    ok = read_at(fd, header.data(), header.size(), 8) == header.size();
  } else {
    ok = false;
  }
  ::close(fd);
  if (!ok) fail_ck(path + ": cannot read back the safetensors header just written");

  // The data must follow the header in our order, contiguously: check the offsets.
  uint64_t data_bytes = 0;
  try {
    json h = json::parse(header);
    for (size_t i = 0; i < ts.size(); ++i) {
      const json& off = h.at(ts[i]->name).at("data_offsets");
      if (off.at(0).get<uint64_t>() != data_bytes || off.at(1).get<uint64_t>() != data_bytes + nbytes[i])
        fail_ck(path + ": tensor '" + ts[i]->name + "' was not written at the expected offset");
      data_bytes += nbytes[i];
    }
  } catch (const json::exception& e) {
    fail_ck(path + ": cannot parse the safetensors header just written: " + e.what());
  }
  out.bytes = 8 + hlen + data_bytes;
  if (uint64_t(st.st_size) != out.bytes)
    fail_ck(path + ": is " + std::to_string(st.st_size) + " bytes after writing, expected " +
            std::to_string(out.bytes));
  uint32_t crc = crc32c(len8, 8);
  crc = crc32c(crc, header.data(), header.size());
  for (size_t i = 0; i < ts.size(); ++i) crc = crc32c_combine(crc, crcs[i], nbytes[i]);
  out.crc = crc;
  return out;
}

// The manifest text: one top-level field per line, meta indented, and one line per file and
// per tensor, so a manifest of thousands of tensors stays readable and greppable.
std::string format_manifest(const ojson& man) {
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
  return out + "\n}\n";
}

// ---------------------------------------------------------------------------------------------
// Load: a memory-mapped file.

struct MappedFile {
  std::string path;
  const uint8_t* base = nullptr;
  size_t size = 0;
  uint64_t data_offset = 0;
  std::vector<SafeTensorInfo> tensors;
  std::map<std::string, size_t> index;
  ~MappedFile() {
    if (base != nullptr) ::munmap(const_cast<uint8_t*>(base), size);
  }
  const SafeTensorInfo* find(const std::string& key) const {
    auto it = index.find(key);
    return it == index.end() ? nullptr : &tensors[it->second];
  }
  const uint8_t* bytes(const SafeTensorInfo& t) const { return base + data_offset + t.begin; }
};

}  // namespace

namespace detail {

struct Piece {
  int64_t rank = 0;
  std::string file;
  std::string key;
  uint64_t offset = 0;  // elements into the flattened global tensor
  uint64_t length = 0;  // elements
  uint32_t crc = 0;
  const MappedFile* mapped = nullptr;
  const SafeTensorInfo* info = nullptr;
};

struct TensorRecord {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  std::vector<Piece> pieces;
};

struct CheckpointData {
  std::string dir;
  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<TensorRecord> tensors;
  std::map<std::string, size_t> index;
  bool verified = false;  // every file checksum matched at load
};

}  // namespace detail

namespace {

using detail::CheckpointData;
using detail::Piece;
using detail::TensorRecord;

// Collects every problem found, so `zaya ckpt inspect` can list them all.
struct Problems {
  std::vector<std::string> list;
  void add(std::string p) { list.push_back(std::move(p)); }
};

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

bool get_checksum(const json& v, uint32_t* out) {
  return v.is_string() && parse_checksum_hex(v.get_ref<const std::string&>(), out);
}

// Reads and validates manifest.json; null on failure (with the problem recorded).
json read_manifest(const std::string& dir, Problems& pr) {
  const std::string path = join(dir, kManifestName);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    pr.add(path + ": " + (errno == ENOENT ? std::string("missing") : "cannot open: " + errno_text()) +
           " (not a complete checkpoint)");
    return nullptr;
  }
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    text.append(buf, size_t(r));
    if (text.size() > (size_t(1) << 30)) break;
  }
  ::close(fd);
  const size_t head = std::strlen(kManifestHead);
  uint32_t stored = 0;
  if (text.size() < head + 9 || text.compare(0, head, kManifestHead) != 0 || text[head + 8] != '"' ||
      !parse_checksum_hex(text.substr(head, 8), &stored)) {
    pr.add(path + ": corrupt or truncated (does not start with the manifest_checksum field)");
    return nullptr;
  }
  std::string zeroed = text;
  zeroed.replace(head, 8, "00000000");
  uint32_t actual = crc32c(zeroed.data(), zeroed.size());
  if (actual != stored) {
    pr.add(path + ": checksum mismatch (manifest says " + checksum_hex(stored) + ", contents give " +
           checksum_hex(actual) + "): the manifest is corrupt or truncated");
    return nullptr;
  }
  json m;
  try {
    m = json::parse(text);
  } catch (const json::exception& e) {
    pr.add(path + ": not valid JSON: " + e.what());
    return nullptr;
  }
  if (!m.is_object()) {
    pr.add(path + ": expected a JSON object");
    return nullptr;
  }
  if (!m.contains("format") || m["format"] != kFormatName) {
    pr.add(path + ": field 'format' must be \"" + kFormatName + "\"");
    return nullptr;
  }
  uint64_t version = 0;
  if (!m.contains("version") || !get_uint(m["version"], &version) || version < 1) {
    pr.add(path + ": field 'version' must be a positive integer");
    return nullptr;
  }
  if (version > uint64_t(kCheckpointFormatVersion)) {
    pr.add(path + ": format version " + std::to_string(version) + " is newer than this zaya reads (" +
           std::to_string(kCheckpointFormatVersion) + "); upgrade zaya");
    return nullptr;
  }
  uint64_t step = 0;
  if (!m.contains("step") || !get_uint(m["step"], &step)) {
    pr.add(path + ": field 'step' must be a non-negative integer");
    return nullptr;
  }
  int64_t dir_step = 0;
  std::string base = fs::path(dir).lexically_normal().filename().string();
  if (base.empty()) base = fs::path(dir).lexically_normal().parent_path().filename().string();
  if (parse_step_dir_name(base, &dir_step) && uint64_t(dir_step) != step) {
    pr.add(path + ": field 'step' is " + std::to_string(step) + " but the directory is " + base);
    return nullptr;
  }
  for (const char* k : {"files", "tensors"}) {
    if (!m.contains(k) || !m[k].is_array()) {
      pr.add(path + ": field '" + k + "' must be an array");
      return nullptr;
    }
  }
  if (!m.contains("meta")) m["meta"] = json::object();
  return m;
}

// Builds the tensor table from the manifest and opens the files. Returns null when the
// checkpoint cannot be used; problems are recorded.
std::shared_ptr<CheckpointData> open_checkpoint(const std::string& dir, const json& m, bool verify, Problems& pr) {
  auto data = std::make_shared<CheckpointData>();
  data->dir = dir;
  const std::string mpath = join(dir, kManifestName);
  uint64_t world = 1;
  if (m.contains("world_size") && (!get_uint(m["world_size"], &world) || world < 1)) {
    pr.add(mpath + ": field 'world_size' must be a positive integer");
    return nullptr;
  }

  // Files.
  struct FileEntry {
    std::string name;
    uint64_t bytes = 0;
    uint32_t crc = 0;
    MappedFile* mapped = nullptr;
  };
  std::vector<FileEntry> files;
  std::map<std::string, size_t> file_index;
  for (size_t i = 0; i < m["files"].size(); ++i) {
    const json& f = m["files"][i];
    FileEntry e;
    uint64_t rank = 0;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() ||
        (f.contains("rank") && (!get_uint(f["rank"], &rank) || rank >= world)) ||
        !plain_file_name(f["name"].get<std::string>()) || !f.contains("bytes") || !get_uint(f["bytes"], &e.bytes) ||
        !f.contains("checksum") || !get_checksum(f["checksum"], &e.crc)) {
      pr.add(mpath + ": files[" + std::to_string(i) +
             "] must be {name, rank, bytes, checksum} with a plain file name and rank < world_size");
      return nullptr;
    }
    e.name = f["name"].get<std::string>();
    if (!file_index.emplace(e.name, files.size()).second) {
      pr.add(mpath + ": file '" + e.name + "' is listed twice");
      return nullptr;
    }
    files.push_back(e);
  }

  // Tensors and their pieces (manifest-only checks).
  for (size_t i = 0; i < m["tensors"].size(); ++i) {
    const json& t = m["tensors"][i];
    const std::string where = mpath + ": tensors[" + std::to_string(i) + "]";
    TensorRecord rec;
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty()) {
      pr.add(where + ": missing 'name'");
      return nullptr;
    }
    rec.name = t["name"].get<std::string>();
    const std::string tw = mpath + ": tensor '" + rec.name + "'";
    if (data->index.count(rec.name)) {
      pr.add(tw + " is listed twice");
      return nullptr;
    }
    if (!t.contains("shape") || !t["shape"].is_array()) {
      pr.add(tw + ": 'shape' must be an array");
      return nullptr;
    }
    for (const json& d : t["shape"]) {
      uint64_t v = 0;
      if (!get_uint(d, &v) || v > uint64_t(INT64_MAX)) {
        pr.add(tw + ": 'shape' must hold non-negative integers");
        return nullptr;
      }
      rec.shape.push_back(int64_t(v));
    }
    if (!shape_numel(rec.shape, &rec.numel)) {
      pr.add(tw + ": shape " + shape_text(rec.shape) + " is too large");
      return nullptr;
    }
    if (!t.contains("dtype") || t["dtype"] != "F32") {
      pr.add(tw + ": dtype must be \"F32\" (the only dtype of format version 1)");
      return nullptr;
    }
    if (!t.contains("pieces") || !t["pieces"].is_array()) {
      pr.add(tw + ": 'pieces' must be an array");
      return nullptr;
    }
    for (size_t j = 0; j < t["pieces"].size(); ++j) {
      const json& p = t["pieces"][j];
      Piece pc;
      uint64_t rank = 0;
      if (!p.is_object() || !p.contains("file") || !p["file"].is_string() || !p.contains("offset") ||
          !get_uint(p["offset"], &pc.offset) || !p.contains("length") || !get_uint(p["length"], &pc.length) ||
          !p.contains("checksum") || !get_checksum(p["checksum"], &pc.crc) ||
          (p.contains("rank") && !get_uint(p["rank"], &rank)) || (p.contains("key") && !p["key"].is_string())) {
        pr.add(tw + ": pieces[" + std::to_string(j) + "] must be {rank, file, key, offset, length, checksum}");
        return nullptr;
      }
      if (rank >= world) {
        pr.add(tw + ": pieces[" + std::to_string(j) + "] has rank " + std::to_string(rank) + " >= world_size " +
               std::to_string(world));
        return nullptr;
      }
      pc.rank = int64_t(rank);
      pc.file = p["file"].get<std::string>();
      pc.key = p.contains("key") ? p["key"].get<std::string>() : rec.name;
      if (!file_index.count(pc.file)) {
        pr.add(tw + ": piece file '" + pc.file + "' is not in the manifest's 'files'");
        return nullptr;
      }
      rec.pieces.push_back(pc);
    }
    // The pieces must tile [0, numel) exactly.
    std::vector<Piece> sorted = rec.pieces;
    std::sort(sorted.begin(), sorted.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    uint64_t covered = 0;
    bool tiles = true;
    for (const Piece& pc : sorted) {
      if (pc.offset != covered || pc.length > rec.numel - covered) tiles = false;
      covered += pc.length;
    }
    if (!tiles || covered != rec.numel || (rec.numel > 0 && sorted.empty())) {
      pr.add(tw + ": its pieces do not cover its " + std::to_string(rec.numel) + " elements exactly once");
      return nullptr;
    }
    data->index[rec.name] = data->tensors.size();
    data->tensors.push_back(std::move(rec));
  }

  // Open, size-check and map each file.
  for (FileEntry& e : files) {
    const std::string path = join(dir, e.name);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      pr.add(path + ": " + (errno == ENOENT ? std::string("missing") : "cannot open: " + errno_text()) +
             " (listed in the manifest)");
      continue;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      pr.add(path + ": not a readable regular file");
      continue;
    }
    if (uint64_t(st.st_size) != e.bytes) {
      ::close(fd);
      pr.add(path + ": is " + std::to_string(st.st_size) + " bytes, the manifest says " + std::to_string(e.bytes) +
             (uint64_t(st.st_size) < e.bytes ? " (truncated)" : " (overwritten or appended to)"));
      continue;
    }
    auto mf = std::make_unique<MappedFile>();
    mf->path = path;
    mf->size = size_t(st.st_size);
    if (mf->size > 0) {
      void* p = ::mmap(nullptr, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        std::string err = errno_text();
        ::close(fd);
        pr.add(path + ": cannot mmap: " + err);
        continue;
      }
      mf->base = static_cast<const uint8_t*>(p);
      if (verify) ::madvise(p, mf->size, MADV_SEQUENTIAL);
    }
    ::close(fd);
    try {
      parse_safetensors(mf->base, mf->size, path, &mf->tensors, nullptr, &mf->data_offset);
    } catch (const Error& err) {
      pr.add(err.message());
      continue;
    }
    for (size_t i = 0; i < mf->tensors.size(); ++i) mf->index[mf->tensors[i].name] = i;
    e.mapped = mf.get();
    data->files.push_back(std::move(mf));
  }

  // Resolve each piece against its file's header.
  for (TensorRecord& rec : data->tensors) {
    for (Piece& pc : rec.pieces) {
        const FileEntry& fe = files[file_index[pc.file]];
      if (fe.mapped == nullptr) continue;  // already reported
      const std::string& path = fe.mapped->path;
      const SafeTensorInfo* info = fe.mapped->find(pc.key);
      if (info == nullptr) {
        pr.add(path + ": has no tensor '" + pc.key + "' (the manifest lists it for '" + rec.name + "')");
        continue;
      }
      const bool whole = pc.offset == 0 && pc.length == rec.numel;
      if (info->dtype != DType::F32) {
        pr.add(path + ": tensor '" + pc.key + "' is " + dtype_name(info->dtype) + ", the manifest says F32");
        continue;
      }
      if (info->numel() != pc.length ||
          (whole ? info->shape != rec.shape : info->shape != std::vector<int64_t>{int64_t(pc.length)})) {
        pr.add(path + ": tensor '" + pc.key + "' has shape " + shape_text(info->shape) + ", the manifest says " +
               (whole ? shape_text(rec.shape) : "[" + std::to_string(pc.length) + "]"));
        continue;
      }
      pc.mapped = fe.mapped;
      pc.info = info;
    }
  }

  // Checksums: one pass per file; on a mismatch, find the tensor that differs.
  if (verify) {
    for (const FileEntry& fe : files) {
        if (fe.mapped == nullptr) continue;
      uint32_t actual = crc32c(fe.mapped->base, fe.mapped->size);
      if (actual == fe.crc) continue;
      bool located = false;
      for (const TensorRecord& rec : data->tensors)
        for (const Piece& pc : rec.pieces) {
          if (pc.mapped != fe.mapped) continue;
          uint32_t c = crc32c(pc.mapped->bytes(*pc.info), size_t(pc.info->end - pc.info->begin));
          if (c != pc.crc) {
            pr.add(fe.mapped->path + ": checksum mismatch for tensor '" + rec.name + "' (manifest " +
                   checksum_hex(pc.crc) + ", data " + checksum_hex(c) + ")");
            located = true;
          }
        }
      if (!located)
        pr.add(fe.mapped->path + ": checksum mismatch (manifest " + checksum_hex(fe.crc) + ", file " +
               checksum_hex(actual) + ") outside the tensor data, in the safetensors header");
    }
    data->verified = true;
  }
  if (!pr.list.empty()) return nullptr;
  return data;
}

// open_checkpoint, with a JSON type error in a hand-edited manifest reported as a problem.
std::shared_ptr<CheckpointData> open_checked(const std::string& dir, const json& m, bool verify, Problems& pr) {
  try {
    return open_checkpoint(dir, m, verify, pr);
  } catch (const json::exception& e) {
    pr.add(join(dir, kManifestName) + ": malformed: " + e.what());
    return nullptr;
  }
}

std::string summarize(const Problems& pr) {
  std::string s = pr.list.front();
  if (pr.list.size() > 1) s += " (and " + std::to_string(pr.list.size() - 1) + " more problems)";
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API

std::vector<CheckpointDirEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointDirEntry> out;
  std::error_code ec;
  fs::directory_iterator it(root, ec), end;
  if (ec) return out;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    int64_t step = 0;
    std::error_code dec;
    if (parse_step_dir_name(it->path().filename().string(), &step) && it->is_directory(dec))
      out.push_back({step, it->path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointDirEntry& a, const CheckpointDirEntry& b) { return a.step > b.step; });
  return out;
}

std::string save_checkpoint(const std::string& root, int64_t step, const std::vector<CheckpointTensor>& tensors,
                            const nlohmann::json& meta, int keep_last, const CheckpointSaveOptions& opts) {
  const CheckpointWarn warn = warner(opts.warn);
  if (step < 0) fail_ck("cannot save step " + std::to_string(step) + ": steps must be non-negative");
  if (root.empty()) fail_ck("cannot save: the checkpoint root directory is empty");

  // Validate and group the tensors (groups keep their first-appearance order).
  std::vector<std::string> group_order;
  std::map<std::string, std::vector<size_t>> groups;
  std::set<std::string> names;
  std::vector<uint64_t> nbytes(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensor& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__")
      fail_ck("cannot save tensor " + std::to_string(i) + " named '" + t.name + "'",
              "tensor names must be non-empty and not __metadata__");
    if (!names.insert(t.name).second) fail_ck("tensor '" + t.name + "' is given twice");
    if (!valid_group(t.group))
      fail_ck("tensor '" + t.name + "' has group '" + t.group + "'", "groups are 1-64 characters of [A-Za-z0-9_-]");
    uint64_t numel = 0;
    if (!shape_numel(t.shape, &numel))
      fail_ck("tensor '" + t.name + "' has an invalid shape " + shape_text(t.shape));
    if (numel > 0 && t.data == nullptr) fail_ck("tensor '" + t.name + "' has no data pointer");
    nbytes[i] = numel * sizeof(float);
    if (!groups.count(t.group)) group_order.push_back(t.group);
    groups[t.group].push_back(i);
  }
  std::string meta_text;
  try {
    meta_text = meta.dump();
  } catch (const json::exception& e) {
    fail_ck("cannot save step " + std::to_string(step) + ": meta is not serializable: " + e.what());
  }

  std::error_code ec;
  if (fs::create_directories(root, ec)) {
    // Make the new root's own name durable (best effort: the parent may not be ours).
    std::error_code aec;
    fs::path abs = fs::absolute(root, aec).lexically_normal();
    if (!abs.has_filename()) abs = abs.parent_path();
    fs::path parent = abs.parent_path();
    int pfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd >= 0) {
      ::fsync(pfd);
      ::close(pfd);
    }
  }
  if (ec || !fs::is_directory(root, ec)) fail_ck(root + ": cannot create the checkpoint root: " + ec.message());
  remove_stale_tmp(root, "", warn);  // free the space of crashed saves first

  const std::string final_name = step_dir_name(step);
  const std::string tmp_name = std::string(kTmpPrefix) + final_name + "-" + std::to_string(::getpid());
  const std::string tmp = join(root, tmp_name);
  const std::string final_dir = join(root, final_name);
  fs::remove_all(tmp, ec);
  if (::mkdir(tmp.c_str(), 0755) != 0) fail_ck(tmp + ": cannot create: " + errno_text());

  try {
    // Tensor data files, with per-tensor checksums computed from memory.
    std::vector<uint32_t> crcs(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) crcs[i] = crc32c(tensors[i].data, size_t(nbytes[i]));
    std::vector<SavedFile> saved;
    std::map<std::string, std::string> file_of_group;
    for (const std::string& g : group_order) {
      std::vector<const CheckpointTensor*> ts;
      std::vector<uint32_t> gc;
      std::vector<uint64_t> gb;
      for (size_t i : groups[g]) {
        ts.push_back(&tensors[i]);
        gc.push_back(crcs[i]);
        gb.push_back(nbytes[i]);
      }
      saved.push_back(write_group(tmp, g, ts, gc, gb));
      file_of_group[g] = saved.back().name;
    }

    // Manifest.
    int64_t unix_s = 0;
    ojson man = ojson::object();
    man["manifest_checksum"] = "00000000";
    man["format"] = kFormatName;
    man["version"] = kCheckpointFormatVersion;
    man["step"] = step;
    man["created"] = utc_now_iso(&unix_s);
    man["created_unix"] = unix_s;
    man["world_size"] = 1;
    man["checksum_algorithm"] = "crc32c";
    man["meta"] = ojson::parse(meta_text);
    ojson files = ojson::array();
    for (const SavedFile& f : saved)
      files.push_back({{"name", f.name}, {"rank", 0}, {"bytes", f.bytes}, {"checksum", checksum_hex(f.crc)}});
    man["files"] = std::move(files);
    ojson tjs = ojson::array();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const CheckpointTensor& t = tensors[i];
      ojson piece = {{"rank", 0},
                     {"file", file_of_group[t.group]},
                     {"key", t.name},
                     {"offset", 0},
                     {"length", nbytes[i] / sizeof(float)},
                     {"checksum", checksum_hex(crcs[i])}};
      tjs.push_back({{"name", t.name},
                     {"shape", t.shape},
                     {"dtype", "F32"},
                     {"group", t.group},
                     {"pieces", ojson::array({piece})}});
    }
    man["tensors"] = std::move(tjs);
    std::string text = format_manifest(man);
    const size_t head = std::strlen(kManifestHead);
    ZAYA_CHECK(text.compare(0, head, kManifestHead) == 0 && text.compare(head, 9, "00000000\"") == 0,
               "manifest layout");
    text.replace(head, 8, checksum_hex(crc32c(text.data(), text.size())));
    write_file_durable(join(tmp, kManifestName), text);
    fsync_dir(tmp);

    // Commit.
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      if (errno != ENOTEMPTY && errno != EEXIST) fail_ck("cannot rename " + tmp + " to " + final_dir + ": " + errno_text());
      // Same step saved before: swap the two directories atomically, then drop the old one.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
        // No RENAME_EXCHANGE on this file system: move the old one aside first. In between no
        // step-<step> exists, so a crash there makes loaders use the previous checkpoint.
        const std::string aside = join(root, std::string(kTmpPrefix) + "replaced-" + final_name + "-" +
                                                 std::to_string(::getpid()));
        fs::remove_all(aside, ec);
        if (::rename(final_dir.c_str(), aside.c_str()) != 0)
          fail_ck("cannot move the existing " + final_dir + " aside: " + errno_text());
        if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
          fail_ck("cannot rename " + tmp + " to " + final_dir + ": " + errno_text());
      }
    }
    fsync_dir(root);
  } catch (...) {
    std::error_code rec;
    fs::remove_all(tmp, rec);
    throw;
  }

  // Retention.
  const auto all = list_checkpoints(root);
  std::vector<std::string> newer;
  for (const auto& c : all)
    if (c.step > step) newer.push_back(fs::path(c.dir).filename().string());
  if (!newer.empty())
    warn("saved " + final_dir + ", but " + root + " holds checkpoints of later steps (" + newer.front() +
         (newer.size() > 1 ? ", ..." : "") + "); load_latest_checkpoint will try those first");
  if (keep_last > 0) {
    // `all` is highest step first: keep the first keep_last, and always the one just written.
    for (size_t i = size_t(keep_last); i < all.size(); ++i)
      if (all[i].step != step) remove_dir_safely(root, fs::path(all[i].dir).filename().string(), warn);
  }
  remove_stale_tmp(root, "", warn);  // includes an old directory swapped out above
  return final_dir;
}

LoadedCheckpoint load_checkpoint(const std::string& dir, const CheckpointLoadOptions& opts) {
  Problems pr;
  json m = read_manifest(dir, pr);
  std::shared_ptr<CheckpointData> data;
  if (!m.is_null()) data = open_checked(dir, m, opts.verify_checksums, pr);
  if (!data) fail_ck(summarize(pr), "the checkpoint is damaged; load an older one");
  LoadedCheckpoint out;
  out.dir = dir;
  out.step = m["step"].get<int64_t>();
  out.meta = m["meta"];
  out.manifest = std::move(m);
  out.data = std::move(data);
  return out;
}

std::optional<LoadedCheckpoint> load_latest_checkpoint(const std::string& root, const CheckpointLoadOptions& opts) {
  const CheckpointWarn warn = warner(opts.warn);
  for (const auto& c : list_checkpoints(root)) {
    try {
      return load_checkpoint(c.dir, opts);
    } catch (const Error& e) {
      warn("skipping damaged checkpoint " + c.dir + ": " + e.message() + "; falling back to an older checkpoint");
    }
  }
  return std::nullopt;
}

CheckpointReport verify_checkpoint(const std::string& dir) {
  CheckpointReport r;
  r.dir = dir;
  Problems pr;
  json m = read_manifest(dir, pr);
  if (!m.is_null()) {
    r.manifest = m;
    open_checked(dir, m, /*verify=*/true, pr);
  }
  r.problems = std::move(pr.list);
  return r;
}

// ---------------------------------------------------------------------------------------------
// LoadedCheckpoint

std::vector<std::string> LoadedCheckpoint::names() const {
  std::vector<std::string> out;
  if (!data) return out;
  for (const auto& t : data->tensors) out.push_back(t.name);
  return out;
}

bool LoadedCheckpoint::contains(const std::string& name) const { return data && data->index.count(name) != 0; }

const std::vector<int64_t>& LoadedCheckpoint::shape(const std::string& name) const {
  if (!contains(name)) fail_ck(dir + ": no tensor named '" + name + "'");
  return data->tensors[data->index.at(name)].shape;
}

void LoadedCheckpoint::read(const std::string& name, const std::vector<int64_t>& shape, float* dst) const {
  if (!contains(name))
    fail_ck(dir + ": no tensor named '" + name + "'", "the checkpoint does not match this model or optimizer");
  const TensorRecord& rec = data->tensors[data->index.at(name)];
  if (rec.shape != shape)
    fail_ck(dir + ": tensor '" + name + "' has shape " + shape_text(rec.shape) + ", expected " + shape_text(shape),
            "the checkpoint does not match this model config");
  if (rec.numel > 0 && dst == nullptr) fail_ck("tensor '" + name + "': no destination buffer");
  for (const Piece& pc : rec.pieces) {
    const uint8_t* src = pc.mapped->bytes(*pc.info);
    const size_t n = size_t(pc.length) * sizeof(float);
    if (!data->verified) {
      uint32_t c = crc32c(src, n);
      if (c != pc.crc)
        fail_ck(pc.mapped->path + ": checksum mismatch for tensor '" + name + "' (manifest " + checksum_hex(pc.crc) +
                    ", data " + checksum_hex(c) + ")",
                "the checkpoint is damaged; load an older one");
    }
    if (n > 0) std::memcpy(dst + pc.offset, src, n);
  }
}

void LoadedCheckpoint::read_all(const std::vector<CheckpointTensorOut>& outs) const {
  std::vector<std::string> missing, misshaped;
  for (const auto& o : outs) {
    if (!contains(o.name)) missing.push_back(o.name);
    else if (shape(o.name) != o.shape)
      misshaped.push_back(o.name + " " + shape_text(shape(o.name)) + " (expected " + shape_text(o.shape) + ")");
  }
  if (!missing.empty() || !misshaped.empty()) {
    std::string msg = dir + ": does not match the requested tensors:";
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      msg += std::string(" ") + what + " " + std::to_string(v.size()) + ":";
      for (size_t i = 0; i < v.size() && i < 8; ++i) msg += (i ? ", " : " ") + v[i];
      if (v.size() > 8) msg += ", ...";
      msg += ";";
    };
    list("missing", missing);
    list("mis-shaped", misshaped);
    msg.pop_back();
    fail_ck(msg, "the checkpoint was written for a different model config or optimizer");
  }
  for (const auto& o : outs) read(o.name, o.shape, o.data);
}

}  // namespace zaya
