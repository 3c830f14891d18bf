// safetensors reader (mmap + fully validated header) and atomic writer.
//
// File layout: u64 little-endian header length N, N bytes of JSON header, then the data
// section. The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section) plus an optional "__metadata__" string map.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace zaya {

using nlohmann::json;

namespace {

constexpr const char* kSafetensorsComponent = "safetensors";
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // 100 MB, as in the reference reader
constexpr size_t kMaxJsonDepth = 64;
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

[[noreturn]] void fail_in(const std::string& source, const std::string& message, const std::string& hint = {}) {
  fail(kSafetensorsComponent, source + ": " + message, hint);
}

[[noreturn]] void fail_tensor(const std::string& source, const std::string& tensor, const std::string& message,
                              const std::string& hint = {}) {
  fail(kSafetensorsComponent, source + ": tensor '" + tensor + "': " + message, hint);
}

// A short, always-printable description of a JSON value for error messages. Never recurses
// into deep structures (a hostile header may nest arbitrarily deep).
std::string describe_json(const json& v) {
  auto clip = [](std::string s) {
    if (s.size() <= 80) return s;
    size_t cut = 77;
    while (cut > 0 && (uint8_t(s[cut]) & 0xc0) == 0x80) --cut;  // do not split a UTF-8 sequence
    return s.substr(0, cut) + "...";
  };
  auto dump = [](const json& x) { return x.dump(-1, ' ', false, json::error_handler_t::replace); };
  if (v.is_primitive()) return clip(dump(v));
  if (v.is_array()) {
    bool flat = v.size() <= 16;
    if (flat)
      for (const auto& e : v) flat = flat && e.is_primitive();
    if (flat) return clip(dump(v));
    return "an array of " + std::to_string(v.size()) + " elements";
  }
  if (v.is_object()) return "an object with " + std::to_string(v.size()) + " keys";
  return "a binary value";
}

std::string errno_message() { return std::strerror(errno); }

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Parses JSON text, rejecting duplicate object keys (nlohmann silently keeps the last one).
// `what` describes the document in errors ("header", "index"); top-level duplicates are
// reported with `top_key_kind` ("tensor name", "key").
json parse_json_no_duplicates(const char* begin, const char* end, const std::string& source, const char* what,
                              const char* top_key_kind) {
  // One entry per open container; arrays carry no key set. The document's top level is seen[0].
  struct Open {
    bool object;
    std::set<std::string> keys;
  };
  std::vector<Open> seen;
  std::string top_key;  // current key of the top-level object
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // Valid documents nest 3 levels deep; a hostile one must not cost memory per level.
        if (seen.size() >= kMaxJsonDepth)
          fail_in(source, std::string(what) + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        seen.push_back({event == json::parse_event_t::object_start, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!seen.empty()) seen.pop_back();
        break;
      case json::parse_event_t::key: {
        if (seen.empty() || !seen.back().object || !parsed.is_string()) break;
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!seen.back().keys.insert(k).second) {
          const bool top = seen.size() == 1 && seen[0].object;
          if (top)
            fail_in(source, std::string(what) + " has duplicate " + top_key_kind + " '" + k + "'",
                    "each name may appear only once");
          if (seen.size() == 2 && seen[0].object)
            fail_in(source, std::string(what) + " entry '" + top_key + "' has duplicate field '" + k + "'");
          fail_in(source, std::string(what) + " has duplicate key '" + k + "'");
        }
        if (seen.size() == 1) top_key = k;
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail_in(source, std::string(what) + " is not valid JSON: " + e.what());
  }
}

// Reads a JSON integer that must be non-negative (and fit in int64 / uint64).
bool as_non_negative(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = uint64_t(s);
    return true;
  }
  return false;
}

std::string known_dtypes() { return "F32, BF16, F16, I32, I64 or U8"; }

// One header entry -> SafeTensorInfo. `data_size` is the size of the data section.
SafeTensorInfo parse_entry(const std::string& source, const std::string& name, const json& e, uint64_t data_size) {
  if (!e.is_object())
    fail_tensor(source, name,
                "expected an object with 'dtype', 'shape' and 'data_offsets', found " + describe_json(e));
  SafeTensorInfo t;
  t.name = name;
  for (auto it = e.begin(); it != e.end(); ++it) {
    const std::string& k = it.key();
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      fail_tensor(source, name, "unknown field '" + k + "'", "expected only 'dtype', 'shape' and 'data_offsets'");
  }
  // dtype
  auto dt = e.find("dtype");
  if (dt == e.end()) fail_tensor(source, name, "missing field 'dtype'");
  if (!dt->is_string())
    fail_tensor(source, name,
                "field 'dtype' must be a string (" + known_dtypes() + "), found " + describe_json(*dt));
  if (!parse_dtype(dt->get_ref<const std::string&>(), &t.dtype))
    fail_tensor(source, name,
                "field 'dtype' has unknown dtype " + describe_json(*dt) + ", expected " + known_dtypes(),
                "zaya reads F32, BF16, F16, I32, I64 and U8 tensors; convert the checkpoint first");
  // shape
  auto sh = e.find("shape");
  if (sh == e.end()) fail_tensor(source, name, "missing field 'shape'");
  if (!sh->is_array())
    fail_tensor(source, name,
                "field 'shape' must be an array of non-negative integers, found " + describe_json(*sh));
  uint64_t numel = 1;
  t.shape.reserve(sh->size());
  for (size_t i = 0; i < sh->size(); ++i) {
    const json& d = (*sh)[i];
    uint64_t v = 0;
    if (!as_non_negative(d, &v) || v > uint64_t(INT64_MAX))
      fail_tensor(source, name,
                  "field 'shape' dimension " + std::to_string(i) + " must be a non-negative integer, found " +
                      describe_json(d) + " in " + describe_json(*sh));
    if (__builtin_mul_overflow(numel, v, &numel))
      fail_tensor(source, name,
                  "field 'shape' " + describe_json(*sh) + " has more elements than fit in 64 bits");
    t.shape.push_back(int64_t(v));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &nbytes))
    fail_tensor(source, name,
                "field 'shape' " + describe_json(*sh) + " needs more bytes than fit in 64 bits");
  // data_offsets
  auto off = e.find("data_offsets");
  if (off == e.end()) fail_tensor(source, name, "missing field 'data_offsets'");
  uint64_t b = 0, en = 0;
  if (!off->is_array() || off->size() != 2 || !as_non_negative((*off)[0], &b) || !as_non_negative((*off)[1], &en))
    fail_tensor(
        source, name,
        "field 'data_offsets' must be [begin, end] with non-negative integers, found " + describe_json(*off));
  if (b > en)
    fail_tensor(source, name,
                "field 'data_offsets' " + describe_json(*off) + " has begin " + std::to_string(b) +
                    " > end " + std::to_string(en));
  if (en > data_size)
    fail_tensor(source, name,
                "field 'data_offsets' " + describe_json(*off) + " ends at " + std::to_string(en) +
                    ", past the end of the data section (" + std::to_string(data_size) + " bytes)",
                "the file is truncated or the header is corrupt");
  if (en - b != nbytes)
    fail_tensor(source, name,
                "field 'data_offsets' " + describe_json(*off) + " spans " + std::to_string(en - b) +
                    " bytes, but dtype " + dtype_name(t.dtype) + " with shape " + describe_json(*sh) +
                    " needs " + std::to_string(nbytes) + " bytes");
  t.begin = b;
  t.end = en;
  return t;
}

}  // namespace

uint64_t SafeTensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

void parse_safetensors(const uint8_t* bytes, size_t size, const std::string& source,
                       std::vector<SafeTensorInfo>* tensors_out, std::map<std::string, std::string>* metadata_out,
                       uint64_t* data_offset_out) {
  if (size < 8)
    fail_in(source,
            "file is " + std::to_string(size) + " bytes, expected at least 8 (the u64 header length)",
            "the file is empty or truncated");
  uint64_t n = read_u64_le(bytes);
  if (n > kMaxHeaderBytes)
    fail_in(source,
            "header length is " + std::to_string(n) + " bytes, expected at most " + std::to_string(kMaxHeaderBytes),
            "this is not a safetensors file or its first 8 bytes are corrupt");
  if (n > uint64_t(size) - 8)
    fail_in(source,
            "header length is " + std::to_string(n) + " bytes, but the file has only " + std::to_string(size - 8) +
                " bytes after the 8-byte length",
            "the file is truncated");
  const char* hb = reinterpret_cast<const char*>(bytes + 8);
  json header = parse_json_no_duplicates(hb, hb + n, source, "header", "tensor name");
  if (!header.is_object()) fail_in(source, "header must be a JSON object, found " + describe_json(header));

  const uint64_t data_offset = 8 + n;
  const uint64_t data_size = uint64_t(size) - data_offset;
  std::vector<SafeTensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  tensors.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object())
        fail_in(source, "field '__metadata__' must be an object of strings, found " + describe_json(*it));
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          fail_in(source,
                  "field '__metadata__." + m.key() + "' must be a string, found " + describe_json(*m));
        metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    tensors.push_back(parse_entry(source, name, *it, data_size));
  }

  // No two tensors may share a byte. Empty tensors occupy no bytes and never overlap.
  std::vector<const SafeTensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const auto& t : tensors)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafeTensorInfo* a, const SafeTensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafeTensorInfo* prev = by_offset[i - 1];
    const SafeTensorInfo* cur = by_offset[i];
    if (cur->begin < prev->end)
      fail_tensor(source, cur->name,
                  "field 'data_offsets' [" + std::to_string(cur->begin) + ", " + std::to_string(cur->end) +
                      "] overlaps tensor '" + prev->name + "' at [" + std::to_string(prev->begin) + ", " +
                      std::to_string(prev->end) + "]",
                  "tensors must occupy disjoint byte ranges");
  }

  std::sort(tensors.begin(), tensors.end(),
            [](const SafeTensorInfo& a, const SafeTensorInfo& b) { return a.name < b.name; });
  if (tensors_out) *tensors_out = std::move(tensors);
  if (metadata_out) *metadata_out = std::move(metadata);
  if (data_offset_out) *data_offset_out = data_offset;
}

// ---------------------------------------------------------------------------------------------
// SafeTensorsFile

std::unique_ptr<SafeTensorsFile> SafeTensorsFile::open(const std::string& path) {
  std::unique_ptr<SafeTensorsFile> f(new SafeTensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_in(path, "cannot open: " + errno_message());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string err = errno_message();
    ::close(fd);
    fail_in(path, "cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_in(path, "is not a regular file", "pass a .safetensors file");
  }
  f->size_ = size_t(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string err = errno_message();
      ::close(fd);
      fail_in(path, "cannot mmap " + std::to_string(f->size_) + " bytes: " + err);
    }
    f->base_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  // On failure the unique_ptr unmaps.
  parse_safetensors(f->base_, f->size_, path, &f->tensors_, &f->metadata_, &f->data_offset_);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

SafeTensorsFile::~SafeTensorsFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const SafeTensorInfo* SafeTensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
// SafeTensorsSet

namespace {

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

std::string index_dir_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_in(path, "cannot open: " + errno_message());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail_in(path, "read error");
  return ss.str();
}

bool plain_shard_name(const std::string& s) {
  if (s.empty() || s == "." || s.find("..") != std::string::npos) return false;
  for (char c : s)
    if (c == '/' || c == '\\' || c == '\0') return false;
  return true;
}

}  // namespace

SafeTensorsSet SafeTensorsSet::open_dir(const std::string& dir) {
  const std::string index_path = index_dir_path(dir, kIndexName);
  const std::string single_path = index_dir_path(dir, kSingleName);
  if (!path_exists(index_path)) {
    if (path_exists(single_path)) return open_file(single_path);
    std::string where = path_exists(dir) ? "exists in this directory" : "exists (the directory itself is missing)";
    fail(kSafetensorsComponent,
         dir + ": no model weights: neither " + kIndexName + " nor " + kSingleName + " " + where,
         "pass a Hugging Face model directory");
  }

  const std::string text = read_text_file(index_path);
  json index = parse_json_no_duplicates(text.data(), text.data() + text.size(), index_path, "index", "key");
  if (!index.is_object()) fail_in(index_path, "expected a JSON object, found " + describe_json(index));
  auto wm = index.find("weight_map");
  if (wm == index.end())
    fail_in(index_path, "missing field 'weight_map'", "it should map every tensor name to its shard file");
  if (!wm->is_object())
    fail_in(index_path,
            "field 'weight_map' must be an object of tensor name -> shard file, found " + describe_json(*wm));
  if (wm->empty()) fail_in(index_path, "field 'weight_map' lists no tensors");

  SafeTensorsSet set;
  std::map<std::string, SafeTensorsFile*> shards;  // shard file name -> opened file
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const std::string& tensor = it.key();
    if (!it->is_string())
      fail_in(index_path,
              "field 'weight_map." + tensor + "' must be a shard file name, found " + describe_json(*it));
    const std::string& shard = it->get_ref<const std::string&>();
    if (!plain_shard_name(shard))
      fail_in(index_path,
              "field 'weight_map." + tensor + "' names shard '" + shard +
                  "', expected a plain file name without '/' or '..'",
              "shards must lie in the model directory");
    SafeTensorsFile*& file = shards[shard];
    if (file == nullptr) {
      const std::string shard_path = index_dir_path(dir, shard);
      if (!path_exists(shard_path))
        fail_in(index_path, "field 'weight_map." + tensor + "' names shard '" + shard + "', which does not exist (" +
                                shard_path + ")",
                "the download is incomplete");
      set.files_.push_back(SafeTensorsFile::open(shard_path));
      file = set.files_.back().get();
    }
    const SafeTensorInfo* info = file->find(tensor);
    if (info == nullptr)
      fail_in(index_path, "field 'weight_map." + tensor + "' maps tensor '" + tensor + "' to shard '" + shard +
                              "', but " + file->path() + " has no such tensor");
    set.entries_[tensor] = Entry{file, info};
  }
  for (const auto& [shard, file] : shards) {
    for (const auto& t : file->tensors()) {
      auto e = set.entries_.find(t.name);
      if (e == set.entries_.end() || e->second.file != file)
        fail_in(index_path, "shard '" + shard + "' contains tensor '" + t.name +
                                "', which field 'weight_map' does not map to that shard",
                "the index and the shards disagree; re-download the model");
    }
  }
  return set;
}

SafeTensorsSet SafeTensorsSet::open_file(const std::string& path) {
  SafeTensorsSet set;
  set.files_.push_back(SafeTensorsFile::open(path));
  const SafeTensorsFile* file = set.files_.back().get();
  for (const auto& t : file->tensors()) set.entries_[t.name] = Entry{file, &t};
  return set;
}

const SafeTensorsSet::Entry* SafeTensorsSet::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafeTensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

void SafeTensorsSet::read_f32(const std::string& name, float* dst) const {
  const Entry* e = find(name);
  if (e == nullptr) {
    std::string where = files_.size() == 1 ? files_[0]->path() : std::to_string(files_.size()) + " shards";
    fail(kSafetensorsComponent, "no tensor named '" + name + "' in " + where,
         "the checkpoint does not match the model config");
  }
  const SafeTensorInfo& t = *e->info;
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
    fail_tensor(e->file->path(), name,
                std::string("dtype is ") + dtype_name(t.dtype) + ", expected F32, BF16 or F16 to read as floats");
  convert_to_f32(e->file->data(t), t.dtype, size_t(t.numel()), dst);
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

void write_all(int fd, const void* data, size_t n, const std::string& tmp, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_in(path, "write to " + tmp + " failed: " + errno_message());
    }
    if (w == 0) fail_in(path, "short write to " + tmp);
    p += w;
    n -= size_t(w);
  }
}

// Closes and removes the temporary file unless released.
struct TmpGuard {
  int fd = -1;
  std::string tmp;
  bool keep = false;
  ~TmpGuard() {
    if (fd >= 0) ::close(fd);
    if (!keep) ::unlink(tmp.c_str());
  }
};

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::vector<uint64_t> sizes;
  sizes.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      fail_in(path, "cannot write a tensor named '" + t.name + "'", "tensor names must be non-empty and not __metadata__");
    if (header.contains(t.name)) fail_in(path, "tensor '" + t.name + "' is given twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) fail_in(path, "tensor '" + t.name + "' has negative dimension " + std::to_string(d));
      if (__builtin_mul_overflow(numel, uint64_t(d), &numel))
        fail_in(path, "tensor '" + t.name + "' has more elements than fit in 64 bits");
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &nbytes))
      fail_in(path, "tensor '" + t.name + "' needs more bytes than fit in 64 bits");
    if (nbytes > 0 && t.data == nullptr) fail_in(path, "tensor '" + t.name + "' has no data pointer");
    if (offset + nbytes < offset) fail_in(path, "tensors need more bytes than fit in 64 bits");
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    sizes.push_back(nbytes);
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  TmpGuard g;
  g.tmp = path + ".tmp." + std::to_string(::getpid());
  g.fd = ::open(g.tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (g.fd < 0) {
    g.keep = true;  // nothing was created
    fail_in(path, "cannot create " + g.tmp + ": " + errno_message(),
            "check that the directory exists and is writable");
  }
  write_all(g.fd, len, 8, g.tmp, path);
  write_all(g.fd, text.data(), text.size(), g.tmp, path);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (sizes[i] > 0) write_all(g.fd, tensors[i].data, size_t(sizes[i]), g.tmp, path);
  if (::fsync(g.fd) != 0) fail_in(path, "fsync of " + g.tmp + " failed: " + errno_message());
  int fd = g.fd;
  g.fd = -1;
  if (::close(fd) != 0) fail_in(path, "close of " + g.tmp + " failed: " + errno_message());
  if (::rename(g.tmp.c_str(), path.c_str()) != 0)
    fail_in(path, "cannot rename " + g.tmp + " to " + path + ": " + errno_message());
  g.keep = true;
  // Make the rename durable: fsync the directory (best effort).
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace zaya
