// libFuzzer target: arbitrary bytes as a training recipe (TOML), and as one `--set` override.
// TOML syntax errors, unknown keys and out-of-range values must come back as zaya::Error; a
// recipe that parsed must survive its own TOML round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/error.h"
#include "train/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const zaya::Recipe r = zaya::parse_recipe(text, "fuzz/recipe.toml");
    try {
      if (!(zaya::parse_recipe(zaya::recipe_to_toml(r), "fuzz/roundtrip.toml") == r)) {
        std::fprintf(stderr, "a recipe changed in its TOML round trip\n");
        std::abort();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "a valid recipe failed its TOML round trip: %s\n", e.what());
      std::abort();
    }
  } catch (const zaya::Error&) {
  }
  // The same bytes as `zaya train --set <text>` on the default recipe.
  static const zaya::Recipe defaults = zaya::default_recipe();  // parsed once
  zaya::Recipe r = defaults;
  try {
    zaya::apply_override(r, text);
    zaya::validate_recipe(r, "fuzz --set");
  } catch (const zaya::Error&) {
  }
  return 0;
}
