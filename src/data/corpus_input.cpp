// Corpus input: glob expansion, plain / gzip / zstd byte streams, and the document reader.
#include "data/corpus_input.h"

#include <glob.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace zaya {

namespace {

constexpr const char* kCorpusComponent = "data";
constexpr size_t kChunk = 1 << 18;  // 256 KiB reads

[[noreturn]] void fail_in(const std::string& source, const std::string& message, const std::string& hint = {}) {
  fail(kCorpusComponent, source + ": " + message, hint);
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// A buffered file reader counting the bytes it consumed.
class RawFile {
 public:
  explicit RawFile(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "rb");
    if (!f_) fail_in(path, std::string("cannot open: ") + std::strerror(errno));
  }
  ~RawFile() {
    if (f_) std::fclose(f_);
  }
  size_t read(char* dst, size_t n) {
    size_t got = std::fread(dst, 1, n, f_);
    if (got < n && std::ferror(f_)) fail_in(path_, std::string("read error: ") + std::strerror(errno));
    bytes_ += got;
    return got;
  }
  uint64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  uint64_t bytes_ = 0;
};

class PlainStream : public ByteStream {
 public:
  explicit PlainStream(const std::string& path) : file_(path) {}
  size_t read(char* dst, size_t n) override { return file_.read(dst, n); }
  uint64_t file_bytes_read() const override { return file_.bytes(); }

 private:
  RawFile file_;
};

// gzip via zlib's inflate; concatenated members (as `cat a.gz b.gz` makes) are read in turn.
class GzipStream : public ByteStream {
 public:
  explicit GzipStream(const std::string& path) : file_(path), in_(kChunk) {
    std::memset(&z_, 0, sizeof z_);
    if (inflateInit2(&z_, 15 + 16) != Z_OK) fail_in(path, "cannot initialise zlib");
  }
  ~GzipStream() override { inflateEnd(&z_); }
  size_t read(char* dst, size_t n) override {
    z_.next_out = reinterpret_cast<Bytef*>(dst);
    z_.avail_out = uInt(std::min<size_t>(n, 1u << 30));
    const uInt want = z_.avail_out;
    while (z_.avail_out == want) {
      if (z_.avail_in == 0 && !eof_) {
        size_t got = file_.read(in_.data(), in_.size());
        if (got == 0) eof_ = true;
        z_.next_in = reinterpret_cast<Bytef*>(in_.data());
        z_.avail_in = uInt(got);
      }
      if (z_.avail_in == 0 && eof_) {
        if (!member_done_)
          fail_in(file_.path(), "gzip stream is truncated (ended inside a member)", "the file is incomplete");
        break;
      }
      if (member_done_) {  // another member follows
        inflateReset(&z_);
        member_done_ = false;
      }
      int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        member_done_ = true;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        fail_in(file_.path(), std::string("gzip data is corrupt: ") + (z_.msg ? z_.msg : "zlib error " + std::to_string(rc)),
                "the file is damaged or not gzip");
      }
    }
    return want - z_.avail_out;
  }
  uint64_t file_bytes_read() const override { return file_.bytes(); }

 private:
  RawFile file_;
  std::vector<char> in_;
  z_stream z_;
  bool eof_ = false, member_done_ = false;
};

// zstd streaming decompression; concatenated frames are handled by libzstd.
class ZstdStream : public ByteStream {
 public:
  explicit ZstdStream(const std::string& path) : file_(path), in_(ZSTD_DStreamInSize()) {
    ctx_ = ZSTD_createDCtx();
    if (!ctx_) fail_in(path, "cannot create a zstd context");
  }
  ~ZstdStream() override { ZSTD_freeDCtx(ctx_); }
  size_t read(char* dst, size_t n) override {
    ZSTD_outBuffer out{dst, n, 0};
    while (out.pos == 0) {
      if (input_.pos == input_.size && !eof_) {
        size_t got = file_.read(in_.data(), in_.size());
        if (got == 0) eof_ = true;
        input_ = ZSTD_inBuffer{in_.data(), got, 0};
      }
      if (input_.pos == input_.size && eof_) {
        if (pending_ != 0) fail_in(file_.path(), "zstd stream is truncated (ended inside a frame)", "the file is incomplete");
        break;
      }
      size_t rc = ZSTD_decompressStream(ctx_, &out, &input_);
      if (ZSTD_isError(rc))
        fail_in(file_.path(), std::string("zstd data is corrupt: ") + ZSTD_getErrorName(rc),
                "the file is damaged or not zstd");
      pending_ = rc;
    }
    return out.pos;
  }
  uint64_t file_bytes_read() const override { return file_.bytes(); }

 private:
  RawFile file_;
  std::vector<char> in_;
  ZSTD_DCtx* ctx_ = nullptr;
  ZSTD_inBuffer input_{nullptr, 0, 0};
  size_t pending_ = 0;
  bool eof_ = false;
};

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& p : patterns) {
    std::vector<std::string> matches;
    if (has_glob_chars(p)) {
      glob_t g{};
      int rc = ::glob(p.c_str(), GLOB_ERR, nullptr, &g);
      if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) matches.push_back(g.gl_pathv[i]);
      globfree(&g);
      if (rc != 0 && rc != GLOB_NOMATCH)
        fail(kCorpusComponent, "input pattern '" + p + "': cannot read a directory");
      std::sort(matches.begin(), matches.end());
    } else {
      struct stat st {};
      if (::stat(p.c_str(), &st) == 0) matches.push_back(p);
    }
    if (matches.empty())
      fail(kCorpusComponent, "input '" + p + "' matches no file",
           "check the path; quote globs so zaya expands them");
    for (auto& m : matches)
      if (seen.insert(m).second) out.push_back(std::move(m));
  }
  return out;
}

void classify_input(const std::string& path, CorpusKind* kind, Compression* compression) {
  std::string base = path;
  *compression = Compression::None;
  if (base.ends_with(".gz")) {
    *compression = Compression::Gzip;
    base.resize(base.size() - 3);
  } else if (base.ends_with(".zst")) {
    *compression = Compression::Zstd;
    base.resize(base.size() - 4);
  }
  if (base.ends_with(".txt")) {
    *kind = CorpusKind::Text;
  } else if (base.ends_with(".jsonl") || base.ends_with(".ndjson")) {
    *kind = CorpusKind::Jsonl;
  } else {
    fail_in(path, "unknown input type",
            "inputs must be .txt (one document per file) or .jsonl (one JSON document per line), optionally .gz or .zst");
  }
}

std::unique_ptr<ByteStream> open_byte_stream(const std::string& path, Compression compression) {
  switch (compression) {
    case Compression::Gzip:
      return std::make_unique<GzipStream>(path);
    case Compression::Zstd:
      return std::make_unique<ZstdStream>(path);
    case Compression::None:
      break;
  }
  return std::make_unique<PlainStream>(path);
}

// ---------------------------------------------------------------------------------------------
// CorpusReader

CorpusReader::CorpusReader(std::vector<std::string> files) : files_(std::move(files)) {
  for (const auto& f : files_) {
    CorpusKind k;
    Compression c;
    classify_input(f, &k, &c);  // reject unknown types before any work
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0) fail_in(f, std::string("cannot stat: ") + std::strerror(errno));
    total_bytes_ += uint64_t(st.st_size);
  }
}

CorpusReader::~CorpusReader() = default;

uint64_t CorpusReader::file_bytes_read() const { return done_bytes_ + (stream_ ? stream_->file_bytes_read() : 0); }

bool CorpusReader::open_next_file() {
  if (stream_) done_bytes_ += stream_->file_bytes_read();
  stream_.reset();
  if (next_file_ >= files_.size()) return false;
  current_ = int32_t(next_file_++);
  Compression c;
  classify_input(files_[size_t(current_)], &kind_, &c);
  stream_ = open_byte_stream(files_[size_t(current_)], c);
  buf_.clear();
  buf_pos_ = 0;
  stream_eof_ = false;
  line_ = 0;
  return true;
}

bool CorpusReader::next(RawDocument* out) {
  std::vector<char> chunk;
  for (;;) {
    if (!stream_ && !open_next_file()) return false;
    if (kind_ == CorpusKind::Text) {
      // The whole file is one document.
      std::string text;
      chunk.resize(kChunk);
      for (size_t got; (got = stream_->read(chunk.data(), chunk.size())) > 0;) text.append(chunk.data(), got);
      out->payload = std::move(text);
      out->source = uint32_t(current_);
      out->line = 0;
      out->json = false;
      done_bytes_ += stream_->file_bytes_read();
      stream_.reset();
      return true;
    }
    // JSONL: one document per non-blank line.
    for (;;) {
      size_t nl = buf_.find('\n', buf_pos_);
      if (nl == std::string::npos && !stream_eof_) {
        buf_.erase(0, buf_pos_);
        buf_pos_ = 0;
        chunk.resize(kChunk);
        size_t got = stream_->read(chunk.data(), chunk.size());
        if (got == 0)
          stream_eof_ = true;
        else
          buf_.append(chunk.data(), got);
        continue;
      }
      if (nl == std::string::npos && buf_pos_ >= buf_.size()) break;  // file done
      const size_t end = nl == std::string::npos ? buf_.size() : nl;
      std::string line = buf_.substr(buf_pos_, end - buf_pos_);
      buf_pos_ = nl == std::string::npos ? buf_.size() : nl + 1;
      ++line_;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank line
      out->payload = std::move(line);
      out->source = uint32_t(current_);
      out->line = line_;
      out->json = true;
      return true;
    }
    done_bytes_ += stream_->file_bytes_read();
    stream_.reset();
  }
}

namespace {

nlohmann::json parse_jsonl_object(const RawDocument& doc, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(doc.payload);
  } catch (const nlohmann::json::exception& e) {
    fail_in(where, std::string("line is not valid JSON: ") + e.what(), "JSONL needs one JSON object per line");
  }
  if (!j.is_object()) fail_in(where, "line is not a JSON object");
  return j;
}

nlohmann::json& record_field(nlohmann::json& j, const std::string& field, const std::string& where,
                             const std::string& hint) {
  auto it = j.find(field);
  if (it == j.end()) fail_in(where, "object has no field '" + field + "'", hint);
  return *it;
}

std::string take_string_field(nlohmann::json& j, const std::string& field, const std::string& where,
                              const std::string& hint) {
  nlohmann::json* it = &record_field(j, field, where, hint);
  if (!it->is_string()) fail_in(where, "field '" + field + "' is not a string");
  return std::move(it->get_ref<std::string&>());
}

}  // namespace

std::string extract_document_text(RawDocument&& doc, const std::string& text_field, const std::string& file) {
  if (!doc.json) return std::move(doc.payload);
  const std::string where = file + ":" + std::to_string(doc.line);
  nlohmann::json j = parse_jsonl_object(doc, where);
  return take_string_field(j, text_field, where, "pick the text field with --text-field");
}

PromptCompletion extract_prompt_completion(RawDocument&& doc, const std::string& prompt_field,
                                           const std::string& completion_field, const std::string& file) {
  if (!doc.json)
    fail_in(file, "is a text file, but prompt/completion data needs JSONL records",
            "write one JSON object per line with the prompt and completion fields");
  const std::string where = file + ":" + std::to_string(doc.line);
  nlohmann::json j = parse_jsonl_object(doc, where);
  ZAYA_CHECK(prompt_field != completion_field, "the prompt and completion fields must differ");
  PromptCompletion out;
  nlohmann::json* p = &record_field(j, prompt_field, where, "pick the prompt field with --prompt-field");
  nlohmann::json* c =
      &record_field(j, completion_field, where, "pick the completion field with --completion-field");
  if (p->is_string() && c->is_string()) {
    out.turns.push_back({std::move(p->get_ref<std::string&>()), std::move(c->get_ref<std::string&>())});
    return out;
  }
  const std::string shape = "fields '" + prompt_field + "' and '" + completion_field +
                            "' must both be strings, or both arrays of strings of the same length (a "
                            "conversation's turns)";
  if (!p->is_array() || !c->is_array() || p->size() != c->size() || p->empty())
    fail_in(where, shape + "; found " + std::string(p->type_name()) +
                       (p->is_array() ? " of " + std::to_string(p->size()) : "") + " and " + c->type_name() +
                       (c->is_array() ? " of " + std::to_string(c->size()) : ""));
  for (size_t i = 0; i < p->size(); ++i) {
    if (!(*p)[i].is_string() || !(*c)[i].is_string())
      fail_in(where, shape + "; turn " + std::to_string(i + 1) + " of " + std::to_string(p->size()) +
                         " is not a pair of strings");
    out.turns.push_back(
        {std::move((*p)[i].get_ref<std::string&>()), std::move((*c)[i].get_ref<std::string&>())});
  }
  return out;
}

std::vector<ChatMessage> extract_chat_messages(RawDocument&& doc, const std::string& messages_field,
                                               const std::string& file) {
  if (!doc.json)
    fail_in(file, "is a text file, but chat data needs JSONL records",
            "write one JSON object per line with the message list in the messages field");
  const std::string where = file + ":" + std::to_string(doc.line);
  nlohmann::json j = parse_jsonl_object(doc, where);
  const nlohmann::json& field =
      record_field(j, messages_field, where, "pick the message list with --messages-field");
  std::string error;
  std::vector<ChatMessage> messages = parse_chat_messages(field, messages_field, &error);
  if (!error.empty()) fail_in(where, error);
  return messages;
}

}  // namespace zaya
