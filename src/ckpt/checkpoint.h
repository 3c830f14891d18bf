// Training checkpoints: crash-safe, checksummed snapshots of fp32 tensors (parameters,
// optimizer state, ...) plus caller JSON (tokens seen, data cursor, RNG state, recipe, ...).
//
//   root/step-00000123/manifest.json        format version, step, meta, files, tensors
//   root/step-00000123/<group>.safetensors  one file per tensor group (params, optimizer, ...)
//
// A save writes root/.tmp-step-00000123-<pid>/, fsyncs every file and the directory, renames
// it to step-00000123 and fsyncs root, so a step-* directory is always complete. Loading
// checks the manifest and every CRC-32C and falls back to older checkpoints when the newest
// is damaged. docs/checkpoint-format.md describes the format and the multi-rank extension.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zaya {

// Manifest "version" this code writes; the loader reads versions <= this one.
constexpr int kCheckpointFormatVersion = 1;

// One fp32 tensor to save. `group` picks the file: <group>.safetensors ([A-Za-z0-9_-]+).
struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel floats, row-major; may be null only when numel == 0
  std::string group = "params";
};

// A caller buffer to fill from a checkpoint; the checkpoint's shape must equal `shape`.
struct CheckpointTensorOut {
  std::string name;
  std::vector<int64_t> shape;
  float* data = nullptr;
};

// Receives warnings (a skipped damaged checkpoint, a failed prune). Default: stderr.
using CheckpointWarn = std::function<void(const std::string&)>;

struct CheckpointSaveOptions {
  CheckpointWarn warn;
};

// Writes root/step-<step:08>/ atomically (see above) and returns its path. An existing
// directory for the same step is replaced: at every instant step-<step> is either the old
// complete checkpoint, absent, or the new complete one. Afterwards keeps the `keep_last`
// highest-step checkpoints (always including the one just written; keep_last <= 0 keeps all)
// and removes stale .tmp-* directories (one saving process per root is assumed).
// Throws zaya::Error (component "checkpoint") on any I/O failure; nothing partial is left
// under a step-* name.
std::string save_checkpoint(const std::string& root, int64_t step, const std::vector<CheckpointTensor>& tensors,
                            const nlohmann::json& meta, int keep_last, const CheckpointSaveOptions& opts = {});

struct CheckpointLoadOptions {
  // true: read every byte and check every file checksum before accepting a checkpoint (what
  // makes fallback work for damaged tensor data). false: check the manifest, file sizes and
  // safetensors headers only; each tensor's checksum is then checked when it is read.
  bool verify_checksums = true;
  CheckpointWarn warn;
};

namespace detail {
struct CheckpointData;
}

// An opened, validated checkpoint. Copies share the memory-mapped files.
struct LoadedCheckpoint {
  std::string dir;
  int64_t step = 0;
  nlohmann::json meta;      // the caller's JSON, as saved
  nlohmann::json manifest;  // the whole manifest

  std::vector<std::string> names() const;  // tensor names, in save order
  bool contains(const std::string& name) const;
  // The saved shape; throws zaya::Error naming the tensor if absent.
  const std::vector<int64_t>& shape(const std::string& name) const;
  // Copies one tensor into dst (numel floats). Throws zaya::Error if it is absent, its shape
  // differs from `shape`, or (when not verified at load) its checksum does not match.
  void read(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;
  // Fills every buffer; one zaya::Error lists all missing and mis-shaped tensors.
  void read_all(const std::vector<CheckpointTensorOut>& outs) const;

  std::shared_ptr<const detail::CheckpointData> data;
};

// Opens and validates one checkpoint directory. Throws zaya::Error naming the file and the
// problem, e.g. ".../step-00000200/params.safetensors: checksum mismatch for tensor 'x'".
LoadedCheckpoint load_checkpoint(const std::string& dir, const CheckpointLoadOptions& opts = {});

// Tries root/step-* from the highest step down and returns the first valid one; each damaged
// checkpoint is reported through opts.warn and skipped. nullopt when root is missing or holds
// no valid checkpoint. .tmp-* directories (unfinished saves) are never considered.
std::optional<LoadedCheckpoint> load_latest_checkpoint(const std::string& root,
                                                       const CheckpointLoadOptions& opts = {});

// The step-* directories under root, highest step first (no validation).
struct CheckpointDirEntry {
  int64_t step = 0;
  std::string dir;
};
std::vector<CheckpointDirEntry> list_checkpoints(const std::string& root);

// Full verification that never throws for a damaged checkpoint: every problem found (not
// only the first) for `zaya ckpt inspect`. manifest is null when it could not be read.
struct CheckpointReport {
  std::string dir;
  nlohmann::json manifest;
  std::vector<std::string> problems;  // empty = valid
  bool ok() const { return problems.empty(); }
};
CheckpointReport verify_checkpoint(const std::string& dir);

}  // namespace zaya
