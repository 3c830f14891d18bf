// SentencePiece .model tokenizer (via libsentencepiece). See tokenizer.h for the interface.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace zaya {

// Loads a SentencePiece model file; throws zaya::Error naming the file.
std::unique_ptr<Tokenizer> load_sp_tokenizer(const std::string& path);

}  // namespace zaya
