// Loading sharded checkpoints: manifest and file validation, memory-mapped rank files, range
// reads assembled from pieces with checksum verification, fallback past damaged checkpoints,
// the collective load that verifies in parallel, and the full verification for `zaya ckpt
// inspect` (see dist_checkpoint.h). Version 1 checkpoints are read through load_checkpoint.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "ckpt/checksum.h"
#include "ckpt/dist_agree.h"
#include "ckpt/dist_checkpoint.h"
#include "ckpt/dist_io.h"
#include "ckpt/dist_manifest.h"
#include "core/error.h"
#include "dist/comm.h"

namespace zaya {

namespace dm = dist_manifest;
using dist_io::fail_ckpt;
using nlohmann::json;

namespace detail {

struct DistMappedFile {
  std::string path;
  const uint8_t* base = nullptr;
  size_t size = 0;
  ~DistMappedFile() {
    if (base != nullptr) ::munmap(const_cast<uint8_t*>(base), size);
  }
};

struct DistCheckpointData {
  std::string dir;
  int version = 2;
  int64_t step = 0;
  int world_size = 1;
  json meta, manifest;
  std::map<std::string, size_t> index;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<uint64_t> numels;
  std::vector<std::string> groups;

  // Version 2.
  std::vector<std::unique_ptr<DistMappedFile>> files;
  std::map<std::string, size_t> file_index;
  std::vector<dm::TensorRecord> tensors;             // pieces sorted by offset
  mutable std::mutex mu;
  mutable std::vector<std::vector<uint8_t>> verified;  // [tensor][piece]
  // Test hook (ZAYA_CKPT_TEST_DISK_DELAY_MS): the first read() after a collective load on the
  // last rank sleeps, as on slow storage.
  mutable std::atomic<bool> slow_first_read{false};

  // Version 1.
  std::optional<LoadedCheckpoint> v1;

  const uint8_t* piece_bytes(const dm::PieceRecord& p) const {
    return files[file_index.at(p.file)]->base + p.file_offset;
  }
  // "" or the mismatch, naming the file and the tensor.
  std::string check_piece(size_t t, size_t k) const {
    const dm::PieceRecord& p = tensors[t].pieces[k];
    const uint32_t c = crc32c(piece_bytes(p), size_t(p.length * 4));
    if (c == p.crc) return "";
    return files[file_index.at(p.file)]->path + ": checksum mismatch for tensor '" + tensors[t].name +
           "' elements [" + std::to_string(p.offset) + ", " + std::to_string(p.offset + p.length) + ") (manifest " +
           checksum_hex(p.crc) + ", data " + checksum_hex(c) + ")";
  }
  void ensure_verified(size_t t, size_t k) const {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (verified[t][k]) return;
    }
    std::string err = check_piece(t, k);
    if (!err.empty()) fail_ckpt(err, "the checkpoint is damaged; load an older one");
    std::lock_guard<std::mutex> lk(mu);
    verified[t][k] = 1;
  }
  void mark_all_verified() {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& v : verified) std::fill(v.begin(), v.end(), uint8_t(1));
  }
};

}  // namespace detail

namespace {

using detail::DistCheckpointData;
using detail::DistMappedFile;

// Opens a version-2 checkpoint: manifest, file sizes, mappings. Null with problems recorded.
std::shared_ptr<DistCheckpointData> open_v2(const std::string& dir, std::vector<std::string>* problems) {
  dm::Manifest man;
  json raw;
  if (!dm::read_manifest(dir, &man, &raw, problems)) return nullptr;
  auto d = std::make_shared<DistCheckpointData>();
  d->dir = dir;
  d->version = 2;
  d->step = man.step;
  d->world_size = man.world_size;
  d->meta = man.meta;
  d->manifest = raw;
  bool ok = true;
  for (const dm::FileRecord& f : man.files) {
    auto mf = std::make_unique<DistMappedFile>();
    mf->path = dist_io::join(dir, f.name);
    int fd = ::open(mf->path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      problems->push_back(mf->path + ": " + (errno == ENOENT ? std::string("missing") : "cannot open: " + dist_io::errno_text()));
      ok = false;
      continue;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      problems->push_back(mf->path + ": cannot stat: " + dist_io::errno_text());
      ::close(fd);
      ok = false;
      continue;
    }
    if (uint64_t(st.st_size) != f.bytes) {
      problems->push_back(mf->path + ": is " + std::to_string(st.st_size) + " bytes, the manifest says " +
                          std::to_string(f.bytes) + (uint64_t(st.st_size) < f.bytes ? " (truncated)" : " (appended to)"));
      ::close(fd);
      ok = false;
      continue;
    }
    if (f.bytes > 0) {
      void* p = ::mmap(nullptr, size_t(f.bytes), PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        problems->push_back(mf->path + ": cannot map: " + dist_io::errno_text());
        ::close(fd);
        ok = false;
        continue;
      }
      mf->base = static_cast<const uint8_t*>(p);
      mf->size = size_t(f.bytes);
    }
    ::close(fd);
    d->file_index[f.name] = d->files.size();
    d->files.push_back(std::move(mf));
  }
  if (!ok) return nullptr;
  d->tensors = std::move(man.tensors);
  for (size_t i = 0; i < d->tensors.size(); ++i) {
    const dm::TensorRecord& t = d->tensors[i];
    d->index[t.name] = i;
    d->names.push_back(t.name);
    d->shapes.push_back(t.shape);
    d->numels.push_back(t.numel);
    d->groups.push_back(t.group);
    d->verified.emplace_back(t.pieces.size(), uint8_t(0));
  }
  return d;
}

// A version-1 checkpoint behind the same interface.
std::shared_ptr<DistCheckpointData> open_v1(const std::string& dir, bool verify) {
  CheckpointLoadOptions o;
  o.verify_checksums = verify;
  LoadedCheckpoint ck = load_checkpoint(dir, o);
  auto d = std::make_shared<DistCheckpointData>();
  d->dir = dir;
  d->version = 1;
  d->step = ck.step;
  d->world_size = ck.manifest.value("world_size", 1);
  d->meta = ck.meta;
  d->manifest = ck.manifest;
  for (const json& t : ck.manifest["tensors"]) {
    const std::string name = t.value("name", "");
    if (!ck.contains(name) || d->index.count(name)) continue;
    d->index[name] = d->names.size();
    d->names.push_back(name);
    d->shapes.push_back(ck.shape(name));
    uint64_t n = 0;
    dm::shape_numel(d->shapes.back(), &n);
    d->numels.push_back(n);
    d->groups.push_back(t.value("group", "params"));
  }
  d->v1 = std::move(ck);
  return d;
}

std::shared_ptr<DistCheckpointData> open_any(const std::string& dir, DistVerify verify) {
  if (dm::peek_version(dir) == 1) return open_v1(dir, verify == DistVerify::Full);
  std::vector<std::string> problems;
  auto d = open_v2(dir, &problems);
  if (d && verify == DistVerify::Full) {
    for (size_t t = 0; t < d->tensors.size() && problems.empty(); ++t)
      for (size_t k = 0; k < d->tensors[t].pieces.size(); ++k) {
        std::string err = d->check_piece(t, k);
        if (!err.empty()) {
          problems.push_back(err);
          break;
        }
      }
    if (problems.empty()) d->mark_all_verified();
  }
  if (!problems.empty()) {
    std::string msg = problems.front();
    if (problems.size() > 1) msg += " (and " + std::to_string(problems.size() - 1) + " more problems)";
    fail_ckpt(msg, "the checkpoint is damaged; load an older one");
  }
  return d;
}

DistCheckpoint wrap(std::shared_ptr<DistCheckpointData> d) {
  DistCheckpoint c;
  c.data = std::move(d);
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Opening

DistCheckpoint open_dist_checkpoint(const std::string& dir, const DistLoadOptions& options) {
  return wrap(open_any(dir, options.verify));
}

std::optional<DistCheckpoint> load_latest_dist_checkpoint(const std::string& root, const DistLoadOptions& options) {
  const CheckpointWarn warn = dist_io::warner(options.warn);
  for (const auto& c : list_checkpoints(root)) {
    try {
      return open_dist_checkpoint(c.dir, options);
    } catch (const Error& e) {
      warn("skipping damaged checkpoint " + c.dir + ": " + e.message() + "; falling back to an older checkpoint");
    }
  }
  return std::nullopt;
}

// How often the ranks meet while each reads and checks its share of a checkpoint.
constexpr double kAgreeRoundSeconds = 0.2;

std::optional<DistCheckpoint> load_latest_dist_checkpoint(const std::string& root, Comm& comm,
                                                          const DistLoadOptions& options) {
  const CheckpointWarn warn = dist_io::warner(options.warn);
  // Everyone tries the same directories: rank 0's listing.
  std::string listing;
  if (comm.rank() == 0)
    for (const auto& c : list_checkpoints(root)) listing += c.dir + "\n";
  listing = dist_agree::broadcast_string(comm, listing, 0);
  size_t pos = 0;
  while (pos < listing.size()) {
    const size_t nl = listing.find('\n', pos);
    const std::string dir = listing.substr(pos, nl - pos);
    pos = nl + 1;
    std::shared_ptr<DistCheckpointData> d;
    // Reading and checksumming take each rank its own time; the ranks agree in short rounds
    // meanwhile, so a slow reader never keeps the others in one collective (dist_agree.h).
    const std::string err = dist_agree::agree_after_disk_work(comm, kAgreeRoundSeconds, [&]() -> std::string {
      if (comm.rank() == comm.size() - 1) dist_io::test_disk_delay();  // a slow disk, in tests
      const bool v1 = dm::peek_version(dir) == 1;
      d = open_any(dir, v1 ? options.verify : DistVerify::Lazy);
      std::string bad;
      if (!v1 && options.verify == DistVerify::Full) {
        // This rank's share of the pieces: every size-th one, counted over all tensors.
        size_t counter = 0;
        for (size_t t = 0; t < d->tensors.size() && bad.empty(); ++t)
          for (size_t k = 0; k < d->tensors[t].pieces.size() && bad.empty(); ++k)
            if (counter++ % size_t(comm.size()) == size_t(comm.rank())) bad = d->check_piece(t, k);
      }
      return bad;
    });
    if (err.empty()) {
      if (d->version == 2 && options.verify == DistVerify::Full) d->mark_all_verified();
      d->slow_first_read = comm.rank() == comm.size() - 1 && dist_io::test_disk_delay_ms() > 0;
      return wrap(std::move(d));
    }
    if (comm.rank() == 0)
      warn("skipping damaged checkpoint " + dir + ": " + err + "; falling back to an older checkpoint");
  }
  return std::nullopt;
}

int checkpoint_format_version(const std::string& dir) { return dm::peek_version(dir); }

// ---------------------------------------------------------------------------------------------
// Full verification

CheckpointReport verify_dist_checkpoint(const std::string& dir) {
  CheckpointReport r;
  r.dir = dir;
  auto d = open_v2(dir, &r.problems);
  if (!d) {
    // Still show the manifest when it parsed.
    dm::Manifest man;
    json raw;
    std::vector<std::string> ignored;
    dm::read_manifest(dir, &man, &raw, &ignored);
    r.manifest = raw;
    return r;
  }
  r.manifest = d->manifest;
  // Each piece once; a file's checksum from its pieces when they fill it back to back, else
  // from its bytes.
  struct Loc {
    uint64_t file_offset, bytes;
    uint32_t crc;
  };
  std::vector<std::vector<Loc>> per_file(d->files.size());
  for (size_t t = 0; t < d->tensors.size(); ++t)
    for (size_t k = 0; k < d->tensors[t].pieces.size(); ++k) {
      const dm::PieceRecord& p = d->tensors[t].pieces[k];
      const uint32_t c = crc32c(d->piece_bytes(p), size_t(p.length * 4));
      if (c != p.crc)
        r.problems.push_back(d->files[d->file_index.at(p.file)]->path + ": checksum mismatch for tensor '" +
                             d->tensors[t].name + "' elements [" + std::to_string(p.offset) + ", " +
                             std::to_string(p.offset + p.length) + ") (manifest " + checksum_hex(p.crc) + ", data " +
                             checksum_hex(c) + ")");
      per_file[d->file_index.at(p.file)].push_back({p.file_offset, p.length * 4, c});
    }
  const json& files = d->manifest["files"];
  for (size_t f = 0; f < d->files.size(); ++f) {
    auto& locs = per_file[f];
    std::sort(locs.begin(), locs.end(), [](const Loc& a, const Loc& b) { return a.file_offset < b.file_offset; });
    uint64_t at = 0;
    uint32_t crc = 0;
    bool contiguous = true;
    for (const Loc& l : locs) {
      if (l.bytes == 0) continue;
      if (l.file_offset != at) {
        contiguous = false;
        break;
      }
      crc = crc32c_combine(crc, l.crc, l.bytes);
      at += l.bytes;
    }
    if (!contiguous || at != d->files[f]->size) crc = crc32c(d->files[f]->base, d->files[f]->size);
    uint32_t want = 0;
    for (const json& fj : files)
      if (fj.value("name", "") == std::filesystem::path(d->files[f]->path).filename().string())
        parse_checksum_hex(fj.value("checksum", ""), &want);
    if (crc != want)
      r.problems.push_back(d->files[f]->path + ": file checksum mismatch (manifest " + checksum_hex(want) + ", data " +
                           checksum_hex(crc) + ")");
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// DistCheckpoint

namespace {
size_t index_of(const DistCheckpoint& c, const std::string& name) {
  if (!c.data) fail_ckpt("no checkpoint is open");
  auto it = c.data->index.find(name);
  if (it == c.data->index.end())
    fail_ckpt(c.data->dir + ": no tensor named '" + name + "'", "the checkpoint does not match this model or optimizer");
  return it->second;
}
}  // namespace

const std::string& DistCheckpoint::dir() const { return data->dir; }
int64_t DistCheckpoint::step() const { return data->step; }
int DistCheckpoint::version() const { return data->version; }
int DistCheckpoint::world_size() const { return data->world_size; }
const nlohmann::json& DistCheckpoint::meta() const { return data->meta; }
const nlohmann::json& DistCheckpoint::manifest() const { return data->manifest; }
std::vector<std::string> DistCheckpoint::names() const { return data ? data->names : std::vector<std::string>{}; }
bool DistCheckpoint::contains(const std::string& name) const { return data && data->index.count(name) != 0; }
const std::vector<int64_t>& DistCheckpoint::shape(const std::string& name) const {
  return data->shapes[index_of(*this, name)];
}
uint64_t DistCheckpoint::numel(const std::string& name) const { return data->numels[index_of(*this, name)]; }
const std::string& DistCheckpoint::group(const std::string& name) const { return data->groups[index_of(*this, name)]; }

void read_dist_tensors(const DistCheckpoint& ck, Comm& comm, const std::vector<DistRead>& reads) {
  // A failed read's hint (say, that the checkpoint does not match the model) travels with its
  // message, after a separator, so that every rank raises both.
  constexpr char kHintSeparator = '\x1f';
  std::string err = dist_agree::agree_after_disk_work(comm, kAgreeRoundSeconds, [&]() -> std::string {
    try {
      for (const DistRead& r : reads) {
        if (r.shape)
          ck.read(r.name, *r.shape, r.dst);
        else
          ck.read(r.name, r.offset, r.length, r.dst);
      }
    } catch (const Error& e) {
      return e.hint().empty() ? e.message() : e.message() + kHintSeparator + e.hint();
    }
    return "";
  });
  if (err.empty()) return;
  const size_t cut = err.find(kHintSeparator);
  if (cut == std::string::npos) fail_ckpt(err);
  fail_ckpt(err.substr(0, cut), err.substr(cut + 1));
}

void DistCheckpoint::read(const std::string& name, uint64_t offset, uint64_t length, float* dst) const {
  if (data->slow_first_read.exchange(false)) dist_io::test_disk_delay();  // a slow disk, in tests
  const size_t t = index_of(*this, name);
  const uint64_t numel = data->numels[t];
  if (offset > numel || length > numel - offset)
    fail_ckpt(data->dir + ": tensor '" + name + "' has " + std::to_string(numel) + " elements; cannot read [" +
              std::to_string(offset) + ", " + std::to_string(offset + length) + ")");
  if (length == 0) return;
  if (dst == nullptr) fail_ckpt("tensor '" + name + "': no destination buffer");
  if (data->version == 1) {
    if (offset == 0 && length == numel) return data->v1->read(name, data->shapes[t], dst);
    std::vector<float> whole(static_cast<size_t>(numel));
    data->v1->read(name, data->shapes[t], whole.data());
    std::memcpy(dst, whole.data() + offset, size_t(length) * sizeof(float));
    return;
  }
  const auto& pieces = data->tensors[t].pieces;  // sorted by offset, tiling [0, numel)
  const uint64_t end = offset + length;
  // The last piece starting at or before `offset`.
  size_t k = size_t(std::upper_bound(pieces.begin(), pieces.end(), offset,
                                     [](uint64_t v, const dm::PieceRecord& p) { return v < p.offset; }) -
                    pieces.begin());
  k = k == 0 ? 0 : k - 1;
  for (; k < pieces.size() && pieces[k].offset < end; ++k) {
    const dm::PieceRecord& p = pieces[k];
    const uint64_t lo = std::max(offset, p.offset), hi = std::min(end, p.offset + p.length);
    if (lo >= hi) continue;
    data->ensure_verified(t, k);
    std::memcpy(dst + (lo - offset), data->piece_bytes(p) + (lo - p.offset) * 4, size_t(hi - lo) * 4);
  }
}

void DistCheckpoint::read(const std::string& name, const std::vector<int64_t>& shape, float* dst) const {
  const size_t t = index_of(*this, name);
  if (data->shapes[t] != shape)
    fail_ckpt(data->dir + ": tensor '" + name + "' has shape " + dm::shape_text(data->shapes[t]) + ", expected " +
                  dm::shape_text(shape),
              "the checkpoint does not match this model config");
  read(name, 0, data->numels[t], dst);
}

}  // namespace zaya
