// libFuzzer target: arbitrary bytes as a Hugging Face tokenizer.json (src/data/tokenizer_hf*):
// the streamed vocab and merges, the normalizer, pre-tokenizer, post-processor, decoder and
// added-token sections. Invalid files must end in zaya::Error; a file that loads must encode and
// decode without failing in any other way, and every id it gives must be in its vocabulary.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer_hf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<zaya::Tokenizer> tok;
  try {
    tok = zaya::load_hf_tokenizer_text(text, "/nonexistent/fuzz/tokenizer.json");
  } catch (const zaya::Error&) {
    return 0;
  }
  for (const char* s :
       {"", "ab abc", "a\xC3\xA9 \xE2\x96\x81 z  <s>x</s>\n\t", "\xFF\xC3(", "The quick brown fox."}) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok->encode(s, special);
      for (int32_t id : ids) {
        if (id < 0 || id >= tok->vocab_size()) {
          std::fprintf(stderr, "fuzz_tokenizer: encode gave id %d outside the vocabulary of %lld\n", id,
                       static_cast<long long>(tok->vocab_size()));
          std::abort();
        }
      }
      (void)tok->decode(ids, false);
      (void)tok->decode(ids, true);
    }
  }
  return 0;
}
