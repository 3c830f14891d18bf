// The manifest of a sharded checkpoint (format version 2, docs/checkpoint-format.md): the
// records the writer gathers from every rank, the tiling check that every tensor's pieces
// cover it exactly once, and manifest.json formatting (self-checksummed, like version 1) and
// parsing. Internal to src/ckpt/dist_*.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/manifest_common.h"

namespace zaya::dist_manifest {

// Shared with format version 1 (ckpt/manifest_common.h).
using manifest_common::kFormatName;
using manifest_common::kManifestName;
using manifest_common::plain_file_name;
using manifest_common::shape_numel;
using manifest_common::shape_text;
using manifest_common::valid_group;

constexpr int kVersion = 2;

struct PieceRecord {
  int rank = 0;
  uint64_t offset = 0;  // elements into the flattened global tensor
  uint64_t length = 0;  // elements
  std::string file;     // rank file holding the data
  uint64_t file_offset = 0;  // bytes into `file`
  uint32_t crc = 0;          // CRC-32C of the length * 4 bytes
};

struct TensorRecord {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  std::string group;
  std::vector<PieceRecord> pieces;  // sorted by offset once checked
};

struct FileRecord {
  std::string name;
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc = 0;  // CRC-32C of the whole file
};

// What one rank contributes to the manifest: its data file and the pieces in it.
struct RankEntry {
  std::string name;
  std::vector<int64_t> shape;
  std::string group;
  PieceRecord piece;
};
struct RankTable {
  int rank = 0;
  std::vector<FileRecord> files;
  std::vector<RankEntry> entries;
};

// Compact JSON text of a table (what the ranks all-gather) and back. from_text throws
// zaya::Error naming the rank when the text is malformed.
std::string table_to_text(const RankTable& t);
RankTable table_from_text(const std::string& text, int rank);

// Sorts t's pieces by offset and checks they cover [0, numel) exactly once (zero-length
// pieces are allowed anywhere in range). Returns "" or a message naming the tensor and the
// elements of the first gap or overlap.
std::string check_tiling(TensorRecord& t);

// Merges all ranks' tables into tensors (rank 0's order first, then new names of rank 1,
// ...), checking that every rank agrees on each tensor's shape and group, and the tiling.
// Returns "" or the first problem.
std::string assemble(const std::vector<RankTable>& tables, std::vector<TensorRecord>* out);

struct Manifest {
  int64_t step = 0;
  int world_size = 1;
  std::string created;
  int64_t created_unix = 0;
  nlohmann::json meta = nlohmann::json::object();
  std::vector<FileRecord> files;  // one per rank, in rank order
  std::vector<TensorRecord> tensors;
  nlohmann::json reshaped_from;  // null, or {dir, step, world_size} of the source
};

// manifest.json text: the "manifest_checksum" field first (CRC-32C of the text with its 8
// digits as "00000000"), one field per line, one line per file and per tensor. Fills
// created/created_unix with the current time when created is empty.
std::string format_manifest(Manifest m);

// The "version" of dir/manifest.json without validating anything else; -1 if unreadable.
int peek_version(const std::string& dir);

// Reads and validates dir/manifest.json: self-checksum, format, version 2, step against the
// directory name, files (one per rank), tensors (shapes, pieces in range of their files,
// tiling). Appends every problem found to *problems; returns false if there was any.
bool read_manifest(const std::string& dir, Manifest* m, nlohmann::json* raw, std::vector<std::string>* problems);

}  // namespace zaya::dist_manifest
