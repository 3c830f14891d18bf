// Reading tokenizer.json in one pass. A large model's file is mostly model.vocab and
// model.merges (Gemma 3: 262,144 tokens and 1,029,812 merges in 33 MB); as a JSON document
// they are a quarter of a million map nodes and a million small arrays, built only to be read
// once. The parse keeps the document for everything else and takes those two straight into
// flat lists, which BpeModel::load checks as it would have checked the document.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace zaya::tok {

// model.vocab and model.merges as the file gave them, in file order.
struct BpeEntries {
  struct Merge {
    enum class Form { Text, Pair, Invalid };
    Form form = Form::Invalid;
    std::string a, b;  // Text: the whole "a b" string in a; Pair: the two tokens
  };
  bool vocab_is_object = false;  // model.vocab was an object (its entries are below)
  bool merges_is_array = false;  // model.merges was an array
  // (token, id); id is -1 where the value was not an integer in [0, INT32_MAX].
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<Merge> merges;
};

struct TokenizerJson {
  nlohmann::json doc;  // the file, with model.vocab and model.merges left empty when taken out
  BpeEntries bpe;
};

// A token id from the file: the integer when it is one in [0, INT32_MAX], else -1 (a plain
// get<int32_t> would turn 2^32 or 1.5 into 1). The vocabulary, added tokens and post-processor
// all read their ids through it.
int32_t token_id_or_invalid(const nlohmann::json& v);

// Parses tokenizer.json text; throws nlohmann::json::exception (parse_error, out_of_range) on
// malformed JSON.
TokenizerJson parse_tokenizer_json(const std::string& text);

}  // namespace zaya::tok
