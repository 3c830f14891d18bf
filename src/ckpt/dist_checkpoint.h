// Sharded training checkpoints (format version 2): every rank writes only the pieces of the
// training state it owns, in parallel and in the background, and a checkpoint saved by N ranks
// loads with any number of ranks M. docs/checkpoint-format.md, "Format version 2: sharded",
// describes the files; version 1 (checkpoint.h, one process, one file per group) is unchanged.
//
//   root/step-00000123/manifest.json     step, world size, meta, files, tensors -> pieces
//   root/step-00000123/rank-00000.bin    raw little-endian f32: rank 0's pieces back to back
//   root/step-00000123/rank-00001.bin    ...
//   root/.tmp-step-00000124/             a save in progress (or a crashed one): never loaded
//
// Saving (every rank, on the training thread; `comm` is the job's communicator):
//
//   DistCheckpointWriter writer(comm, {.staging_bytes = 1 << 30, .keep_last = 3});
//   ...
//   std::vector<DistPiece> mine = {{"model.w", {4096, 4096}, offset, length, ptr, "params"}, ...};
//   writer.begin_save(root, step, mine, meta);  // copies into staging buffers, then returns
//   ...training continues; writer threads write rank-RRRRR.bin...
//   writer.poll();                               // at each step boundary, on every rank
//   ...
//   DistSaveStats s = writer.finish();           // at the end (blocks until committed)
//
// * A piece is a contiguous element range [offset, offset + length) of the flattened
//   row-major global tensor, with a pointer to its first element. The pieces of one tensor,
//   over all ranks, must cover it exactly once (a tensor owned whole is one piece of
//   offset 0, length numel; a replicated tensor is declared by one rank only). Violations
//   (gaps, overlaps, ranks disagreeing on a shape or group) are refused by begin_save on every
//   rank, before anything is written, with an error naming the tensor.
// * begin_save copies each piece into host staging buffers (through DistWriterOptions::copy,
//   which a GPU trainer sets to a device-to-host copy; default memcpy) and queues them for the
//   writer threads. At most staging_bytes of staging memory exist: when they are all in use,
//   begin_save blocks until the writers free some, so a state larger than the budget still
//   saves (the tail of the copy then waits for the disk). When begin_save returns, the caller
//   may modify its tensors.
// * Writer threads pwrite the chunks into root/.tmp-step-<step>/rank-<rank>.bin, compute the
//   CRC-32C of each piece, and fsync the file.
// * poll() and finish() are collective: every rank calls them at the same points (a poll()
//   per step boundary is cheap: one all_reduce of one int). When every rank's file is durable,
//   the ranks all-gather their piece tables, rank 0 validates the tiling, writes
//   manifest.json (fsynced), renames .tmp-step-<step> to step-<step> (the commit point),
//   fsyncs root, prunes to keep_last, and the result is broadcast. Such disk work (the commit,
//   the temporary directory's creation, each rank's file creation) runs on a helper thread
//   while every rank meets the others in all_reduce rounds at most finish_poll_seconds apart,
//   so storage that takes minutes never keeps a rank inside one collective long enough to trip
//   the Comm watchdog. An I/O error on any rank
//   (disk full, ...) makes every rank's poll()/finish() throw the same zaya::Error
//   ("checkpoint", naming the rank and file); no rank hangs. The temporary directory is then
//   removed; existing checkpoints are never touched by a failed or killed save.
// * One save is in flight at a time: begin_save while one is pending first finishes it.
// * Requires a file system that every rank sees (one node, or a shared file system).
// * With one process (the single-process Comm) the code path is the same.
//
// Loading (any world size):
//
//   auto ck = load_latest_dist_checkpoint(root, comm);  // collective; nullopt if none valid
//   ck->read("model.w", my_offset, my_length, my_buffer);  // any element range
//
// read() assembles the range from whichever pieces cover it, so M ranks each read exactly
// what they own whatever N was. Version 1 checkpoints open too (read-only, through
// load_checkpoint), which lets a run switch formats without losing its checkpoints.
//
// Reshaping offline: reshape_dist_checkpoint() (and `zaya ckpt reshape --in DIR --ranks M
// --out ROOT`) rewrites a checkpoint for M ranks with an ownership function; the default
// gives whole tensors to ranks by LPT bin packing on the element count (ownership.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"  // CheckpointWarn, CheckpointReport, list_checkpoints

namespace zaya {

class Comm;

// Manifest "version" of sharded checkpoints.
constexpr int kDistCheckpointFormatVersion = 2;

// One contiguous range of one tensor that this rank owns and saves.
struct DistPiece {
  std::string name;            // the global tensor name
  std::vector<int64_t> shape;  // the global shape (all ranks must agree)
  uint64_t offset = 0;         // first element, in the flattened row-major global tensor
  uint64_t length = 0;         // elements
  const float* data = nullptr;  // the piece's first element (host, or device with `copy`)
  std::string group = "params";  // "params", "optimizer", "balancer", ... ([A-Za-z0-9_-]{1,64})
};

// Copies `bytes` bytes from piece memory to a host staging buffer. Default: std::memcpy.
using DistCopyFn = std::function<void(void* host_dst, const void* src, size_t bytes)>;

struct DistWriterOptions {
  int writer_threads = 2;                   // background I/O threads per rank (>= 1)
  uint64_t staging_bytes = uint64_t(256) << 20;  // host staging memory per rank (upper bound)
  uint64_t chunk_bytes = uint64_t(8) << 20;      // write unit; capped to staging_bytes
  int keep_last = 3;  // checkpoints kept under root after a commit (<= 0: all)
  DistCopyFn copy;    // piece -> staging copy; default memcpy
  // Warnings (a failed prune, later steps present); default stderr. Called from the training
  // thread, or from a helper thread doing rank 0's disk work while the training thread waits
  // for it inside begin_save(), poll() or finish().
  CheckpointWarn warn;
  // finish() re-checks at most this often while other ranks are still writing, and every rank
  // re-checks this often while rank 0 commits; every check is one all_reduce, so each
  // collective stays short (well under the Comm watchdog).
  double finish_poll_seconds = 0.2;
  // Called on the training thread inside poll() and finish() (and so in a begin_save that
  // finishes a pending save) once every rank has finished writing (or one has failed), just
  // before the part every rank waits for and that may wait on the disk: rank 0's commit
  // (manifest, fsyncs, rename), or the failed save's cleanup. Not called while the files are
  // still being written (poll() then returns at once). The trainer beats its "checkpoint"
  // heartbeat here.
  std::function<void()> before_commit;
};

// What a save cost. Returned by begin_save (begin_seconds filled in), poll() and finish()
// (everything filled in on commit).
struct DistSaveStats {
  int64_t step = -1;
  std::string dir;         // the committed step directory (set once committed)
  bool committed = false;
  double begin_seconds = 0;  // training thread inside begin_save: staging copies + waits for budget
  double wait_seconds = 0;   // training thread inside poll()/finish() for this save
  double stall_seconds() const { return begin_seconds + wait_seconds; }
  double write_seconds = 0;   // this rank: begin_save start -> its file fsynced (wall time)
  double commit_seconds = 0;  // rank 0: manifest, rename and prune (0 on other ranks)
  double total_seconds = 0;   // begin_save start -> commit seen by this rank
  uint64_t bytes = 0;         // bytes written by this rank
  uint64_t total_bytes = 0;   // bytes written by all ranks (set once committed)
  int world_size = 1;
};

// One per process, long-lived; owns the staging buffers and writer threads. Not thread-safe:
// call it from the training thread only.
class DistCheckpointWriter {
 public:
  explicit DistCheckpointWriter(Comm& comm, DistWriterOptions options = {});
  // Abandons a pending save (queued chunks are dropped, the writer threads joined): it is NOT
  // committed, since that needs every rank; call finish() first. The abandoned save stays a
  // .tmp-* directory, which the next save removes.
  ~DistCheckpointWriter();
  DistCheckpointWriter(const DistCheckpointWriter&) = delete;
  DistCheckpointWriter& operator=(const DistCheckpointWriter&) = delete;

  // Collective. Starts saving `pieces` (this rank's) as root/step-<step>. Finishes a pending
  // save first. Throws zaya::Error (on every rank alike) for invalid pieces, a bad tiling, or
  // when the temporary directory or a rank file cannot be created or reserved (a full disk
  // usually fails here); nothing is committed then. Failures after that point (a write error,
  // a throwing copy callback) are reported by poll()/finish(), on every rank alike. `meta` is
  // rank 0's JSON (tokens, cursor, recipe, ...), stored unchanged; other ranks' meta is ignored.
  DistSaveStats begin_save(const std::string& root, int64_t step, const std::vector<DistPiece>& pieces,
                           const nlohmann::json& meta);
  // Collective. Commits the pending save if every rank has finished writing and returns its
  // stats; nullopt while writing is still going on, or when nothing is pending (then without
  // communicating). Throws zaya::Error on every rank if any rank failed.
  std::optional<DistSaveStats> poll();
  // Collective. Blocks until the pending save is committed and returns its stats (the last
  // committed save's stats when nothing is pending). Throws like poll().
  DistSaveStats finish();
  // True between begin_save and the commit (or failure) of that save.
  bool pending() const;
  // The stats of the last committed save (step -1 before the first).
  const DistSaveStats& last_committed() const;
  const DistWriterOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Loading

enum class DistVerify {
  Full,  // check every piece checksum before accepting the checkpoint (fallback works)
  Lazy,  // check the manifest and file sizes; each piece's checksum when it is first read
};

struct DistLoadOptions {
  DistVerify verify = DistVerify::Full;
  CheckpointWarn warn;  // default stderr
};

namespace detail {
struct DistCheckpointData;
}

// An opened, validated checkpoint (version 2, or version 1 read through load_checkpoint).
// Copies share the memory-mapped files. read() may be called from several threads.
class DistCheckpoint {
 public:
  const std::string& dir() const;
  int64_t step() const;
  int version() const;      // 2, or 1 for a single-process checkpoint
  int world_size() const;   // ranks that wrote it
  const nlohmann::json& meta() const;      // the caller's JSON, as saved
  const nlohmann::json& manifest() const;  // the whole manifest

  std::vector<std::string> names() const;  // tensor names, in manifest order
  bool contains(const std::string& name) const;
  // Throw zaya::Error naming the tensor if it is absent.
  const std::vector<int64_t>& shape(const std::string& name) const;
  uint64_t numel(const std::string& name) const;
  const std::string& group(const std::string& name) const;

  // Copies elements [offset, offset + length) of the flattened tensor into dst (length
  // floats), from whichever pieces cover them. Throws zaya::Error if the tensor is absent,
  // the range is outside it, or a piece's checksum does not match (pieces not verified at
  // open are verified, whole, the first time they are touched).
  void read(const std::string& name, uint64_t offset, uint64_t length, float* dst) const;
  // The whole tensor; `shape` must equal the saved shape.
  void read(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;

  std::shared_ptr<const detail::DistCheckpointData> data;
};

// One read of read_dist_tensors: the whole tensor `name` when `shape` is given (it must equal
// the saved shape; {} for a scalar), else elements [offset, offset + length) of the flattened
// tensor. dst is host memory.
struct DistRead {
  std::string name;
  std::optional<std::vector<int64_t>> shape;
  uint64_t offset = 0, length = 0;
  float* dst = nullptr;
};

// Collective over `comm`: every rank calls it, each with its own reads (possibly none). They
// run on a helper thread while the ranks meet in short rounds, so a rank whose storage is
// slower than the others' never holds them inside one collective (the Comm watchdog times the
// network, not the disk). When a read fails on any rank, every rank throws the same
// zaya::Error, naming the lowest failing rank.
void read_dist_tensors(const DistCheckpoint& ck, Comm& comm, const std::vector<DistRead>& reads);

// Opens one step directory. Throws zaya::Error naming the file and the problem.
DistCheckpoint open_dist_checkpoint(const std::string& dir, const DistLoadOptions& options = {});

// The newest valid checkpoint under root (step-* from the highest step down; each damaged one
// is reported through options.warn and skipped; .tmp-* is never considered), or nullopt.
// Local: every caller reads and verifies on its own.
std::optional<DistCheckpoint> load_latest_dist_checkpoint(const std::string& root, const DistLoadOptions& options = {});

// Collective version for a job: all ranks agree on the same checkpoint (rank 0's listing is
// broadcast). With DistVerify::Full the ranks verify disjoint shares of the pieces in
// parallel and agree on the verdict (all_reduce), so the data is read once in all, not once
// per rank; a damaged checkpoint is skipped by every rank alike.
std::optional<DistCheckpoint> load_latest_dist_checkpoint(const std::string& root, Comm& comm,
                                                          const DistLoadOptions& options = {});

// The manifest "version" of a checkpoint directory (1: checkpoint.h, 2: sharded), read without
// validating anything else; -1 when the manifest is missing or unreadable.
int checkpoint_format_version(const std::string& dir);

// Full verification for `zaya ckpt inspect` that never throws for a damaged checkpoint: the
// manifest, each file's size and CRC-32C, and each piece's CRC-32C; every problem is listed.
CheckpointReport verify_dist_checkpoint(const std::string& dir);

// ---------------------------------------------------------------------------------------------
// Reshaping

// One range of a tensor that new rank `rank` owns.
struct DistOwnedRange {
  int rank = 0;
  uint64_t offset = 0;  // elements
  uint64_t length = 0;
};
// For each tensor (name, global shape), the ranges each new rank owns; they must tile it.
using DistOwnership =
    std::function<std::vector<DistOwnedRange>(const std::string& name, const std::vector<int64_t>& shape)>;

// The default policy: every tensor whole, assigned by assign_whole_tensors (LPT) with cost =
// numel over the checkpoint's tensors in manifest order.
DistOwnership whole_tensor_ownership(const DistCheckpoint& in, int ranks);

struct DistReshapeOptions {
  DistOwnership ownership;  // empty: whole_tensor_ownership(in, ranks)
  int keep_last = 0;        // retention under out_root (<= 0: keep all)
  CheckpointWarn warn;
};

// Writes `in` as a sharded checkpoint for `ranks` ranks: out_root/step-<step>/ (same step and
// meta; the manifest records "reshaped_from"), committed like a save (tmp dir + rename).
// out_root must not be the directory that holds `in`. Returns the new step directory.
std::string reshape_dist_checkpoint(const DistCheckpoint& in, const std::string& out_root, int ranks,
                                    const DistReshapeOptions& options = {});

}  // namespace zaya
