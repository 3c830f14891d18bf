// The array-of-tables parts of a recipe: [[data.datasets]] and [[phases]] (docs/recipes.md,
// "Phases and mixtures"). Internal to recipe.cpp, which owns the scalar keys.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "train/recipe.h"

namespace zaya::recipe_detail {

struct Problem {
  uint32_t line = 0, column = 0;
  std::string message, hint;
};

// Reads the value of `data.datasets` / `phases` (must be arrays of tables).
void read_datasets(const toml::node& node, std::vector<RecipeDataset>& out, const std::string& source,
                   std::vector<Problem>& problems);
void read_phases(const toml::node& node, std::vector<RecipePhase>& out, const std::string& source,
                 std::vector<Problem>& problems);
// Constraints across datasets, phases and the scalar keys (names unique, mixtures naming
// declared datasets, budgets multiples of seq_len, only the last phase open-ended, ...).
void check_phases(const Recipe& r, const std::string& source, std::vector<Problem>& problems);
// TOML text of both arrays (empty when there are none), in the recipe_to_toml layout.
std::string phases_to_toml(const Recipe& r);

}  // namespace zaya::recipe_detail
