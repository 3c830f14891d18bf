// Hugging Face tokenizer.json loader (BPE model, normalizers, pre-tokenizers, added tokens,
// post-processor, decoders). See tokenizer.h for the interface.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace zaya {

// Loads a tokenizer.json file; throws zaya::Error naming the file and the field.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);
// The same from the file's text: `path` names it in errors, and a tokenizer_config.json next
// to it (bos/eos) is read when there is one.
std::unique_ptr<Tokenizer> load_hf_tokenizer_text(const std::string& text, const std::string& path);

}  // namespace zaya
