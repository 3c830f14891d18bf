// The parameter layout: every tensor of a ZAYA model under its canonical HF 40-block name,
// with its shape, its optimizer class and its offset in one flat fp32 arena. Weights,
// gradients and optimizer state share this layout, so zeroing, clipping, all-reduce,
// sharding and checkpoint slicing all work by offset.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace zaya {

enum class ParamKind {
  Matrix,     // 2-D hidden matrix (Muon), including each expert's matrices
  Embedding,  // token embedding / untied LM head (AdamW)
  Conv,       // CCA convolution weights (AdamW)
  Vector,     // 1-D: norms, biases, residual scales, temp, EDA scale (AdamW, no decay)
  Buffer,     // not trained by the optimizer (balancing biases)
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  ParamKind kind = ParamKind::Vector;
  int64_t offset = 0;  // in floats, 16-float aligned
  int64_t numel = 0;
};

struct ParamLayout {
  std::vector<ParamSpec> params;
  std::map<std::string, size_t> index;
  int64_t total = 0;  // floats, including alignment padding
  const ParamSpec* find(const std::string& name) const;
  const ParamSpec& at(const std::string& name) const;  // throws naming the tensor
  // Appends a tensor at the next 16-float aligned offset (also used by tests to build layouts).
  void add(const std::string& name, std::vector<int64_t> shape, ParamKind kind);
};

ParamLayout build_param_layout(const ModelConfig& c);
std::string shape_str(const std::vector<int64_t>& shape);

// Parameter counts (spec A.9 accounting).
struct ParamCounts {
  int64_t total = 0;      // all trainable parameters incl. embedding
  int64_t embedding = 0;  // token embedding (+ untied head)
  int64_t active = 0;     // per token: everything except the non-selected experts, excl. embedding
};
ParamCounts count_params(const ModelConfig& c);

}  // namespace zaya
