// libFuzzer target: arbitrary bytes as a safetensors image. parse_safetensors must either
// accept them (and then every tensor lies inside the buffer) or throw zaya::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<zaya::SafeTensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;
  try {
    zaya::parse_safetensors(data, size, "fuzz.safetensors", &tensors, &metadata, &data_offset);
  } catch (const zaya::Error&) {
    return 0;
  }
  // Accepted: check the invariants the loaders rely on.
  if (data_offset < 8 || data_offset > size) std::abort();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (t.begin > t.end || t.end > size - data_offset) std::abort();
    if (t.end - t.begin != t.numel() * zaya::dtype_size(t.dtype)) std::abort();
    if (i > 0 && !(tensors[i - 1].name < t.name)) std::abort();
    // Touch the first and last byte so ASan sees any out-of-bounds range.
    if (t.end > t.begin) {
      volatile uint8_t a = data[data_offset + t.begin];
      volatile uint8_t b = data[data_offset + t.end - 1];
      (void)a;
      (void)b;
    }
  }
  return 0;
}
