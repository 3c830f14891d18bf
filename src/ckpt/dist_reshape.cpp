// Offline reshaping of a checkpoint (version 1 or 2) into a sharded checkpoint for another
// number of ranks, and the default whole-tensor ownership policy (see dist_checkpoint.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "ckpt/checksum.h"
#include "ckpt/dist_checkpoint.h"
#include "ckpt/dist_io.h"
#include "ckpt/dist_manifest.h"
#include "ckpt/ownership.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace zaya {

namespace dm = dist_manifest;
using dist_io::fail_ckpt;

DistOwnership whole_tensor_ownership(const DistCheckpoint& in, int ranks) {
  const std::vector<std::string> names = in.names();
  std::vector<double> costs;
  for (const std::string& n : names) costs.push_back(numel_cost(in.shape(n)));
  const std::vector<int> owner = assign_whole_tensors(costs, ranks);
  auto owner_of = std::make_shared<std::map<std::string, int>>();
  for (size_t i = 0; i < names.size(); ++i) (*owner_of)[names[i]] = owner[i];
  return [owner_of](const std::string& name, const std::vector<int64_t>& shape) {
    uint64_t numel = 0;
    dm::shape_numel(shape, &numel);
    auto it = owner_of->find(name);
    return std::vector<DistOwnedRange>{{it == owner_of->end() ? 0 : it->second, 0, numel}};
  };
}

namespace {

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  fs::path pa = fs::weakly_canonical(fs::absolute(a), ea), pb = fs::weakly_canonical(fs::absolute(b), eb);
  return !ea && !eb && pa.lexically_normal() == pb.lexically_normal();
}

// Writes one new rank's file from `in`; fills the pieces' CRCs and returns the file record.
dm::FileRecord write_rank_file(const DistCheckpoint& in, const std::string& tmp, dm::RankTable& table) {
  dm::FileRecord f;
  f.name = dist_io::rank_file_name(table.rank);
  f.rank = table.rank;
  const std::string path = dist_io::join(tmp, f.name);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_ckpt(path + ": cannot create: " + dist_io::errno_text());
  try {
    std::vector<float> buf(size_t(1) << 21);  // 8 MiB at a time
    for (dm::RankEntry& e : table.entries) {
      uint32_t crc = 0;
      for (uint64_t done = 0; done < e.piece.length;) {
        const uint64_t n = std::min<uint64_t>(buf.size(), e.piece.length - done);
        in.read(e.name, e.piece.offset + done, n, buf.data());
        crc = crc32c_combine(crc, crc32c(buf.data(), size_t(n * 4)), n * 4);
        dist_io::pwrite_all(fd, buf.data(), size_t(n * 4), e.piece.file_offset + done * 4, path);
        done += n;
      }
      e.piece.crc = crc;
      f.crc = crc32c_combine(f.crc, crc, e.piece.length * 4);
      f.bytes += e.piece.length * 4;
    }
    dist_io::fsync_file(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail_ckpt(path + ": close failed: " + dist_io::errno_text());
  return f;
}

}  // namespace

std::string reshape_dist_checkpoint(const DistCheckpoint& in, const std::string& out_root, int ranks,
                                    const DistReshapeOptions& options) {
  const CheckpointWarn warn = dist_io::warner(options.warn);
  if (!in.data) fail_ckpt("reshape: no input checkpoint is open");
  if (ranks < 1 || ranks > 100000)
    fail_ckpt("reshape: cannot reshape to " + std::to_string(ranks) + " ranks", "use 1 to 100000 ranks");
  if (same_directory(out_root, fs::path(in.dir()).lexically_normal().parent_path().string()) ||
      same_directory(out_root, in.dir()))
    fail_ckpt("reshape: the output root " + out_root + " is where the input " + in.dir() + " lives",
              "write the reshaped checkpoint to another directory");
  const DistOwnership own = options.ownership ? options.ownership : whole_tensor_ownership(in, ranks);

  // The new layout: each rank's pieces in checkpoint order, back to back in its file.
  std::vector<dm::RankTable> tables(static_cast<size_t>(ranks));
  std::vector<uint64_t> file_bytes(size_t(ranks), 0);
  for (int r = 0; r < ranks; ++r) tables[size_t(r)].rank = r;
  for (const std::string& name : in.names()) {
    for (const DistOwnedRange& o : own(name, in.shape(name))) {
      if (o.rank < 0 || o.rank >= ranks)
        fail_ckpt("reshape: the ownership of tensor '" + name + "' names rank " + std::to_string(o.rank) +
                  ", outside 0.." + std::to_string(ranks - 1));
      const std::string file = dist_io::rank_file_name(o.rank);
      tables[size_t(o.rank)].entries.push_back(
          {name, in.shape(name), in.group(name), {o.rank, o.offset, o.length, file, file_bytes[size_t(o.rank)], 0}});
      file_bytes[size_t(o.rank)] += o.length * 4;
    }
  }
  std::vector<dm::TensorRecord> check;
  std::string err = dm::assemble(tables, &check);
  if (!err.empty()) fail_ckpt("reshape: the new ownership is invalid: " + err);

  dist_io::create_root(out_root);
  dist_io::remove_tmp_entries(out_root, "", warn);
  const std::string final_name = dist_io::step_dir_name(in.step());
  const std::string tmp = dist_io::join(out_root, std::string(dist_io::kTmpPrefix) + final_name);
  const std::string final_dir = dist_io::join(out_root, final_name);
  if (::mkdir(tmp.c_str(), 0755) != 0) fail_ckpt(tmp + ": cannot create: " + dist_io::errno_text());
  try {
    dm::Manifest man;
    man.step = in.step();
    man.world_size = ranks;
    man.meta = in.meta();
    man.reshaped_from = {{"dir", in.dir()}, {"step", in.step()}, {"world_size", in.world_size()}, {"version", in.version()}};
    for (dm::RankTable& t : tables) {
      dm::FileRecord f = write_rank_file(in, tmp, t);
      t.files.push_back(f);
      man.files.push_back(f);
    }
    err = dm::assemble(tables, &man.tensors);
    if (!err.empty()) fail_ckpt("reshape: " + err);
    dist_io::write_file_durable(dist_io::join(tmp, dm::kManifestName), dm::format_manifest(man));
    dist_io::fsync_dir(tmp);
    dist_io::commit_rename(out_root, tmp, final_dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  dist_io::prune(out_root, in.step(), options.keep_last, warn);
  dist_io::remove_tmp_entries(out_root, "", warn);
  return final_dir;
}

}  // namespace zaya
