// safetensors reading (mmap, validated header, sharded model.safetensors.index.json) and
// writing. Every malformed input is reported as zaya::Error naming the file and the field;
// no read ever leaves the mapped file.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace zaya {

struct SafeTensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
  uint64_t numel() const;
};

// Parses and validates a whole safetensors image held in memory (header length, JSON header,
// dtypes, shapes, offsets inside the data section, no overlaps, byte counts matching shapes).
// `source` names the file in errors. Used by the file reader and by the fuzzer.
void parse_safetensors(const uint8_t* bytes, size_t size, const std::string& source,
                       std::vector<SafeTensorInfo>* tensors, std::map<std::string, std::string>* metadata,
                       uint64_t* data_offset);

// One memory-mapped .safetensors file.
class SafeTensorsFile {
 public:
  static std::unique_ptr<SafeTensorsFile> open(const std::string& path);
  ~SafeTensorsFile();
  SafeTensorsFile(const SafeTensorsFile&) = delete;
  SafeTensorsFile& operator=(const SafeTensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafeTensorInfo* find(const std::string& name) const;
  const uint8_t* data(const SafeTensorInfo& t) const { return base_ + data_offset_ + t.begin; }

 private:
  SafeTensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint64_t data_offset_ = 0;
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory: model.safetensors, or the shards listed by
// model.safetensors.index.json (its weight_map is checked against the shards' contents).
class SafeTensorsSet {
 public:
  static SafeTensorsSet open_dir(const std::string& dir);
  static SafeTensorsSet open_file(const std::string& path);

  struct Entry {
    const SafeTensorsFile* file;
    const SafeTensorInfo* info;
  };
  const Entry* find(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // Reads a tensor as fp32 into dst (numel elements), converting from BF16/F16.
  void read_f32(const std::string& name, float* dst) const;

 private:
  std::vector<std::unique_ptr<SafeTensorsFile>> files_;
  std::map<std::string, Entry> entries_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * dtype_size bytes, already in `dtype`
};

// Writes one safetensors file (tensors in the given order, 8-byte aligned data), through a
// temporary file and rename so a crash never leaves a half-written file under `path`.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace zaya
