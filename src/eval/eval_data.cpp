// Loads the token stream to evaluate from shards, a token file or text (see eval_data.h).
#include "eval/eval_data.h"

#include <filesystem>

#include "core/error.h"
#include "data/corpus_input.h"
#include "data/document_tokens.h"
#include "data/shard_reader.h"
#include "data/token_file.h"

namespace zaya {

namespace {

namespace fs = std::filesystem;

void append_record_ids(std::vector<int32_t>& out, const uint32_t* ids, size_t n, const std::string& source) {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] > uint32_t(INT32_MAX))
      fail("eval", source + ": token id " + std::to_string(ids[i]) + " is too large");
    out.push_back(int32_t(ids[i]));
  }
}

EvalTokens from_shards(const std::string& dir, const EvalDataOptions& o) {
  const Manifest m = read_manifest(dir);
  if (!m.splits.count(o.split)) {
    std::string have;
    for (const auto& [name, split] : m.splits) have += (have.empty() ? "" : ", ") + name;
    fail("eval", dir + "/manifest.json: no split \"" + o.split + "\" (it has: " + have + ")",
         "choose one with --split");
  }
  ShardDataset::Options so;
  so.split = o.split;
  const ShardDataset ds = ShardDataset::open(dir, so);
  EvalTokens r;
  std::vector<uint32_t> buf(size_t(ds.tokens()));
  if (!buf.empty()) ds.read(0, buf.size(), buf.data());
  append_record_ids(r.tokens, buf.data(), buf.size(), dir);
  r.documents = ds.documents();
  r.description = "shard directory " + dir + ", split " + o.split;
  r.has_document_boundaries = true;
  r.document_starts.reserve(size_t(ds.documents()));
  for (uint64_t d = 0; d < ds.documents(); ++d) r.document_starts.push_back(ds.document_start(d));
  if (ds.has_loss_mask()) {
    r.target_mask.resize(buf.size());
    if (!buf.empty()) ds.read_loss_mask(0, buf.size(), r.target_mask.data());
    r.description += ds.manifest().messages_field.empty() ? " (completions only: prompts are context)"
                                                          : " (the assistant's replies only, chat template " +
                                                                ds.manifest().chat_template + ")";
  }
  return r;
}

EvalTokens from_token_file(const std::string& path) {
  const TokenFile f = read_token_file(path);
  EvalTokens r;
  append_record_ids(r.tokens, f.tokens.data(), f.tokens.size(), path);
  r.documents = f.documents;
  r.description = "token file " + path;
  return r;
}

EvalTokens from_text(const std::vector<std::string>& patterns, const Tokenizer* tok,
                     const EvalDataOptions& o) {
  if (!tok)
    fail("eval", "text inputs need a tokenizer, and none was found",
         "pass --tokenizer PATH, or give the model directory a tokenizer.json or tokenizer.model");
  const int32_t eos = tok->eos_id();
  if (eos < 0) fail("eval", "the tokenizer has no EOS token to end each document with");
  const std::vector<std::string> files = expand_inputs(patterns);
  for (const std::string& f : files) {
    CorpusKind kind;
    Compression compression;
    classify_input(f, &kind, &compression);  // throws naming the file for other extensions
  }
  const RecordFields fields{o.text_field, o.prompt_field, o.completion_field, o.messages_field,
                            o.chat_template};
  const DocumentBuilder builder(*tok, fields, uint32_t(eos), uint64_t(tok->vocab_size()));
  CorpusReader reader(files);
  EvalTokens r;
  RawDocument doc;
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  while (reader.next(&doc)) {
    const std::string file = files[doc.source];
    ids.clear();
    mask.clear();
    if (!builder.append(std::move(doc), file, ids, mask, &r.text_bytes)) continue;
    if (fields.supervised()) r.target_mask.insert(r.target_mask.end(), mask.begin(), mask.end());
    r.document_starts.push_back(r.tokens.size());
    append_record_ids(r.tokens, ids.data(), ids.size(), file);
    ++r.documents;
  }
  r.has_document_boundaries = true;
  r.description = std::to_string(files.size()) + " text file" + (files.size() == 1 ? "" : "s");
  if (fields.prompt_completion()) r.description += " of prompt/completion records (completions only)";
  if (fields.chat())
    r.description += " of chat records, template " + o.chat_template + " (the assistant's replies only)";
  return r;
}

}  // namespace

EvalTokens load_eval_tokens(const std::vector<std::string>& inputs, const Tokenizer* tok,
                            const EvalDataOptions& o) {
  if (inputs.empty())
    fail("eval", "no data given", "pass --data with a shard directory, a .bin token file or text files");
  const RecordFields fields{o.text_field, o.prompt_field, o.completion_field, o.messages_field,
                            o.chat_template};
  check_record_fields(fields, "eval");
  if (inputs.size() == 1) {
    const std::string& in = inputs[0];
    std::error_code ec;
    const bool dir = fs::is_directory(in, ec), bin = fs::path(in).extension() == ".bin";
    if ((dir || bin) && fields.supervised())
      fail("eval",
           in + ": " +
               (fields.chat() ? std::string("--messages-field and --chat-template apply")
                              : std::string("--prompt-field and --completion-field apply")) +
               " to JSONL text, not to " +
               (dir ? std::string("a shard directory") : std::string("a token file")),
           dir ? "supervised fine-tuning shards carry their loss mask; pass the directory alone" : "");
    if (dir) {
      if (!fs::exists(fs::path(in) / "manifest.json", ec))
        fail("eval", in + " is a directory without manifest.json",
             "give a directory written by `zaya data prepare`");
      return from_shards(in, o);
    }
    if (bin) return from_token_file(in);
  }
  return from_text(inputs, tok, o);
}

}  // namespace zaya
