// `zaya tokenize`: encodes a text file and writes {"ids": [...]}.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "core/error.h"
#include "data/tokenizer.h"

namespace zaya::cli {

void add_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Encode a text file to token ids");
  static std::string tokenizer, input, out;
  static bool add_special = false;
  cmd->add_option("--tokenizer", tokenizer, "tokenizer.json, a SentencePiece .model, or a directory")->required();
  cmd->add_option("--input", input, "Text file (UTF-8)")->required();
  cmd->add_option("--out", out, "Output JSON {\"ids\": [...]}")->required();
  cmd->add_flag("--add-special", add_special, "Add the tokenizer's special tokens (e.g. BOS)");
  cmd->callback([] {
    auto tok = load_tokenizer(tokenizer);
    std::ifstream f(input, std::ios::binary);
    if (!f) fail("tokenize", "cannot open " + input);
    std::stringstream ss;
    ss << f.rdbuf();
    std::vector<int32_t> ids = tok->encode(ss.str(), add_special);
    FILE* o = std::fopen(out.c_str(), "w");
    if (!o) fail("tokenize", "cannot write " + out);
    std::fprintf(o, "{\"ids\": [");
    for (size_t i = 0; i < ids.size(); ++i) std::fprintf(o, i ? ",%d" : "%d", ids[i]);
    std::fprintf(o, "]}\n");
    if (std::fclose(o) != 0) fail("tokenize", "error writing " + out);
    std::fprintf(stderr, "[zaya] %zu bytes -> %zu tokens\n", ss.str().size(), ids.size());
  });
}

}  // namespace zaya::cli
