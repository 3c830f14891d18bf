// Checkpoint save (temp directory + fsync + rename commit, pruning) and load (manifest and
// checksum validation, fallback to older checkpoints). Format: docs/checkpoint-format.md.
#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "ckpt/checksum.h"
#include "ckpt/file_io.h"
#include "ckpt/manifest_common.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace zaya {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

using ckpt_io::errno_text;
using ckpt_io::fail_ckpt;
using ckpt_io::join;
using ckpt_io::pread_some;
using manifest_common::get_uint;
using manifest_common::kFormatName;
using manifest_common::kManifestName;
using manifest_common::shape_numel;
using manifest_common::shape_text;

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
    fail_ckpt("cannot write " + path + ": " + e.message());
  }

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_ckpt(path + ": cannot reopen after writing: " + errno_text());
  struct stat st {};
  uint8_t len8[8];
  bool ok = ::fstat(fd, &st) == 0 && pread_some(fd, len8, 8, 0) == 8;
  uint64_t hlen = 0;
  for (int i = 7; ok && i >= 0; --i) hlen = (hlen << 8) | len8[i];
  std::string header;
  if (ok && hlen < (uint64_t(1) << 32)) {
    header.resize(static_cast<size_t>(hlen));
    ok = pread_some(fd, header.data(), header.size(), 8) == header.size();
  } else {
    ok = false;
  }
  ::close(fd);
  if (!ok) fail_ckpt(path + ": cannot read back the safetensors header just written");

  // The data must follow the header in our order, contiguously: check the offsets.
  uint64_t data_bytes = 0;
  try {
    json h = json::parse(header);
    for (size_t i = 0; i < ts.size(); ++i) {
      const json& off = h.at(ts[i]->name).at("data_offsets");
      if (off.at(0).get<uint64_t>() != data_bytes || off.at(1).get<uint64_t>() != data_bytes + nbytes[i])
        fail_ckpt(path + ": tensor '" + ts[i]->name + "' was not written at the expected offset");
      data_bytes += nbytes[i];
    }
  } catch (const json::exception& e) {
    fail_ckpt(path + ": cannot parse the safetensors header just written: " + e.what());
  }
  out.bytes = 8 + hlen + data_bytes;
  if (uint64_t(st.st_size) != out.bytes)
    fail_ckpt(path + ": is " + std::to_string(st.st_size) + " bytes after writing, expected " +
              std::to_string(out.bytes));
  uint32_t crc = crc32c(len8, 8);
  crc = crc32c(crc, header.data(), header.size());
  for (size_t i = 0; i < ts.size(); ++i) crc = crc32c_combine(crc, crcs[i], nbytes[i]);
  out.crc = crc;
  return out;
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

bool get_checksum(const json& v, uint32_t* out) {
  return v.is_string() && parse_checksum_hex(v.get_ref<const std::string&>(), out);
}

// Reads and validates manifest.json; null on failure (with the problem recorded).
json read_manifest(const std::string& dir, Problems& pr) {
  const std::string path = join(dir, kManifestName);
  std::string text, err;
  if (!ckpt_io::read_small_file(path, &text, &err)) {
    pr.add(path + ": " + err + " (not a complete checkpoint)");
    return nullptr;
  }
  err = manifest_common::check_manifest_checksum(text);
  if (!err.empty()) {
    pr.add(path + ": " + err);
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
  err = manifest_common::check_step_matches_dir(dir, step);
  if (!err.empty()) {
    pr.add(path + ": " + err);
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
        !manifest_common::plain_file_name(f["name"].get<std::string>()) || !f.contains("bytes") ||
        !get_uint(f["bytes"], &e.bytes) || !f.contains("checksum") || !get_checksum(f["checksum"], &e.crc)) {
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
      // A whole tensor keeps its shape; a piece of one is flat (lengths are <= numel <= 2^62).
      const std::vector<int64_t> expected = whole ? rec.shape : std::vector<int64_t>{int64_t(pc.length)};
      if (info->numel() != pc.length || info->shape != expected) {
        pr.add(path + ": tensor '" + pc.key + "' has shape " + shape_text(info->shape) + ", the manifest says " +
               shape_text(expected));
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
    if (ckpt_io::parse_step_dir_name(it->path().filename().string(), &step) && it->is_directory(dec))
      out.push_back({step, it->path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointDirEntry& a, const CheckpointDirEntry& b) { return a.step > b.step; });
  return out;
}

std::string save_checkpoint(const std::string& root, int64_t step, const std::vector<CheckpointTensor>& tensors,
                            const nlohmann::json& meta, int keep_last, const CheckpointSaveOptions& opts) {
  const CheckpointWarn warn = ckpt_io::warner(opts.warn);
  if (step < 0) fail_ckpt("cannot save step " + std::to_string(step) + ": steps must be non-negative");
  if (root.empty()) fail_ckpt("cannot save: the checkpoint root directory is empty");

  // Validate and group the tensors (groups keep their first-appearance order).
  std::vector<std::string> group_order;
  std::map<std::string, std::vector<size_t>> groups;
  std::set<std::string> names;
  std::vector<uint64_t> nbytes(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensor& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__")
      fail_ckpt("cannot save tensor " + std::to_string(i) + " named '" + t.name + "'",
                "tensor names must be non-empty and not __metadata__");
    if (!names.insert(t.name).second) fail_ckpt("tensor '" + t.name + "' is given twice");
    if (!manifest_common::valid_group(t.group))
      fail_ckpt("tensor '" + t.name + "' has group '" + t.group + "'", "groups are 1-64 characters of [A-Za-z0-9_-]");
    uint64_t numel = 0;
    if (!shape_numel(t.shape, &numel))
      fail_ckpt("tensor '" + t.name + "' has an invalid shape " + shape_text(t.shape));
    if (numel > 0 && t.data == nullptr) fail_ckpt("tensor '" + t.name + "' has no data pointer");
    nbytes[i] = numel * sizeof(float);
    if (!groups.count(t.group)) group_order.push_back(t.group);
    groups[t.group].push_back(i);
  }
  std::string meta_text;
  try {
    meta_text = meta.dump();
  } catch (const json::exception& e) {
    fail_ckpt("cannot save step " + std::to_string(step) + ": meta is not serializable: " + e.what());
  }

  ckpt_io::create_root(root);
  ckpt_io::remove_tmp_entries(root, "", warn);  // free the space of crashed saves first

  const std::string final_name = ckpt_io::step_dir_name(step);
  const std::string tmp_name = std::string(ckpt_io::kTmpPrefix) + final_name + "-" + std::to_string(::getpid());
  const std::string tmp = join(root, tmp_name);
  const std::string final_dir = join(root, final_name);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (::mkdir(tmp.c_str(), 0755) != 0) fail_ckpt(tmp + ": cannot create: " + errno_text());

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
    man["created"] = manifest_common::utc_now_iso(&unix_s);
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
    ckpt_io::write_file_durable(join(tmp, kManifestName), manifest_common::format_manifest_text(man));
    ckpt_io::fsync_dir(tmp);
    // Commit (a checkpoint of the same step saved before is swapped out, then removed below).
    ckpt_io::commit_rename(root, tmp, final_dir);
  } catch (...) {
    std::error_code rec;
    fs::remove_all(tmp, rec);
    throw;
  }

  ckpt_io::prune(root, step, keep_last, warn);
  ckpt_io::remove_tmp_entries(root, "", warn);  // includes an old directory swapped out above
  return final_dir;
}

LoadedCheckpoint load_checkpoint(const std::string& dir, const CheckpointLoadOptions& opts) {
  Problems pr;
  json m = read_manifest(dir, pr);
  std::shared_ptr<CheckpointData> data;
  if (!m.is_null()) data = open_checked(dir, m, opts.verify_checksums, pr);
  if (!data) fail_ckpt(summarize(pr), "the checkpoint is damaged; load an older one");
  LoadedCheckpoint out;
  out.dir = dir;
  out.step = m["step"].get<int64_t>();
  out.meta = m["meta"];
  out.manifest = std::move(m);
  out.data = std::move(data);
  return out;
}

std::optional<LoadedCheckpoint> load_latest_checkpoint(const std::string& root, const CheckpointLoadOptions& opts) {
  const CheckpointWarn warn = ckpt_io::warner(opts.warn);
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
  if (!contains(name)) fail_ckpt(dir + ": no tensor named '" + name + "'");
  return data->tensors[data->index.at(name)].shape;
}

void LoadedCheckpoint::read(const std::string& name, const std::vector<int64_t>& shape, float* dst) const {
  if (!contains(name))
    fail_ckpt(dir + ": no tensor named '" + name + "'", "the checkpoint does not match this model or optimizer");
  const TensorRecord& rec = data->tensors[data->index.at(name)];
  if (rec.shape != shape)
    fail_ckpt(dir + ": tensor '" + name + "' has shape " + shape_text(rec.shape) + ", expected " +
                  shape_text(shape),
              "the checkpoint does not match this model config");
  if (rec.numel > 0 && dst == nullptr) fail_ckpt("tensor '" + name + "': no destination buffer");
  for (const Piece& pc : rec.pieces) {
    const uint8_t* src = pc.mapped->bytes(*pc.info);
    const size_t n = size_t(pc.length) * sizeof(float);
    if (!data->verified) {
      uint32_t c = crc32c(src, n);
      if (c != pc.crc)
        fail_ckpt(pc.mapped->path + ": checksum mismatch for tensor '" + name + "' (manifest " +
                      checksum_hex(pc.crc) + ", data " + checksum_hex(c) + ")",
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
    fail_ckpt(msg, "the checkpoint was written for a different model config or optimizer");
  }
  for (const auto& o : outs) read(o.name, o.shape, o.data);
}

}  // namespace zaya
