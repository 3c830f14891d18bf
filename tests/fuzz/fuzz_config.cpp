// libFuzzer target: arbitrary bytes as config.json. Invalid JSON (nlohmann exceptions) and
// invalid configs (zaya::Error) are expected; anything else escaping is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  zaya::ModelConfig c;
  try {
    c = zaya::config_from_json(j, "fuzz/config.json");
  } catch (const zaya::Error&) {
    return 0;
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  // A config that validated must give sane derived quantities and survive a JSON round trip.
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) (void)c.rotary_dim(l);
  (void)c.conv_channels();
  (void)c.conv_state_rows();
  try {
    zaya::ModelConfig again = zaya::config_from_json(zaya::config_to_json(c), "fuzz/roundtrip.json");
    if (zaya::config_to_json(again) != zaya::config_to_json(c)) {
      std::fprintf(stderr, "config changed in a JSON round trip\n");
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "a valid config failed its JSON round trip: %s\n", e.what());
    std::abort();
  }
  return 0;
}
