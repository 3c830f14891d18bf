// Shared CLI helpers: parse id lists and find a model directory's tokenizer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace zaya::cli {

// "1,2,3" -> {1,2,3}; throws naming the bad element.
std::vector<int32_t> parse_id_list(const std::string& s);
// explicit path, else <model_dir>/tokenizer.json or tokenizer.model; nullptr if none.
std::unique_ptr<Tokenizer> find_tokenizer(const std::string& explicit_path, const std::string& model_dir);

}  // namespace zaya::cli
