// Loading and saving ZAYA models in Hugging Face layout: config.json + safetensors (single or
// sharded). Accepts the HF 40-block tensor names and the original 80-half-layer names (spec
// A.2/A.3), converts F32/BF16/F16 to fp32, and reports every missing, unexpected and
// mis-shaped tensor in one error.
#pragma once
#include <memory>
#include <string>

#include "core/dtype.h"
#include "model/model.h"

namespace zaya {

// Loads dir/config.json and the weights from dir. Throws zaya::Error listing all problems.
std::unique_ptr<Model> load_model(const std::string& dir, Backend& be);
// Fills an existing model's parameters from the safetensors in dir.
void load_weights(Model& m, const std::string& dir);
// Writes dir/config.json and dir/model.safetensors (canonical HF names) in `dtype`.
void save_model(Model& m, const std::string& dir, DType dtype = DType::F32);

// For the original 80-half-layer layout: the source tensor name(s) of a canonical parameter
// (several names = per-expert tensors stacked along dim 0).
std::vector<std::string> original_layout_names(const ModelConfig& c, const std::string& canonical);

}  // namespace zaya
