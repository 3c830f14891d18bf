// Corpus inputs for `zaya data prepare`: .txt files (one document per file) and .jsonl files
// (one JSON object per line, the document text in a named string field), each optionally
// compressed as .gz (zlib) or .zst (zstd). Reading is sequential and streaming; errors name
// the file (and for JSONL the line).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/chat_template.h"

namespace zaya {

// Expands files and glob patterns (glob(3): *, ?, [...]) in order; each pattern's matches are
// sorted; duplicates keep their first position. A pattern with no match is an error.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

enum class CorpusKind { Text, Jsonl };
enum class Compression { None, Gzip, Zstd };

// Classifies a path by its extensions: .txt, or .jsonl / .ndjson (JSON lines), then
// optionally .gz / .zst. Throws naming the file for anything else.
void classify_input(const std::string& path, CorpusKind* kind, Compression* compression);

// A decompressing byte stream over one file.
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Reads up to n bytes; returns 0 only at the end of the (decompressed) data. Throws on
  // read or decompression errors, including a truncated compressed stream.
  virtual size_t read(char* dst, size_t n) = 0;
  // Bytes consumed from the underlying file so far (compressed bytes for .gz / .zst).
  virtual uint64_t file_bytes_read() const = 0;
};
std::unique_ptr<ByteStream> open_byte_stream(const std::string& path, Compression compression);

// One unit of raw input: the whole text of a .txt file, or one non-blank line of a .jsonl
// file (still JSON; extract_document_text turns it into text, typically on a worker thread).
struct RawDocument {
  std::string payload;
  uint32_t source = 0;  // index into the file list
  uint64_t line = 0;    // 1-based line for JSONL, 0 for .txt
  bool json = false;
};

// Streams the documents of a list of files in order.
class CorpusReader {
 public:
  explicit CorpusReader(std::vector<std::string> files);
  ~CorpusReader();
  // Next raw document; false when every file is exhausted.
  bool next(RawDocument* out);
  const std::vector<std::string>& files() const { return files_; }
  uint64_t total_file_bytes() const { return total_bytes_; }
  uint64_t file_bytes_read() const;

 private:
  bool open_next_file();
  std::vector<std::string> files_;
  uint64_t total_bytes_ = 0, done_bytes_ = 0;
  size_t next_file_ = 0;
  int32_t current_ = -1;
  CorpusKind kind_ = CorpusKind::Text;
  std::unique_ptr<ByteStream> stream_;
  std::string buf_;
  size_t buf_pos_ = 0;
  bool stream_eof_ = false;
  uint64_t line_ = 0;
};

// The document text of a raw document: the payload itself for .txt, the string field
// `text_field` of the JSON object for .jsonl. Throws naming file and line for invalid JSON, a
// missing field or a non-string field.
std::string extract_document_text(RawDocument&& doc, const std::string& text_field, const std::string& file);

// A supervised fine-tuning record: the fields `prompt_field` and `completion_field` of a JSONL
// object, both strings (one exchange), or both arrays of strings of the same nonzero length (the
// turns of a conversation: prompt 0, completion 0, prompt 1, completion 1, ...). Throws naming
// file and line for a .txt input, invalid JSON, a missing field or any other shape.
struct PromptCompletion {
  struct Turn {
    std::string prompt, completion;
  };
  std::vector<Turn> turns;
  // UTF-8 bytes of all the completions (the text a model is trained and scored on).
  uint64_t completion_bytes() const {
    uint64_t n = 0;
    for (const Turn& t : turns) n += t.completion.size();
    return n;
  }
};
PromptCompletion extract_prompt_completion(RawDocument&& doc, const std::string& prompt_field,
                                           const std::string& completion_field, const std::string& file);

// A chat record: the field `messages_field` of a JSONL object, a message list as
// parse_chat_messages reads it. Throws naming file and line for a .txt input, invalid JSON, a
// missing field or a malformed message.
std::vector<ChatMessage> extract_chat_messages(RawDocument&& doc, const std::string& messages_field,
                                               const std::string& file);

}  // namespace zaya
