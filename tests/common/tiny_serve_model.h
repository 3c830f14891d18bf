// The model and prompt the inference server's tests share: zaya-tiny with fixed random
// weights, and a short prompt of token ids inside its vocabulary.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"

namespace zaya::test {

inline std::unique_ptr<Model> tiny_model(Backend& be) {
  auto m = std::make_unique<Model>(preset_config("zaya-tiny"), be);
  m->init_random(11);
  return m;
}

inline const std::vector<int32_t> kPrompt = {2, 57, 190, 33, 241};

}  // namespace zaya::test
