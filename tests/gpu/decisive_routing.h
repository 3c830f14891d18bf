// A routing that rounding cannot flip, for comparing bf16 GPU runs with the CPU: the selection
// bias of expert (l mod E) is raised by 10 in every layer l, so every token's argmax is decided
// by far more than any rounding (the mixing weight is still the unbiased softmax probability,
// so the routers still get gradients). These random tiny models otherwise have routing margins
// of about 2e-3, within bf16's rounding of the routers' inputs.
#pragma once
#include <string>
#include <vector>

#include "model/model.h"

namespace zaya::gpu_test {

inline void make_routing_decisive(Model& m) {
  const ModelConfig& c = m.config();
  for (const ParamSpec& p : m.layout().params) {
    const std::string suffix = "mlp.gate.balancing_biases";
    if (p.name.size() < suffix.size() ||
        p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const int64_t layer = std::stoll(p.name.substr(std::string("model.layers.").size()));
    std::vector<float> b(static_cast<size_t>(p.numel));
    m.backend().to_host(b.data(), m.params() + p.offset, p.numel * 4);
    b[size_t(layer % c.num_experts)] += 10.0f;
    m.backend().from_host(m.params() + p.offset, b.data(), p.numel * 4);
  }
}

}  // namespace zaya::gpu_test
