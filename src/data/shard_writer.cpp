// Shard writer, manifest writer and the `zaya data prepare` pipeline (see shard_writer.h).
#include "data/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/checksum.h"
#include "core/error.h"
#include "data/corpus_input.h"
#include "data/document_tokens.h"
#include "data/tokenizer.h"

namespace zaya {

namespace fs = std::filesystem;

namespace {

constexpr const char* kShardWriteComponent = "shards";
constexpr size_t kWriteBuffer = 4 << 20;

[[noreturn]] void fail_writing(const std::string& source, const std::string& message,
                               const std::string& hint = {}) {
  fail(kShardWriteComponent, source + ": " + message, hint);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

void write_fully(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_writing(path, std::string("write failed: ") + std::strerror(errno));
    }
    if (w == 0) fail_writing(path, "short write");
    p += w;
    n -= size_t(w);
  }
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint32_t tokenizer_file_hash(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    file.clear();
    for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
      fs::path p = fs::path(path) / name;
      if (fs::is_regular_file(p, ec)) {
        file = p.string();
        break;
      }
    }
    if (file.empty()) fail("tokenizer", path + ": directory has neither tokenizer.json nor tokenizer.model");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("tokenizer", file + ": cannot open: " + std::strerror(errno));
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    crc = crc32c(crc, buf.data(), size_t(in.gcount()));
  }
  if (in.bad()) fail("tokenizer", file + ": read error");
  return crc;
}

bool is_val_document(uint64_t index, double val_fraction) {
  if (val_fraction <= 0) return false;
  if (val_fraction >= 1) return true;
  // 53 high bits as a double in [0, 1): exact, platform-independent.
  return double(splitmix64(index) >> 11) * 0x1.0p-53 < val_fraction;
}

// ---------------------------------------------------------------------------------------------
// ShardWriter

ShardWriter::ShardWriter(Options options) : opt_(std::move(options)) {
  if (opt_.vocab_size == 0 || opt_.vocab_size > (uint64_t(1) << 32))
    fail(kShardWriteComponent, "vocab size " + std::to_string(opt_.vocab_size) + " is outside [1, 2^32]");
  buf_.reserve(kWriteBuffer);
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void ShardWriter::open_shard() {
  char name[64];
  std::snprintf(name, sizeof name, "%s-%05zu%s", opt_.prefix.c_str(), split_.shards.size(), kShardExtension);
  path_ = join_path(opt_.dir, name);
  tmp_path_ = path_ + ".tmp";
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_writing(tmp_path_, std::string("cannot create: ") + std::strerror(errno));
  uint8_t zero[kShardHeaderBytes] = {};
  write_fully(fd_, zero, sizeof zero, tmp_path_);  // the header is written last
  shard_tokens_ = 0;
  tokens_crc_ = 0;
  index_.assign(1, 0);
  mask_.clear();
  sources_.clear();
  buf_.clear();
}

void ShardWriter::add_document(std::span<const uint32_t> tokens, const std::string& source,
                               std::span<const uint8_t> mask) {
  if (opt_.loss_mask ? mask.size() != tokens.size() : !mask.empty())
    fail(kShardWriteComponent, "document from " + source + ": a loss mask of " + std::to_string(mask.size()) +
                                   " bytes for " + std::to_string(tokens.size()) +
                                   " tokens, in a split written " + (opt_.loss_mask ? "with" : "without") +
                                   " loss masks");
  for (uint8_t m : mask)
    if (m > 1)
      fail(kShardWriteComponent,
           "document from " + source + ": loss mask byte " + std::to_string(m) + " is not 0 or 1");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (uint64_t(tokens[i]) >= opt_.vocab_size)
      fail(kShardWriteComponent, "document from " + source + ": token id " + std::to_string(tokens[i]) +
                                     " is not below the vocab size " + std::to_string(opt_.vocab_size));
  if (fd_ >= 0 && index_.size() > 1 &&
      shard_layout(shard_tokens_ + tokens.size(), index_.size(), opt_.loss_mask).file_size >
          opt_.target_bytes)
    close_shard();
  if (fd_ < 0) open_shard();
  const size_t nbytes = tokens.size() * 4;
  tokens_crc_ = crc32c(tokens_crc_, tokens.data(), nbytes);
  if (buf_.size() + nbytes > kWriteBuffer) {
    write_fully(fd_, buf_.data(), buf_.size(), tmp_path_);
    buf_.clear();
  }
  if (nbytes >= kWriteBuffer) {
    write_fully(fd_, tokens.data(), nbytes, tmp_path_);
  } else {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(tokens.data());
    buf_.insert(buf_.end(), p, p + nbytes);
  }
  shard_tokens_ += tokens.size();
  index_.push_back(shard_tokens_);
  mask_.insert(mask_.end(), mask.begin(), mask.end());
  if (sources_.empty() || sources_.back() != source) sources_.push_back(source);
}

void ShardWriter::close_shard() {
  write_fully(fd_, buf_.data(), buf_.size(), tmp_path_);
  buf_.clear();
  ShardHeader h = shard_layout(shard_tokens_, index_.size() - 1, opt_.loss_mask);
  h.tokenizer_hash = opt_.tokenizer_hash;
  h.vocab_size = opt_.vocab_size;
  h.tokens_crc = tokens_crc_;
  const size_t pad = size_t(h.index_offset - h.tokens_offset - h.tokens_bytes);
  const uint8_t zeros[8] = {};
  write_fully(fd_, zeros, pad, tmp_path_);
  const size_t index_bytes = index_.size() * 8;
  h.index_crc = crc32c(index_.data(), index_bytes);
  write_fully(fd_, index_.data(), index_bytes, tmp_path_);
  if (opt_.loss_mask) {
    h.mask_crc = crc32c(mask_.data(), mask_.size());
    write_fully(fd_, mask_.data(), mask_.size(), tmp_path_);
  }
  uint8_t header[kShardHeaderBytes];
  encode_shard_header(h, header, [](const void* d, size_t n) { return crc32c(d, n); });
  if (::pwrite(fd_, header, sizeof header, 0) != ssize_t(sizeof header))
    fail_writing(tmp_path_, std::string("cannot write the header: ") + std::strerror(errno));
  // Whole-file CRC from the pieces, without re-reading the file.
  uint32_t file_crc = crc32c(header, sizeof header);
  file_crc = crc32c_combine(file_crc, h.tokens_crc, h.tokens_bytes);
  file_crc = crc32c(file_crc, zeros, pad);
  file_crc = crc32c_combine(file_crc, h.index_crc, index_bytes);
  if (opt_.loss_mask) file_crc = crc32c_combine(file_crc, h.mask_crc, h.mask_bytes);
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail_writing(tmp_path_, std::string("close failed: ") + std::strerror(errno));
  }
  fd_ = -1;
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    fail_writing(path_, "cannot rename " + tmp_path_ + ": " + std::strerror(errno));
  ManifestShard e;
  e.file = fs::path(path_).filename().string();
  e.bytes = h.file_size;
  e.checksum = file_crc;
  e.tokens = h.token_count;
  e.documents = h.document_count;
  e.sources = sources_;
  split_.tokens += e.tokens;
  split_.documents += e.documents;
  split_.shards.push_back(std::move(e));
}

ManifestSplit ShardWriter::finish() {
  if (fd_ >= 0) close_shard();
  return split_;
}

// ---------------------------------------------------------------------------------------------
// Manifest

void write_manifest(const std::string& dir, const Manifest& m) {
  using oj = nlohmann::ordered_json;
  oj j = oj::object();
  j["format"] = kManifestFormat;
  j["format_version"] = m.version;
  j["tokenizer"] = {{"path", m.tokenizer_path},
                    {"crc32c", checksum_hex(m.tokenizer_hash)},
                    {"vocab_size", m.vocab_size},
                    {"eos_id", m.eos_id}};
  j["text_field"] = m.text_field;
  if (m.loss_mask && !m.messages_field.empty())
    j["loss_mask"] = {{"messages_field", m.messages_field}, {"chat_template", m.chat_template}};
  else if (m.loss_mask)
    j["loss_mask"] = {{"prompt_field", m.prompt_field}, {"completion_field", m.completion_field}};
  j["val_fraction"] = m.val_fraction;
  j["split_rule"] = "document n (0-based, input order) is val iff splitmix64(n) >> 11 < val_fraction * 2^53";
  j["shard_bytes"] = m.shard_bytes;
  oj sources = oj::array();
  for (const auto& s : m.sources) sources.push_back({{"path", s.path}, {"documents", s.documents}, {"skipped", s.skipped}});
  j["sources"] = std::move(sources);
  oj splits = oj::object();
  for (const auto& [name, s] : m.splits) {  // std::map: sorted, deterministic
    oj shards = oj::array();
    for (const auto& e : s.shards)
      shards.push_back({{"file", e.file},
                        {"bytes", e.bytes},
                        {"checksum", checksum_hex(e.checksum)},
                        {"tokens", e.tokens},
                        {"documents", e.documents},
                        {"sources", e.sources}});
    splits[name] = {{"tokens", s.tokens}, {"documents", s.documents}, {"shards", std::move(shards)}};
  }
  j["splits"] = std::move(splits);
  const std::string path = join_path(dir, kManifestName);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail_writing(tmp, std::string("cannot create: ") + std::strerror(errno));
    out << j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    if (!out) fail_writing(tmp, "write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail_writing(path, "cannot rename " + tmp + ": " + std::strerror(errno));
}

// ---------------------------------------------------------------------------------------------
// The prepare pipeline

namespace {

struct Batch {
  uint64_t first_doc = 0;
  uint64_t input_bytes_after = 0;  // input file bytes consumed once this batch was read
  std::vector<RawDocument> docs;
  // Results: tokens of all kept documents back to back; per document its end in `tokens`
  // (equal to the previous end for a skipped, empty document).
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> ends;
  std::vector<uint8_t> mask;  // per token of `tokens` (supervised fine-tuning data only)
  std::vector<uint32_t> sources;
  std::exception_ptr error;
  bool done = false;
};

// Tokeniser threads over a queue of batches; results are consumed in submission order.
class TokenizerPool {
 public:
  TokenizerPool(int threads, const DocumentBuilder& builder, const std::vector<std::string>& files)
      : builder_(builder), files_(files) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  ~TokenizerPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  void submit(std::shared_ptr<Batch> b) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(b));
    }
    work_cv_.notify_one();
  }
  void wait(const Batch& b) {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return b.done; });
  }

 private:
  void run() {
    for (;;) {
      std::shared_ptr<Batch> b;
      {
        std::unique_lock<std::mutex> lk(mu_);
        work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        b = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        process(*b);
      } catch (...) {
        b->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        b->done = true;
      }
      done_cv_.notify_all();
    }
  }
  void process(Batch& b) {
    b.ends.reserve(b.docs.size());
    b.sources.reserve(b.docs.size());
    for (RawDocument& d : b.docs) {
      const uint32_t source = d.source;
      b.sources.push_back(source);
      // A record that is skipped (no text, no completion, no reply) appends nothing.
      builder_.append(std::move(d), files_[source], b.tokens, b.mask);
      b.ends.push_back(b.tokens.size());
    }
    b.docs.clear();
    b.docs.shrink_to_fit();
  }

  const DocumentBuilder& builder_;
  const std::vector<std::string>& files_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::shared_ptr<Batch>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Names prepare writes: (train|val)-NNNNN.zshard and manifest.json, each optionally + ".tmp".
bool is_prepare_output(std::string name) {
  if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) name.resize(name.size() - 4);
  if (name == kManifestName) return true;
  for (const std::string prefix : {"train-", "val-"}) {
    const std::string ext = kShardExtension;
    if (name.size() != prefix.size() + 5 + ext.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(prefix.size() + 5, ext.size(), ext) != 0)
      continue;
    bool digits = true;
    for (size_t i = prefix.size(); i < prefix.size() + 5; ++i) digits = digits && name[i] >= '0' && name[i] <= '9';
    if (digits) return true;
  }
  return false;
}

void remove_stale_outputs(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (is_prepare_output(entry.path().filename().string())) doomed.push_back(entry.path());
  for (const auto& p : doomed)
    if (!fs::remove(p, ec) && ec)
      fail_writing(p.string(), "cannot remove the output of an earlier run: " + ec.message());
}

}  // namespace

PrepareResult prepare_shards(const PrepareOptions& opt) {
  if (opt.val_fraction < 0 || opt.val_fraction > 1)
    fail(kShardWriteComponent, "--val-fraction " + std::to_string(opt.val_fraction) + " is outside [0, 1]");
  if (opt.shard_bytes < kShardHeaderBytes + 16)
    fail(kShardWriteComponent, "shard size " + std::to_string(opt.shard_bytes) + " bytes is too small");
  if (opt.out_dir.empty()) fail(kShardWriteComponent, "no output directory given", "pass --out DIR");
  if (opt.inputs.empty()) fail(kShardWriteComponent, "no input files given", "pass --input FILES_OR_GLOBS");
  const RecordFields fields{opt.text_field, opt.prompt_field, opt.completion_field, opt.messages_field,
                            opt.chat_template};
  check_record_fields(fields, kShardWriteComponent);
  const bool sft = fields.supervised();

  auto tok = load_tokenizer(opt.tokenizer);
  const uint32_t tok_hash = tokenizer_file_hash(opt.tokenizer);
  const int64_t eos = tok->eos_id();
  if (eos < 0)
    fail("tokenizer", opt.tokenizer + ": has no EOS token; shards separate documents with EOS",
         "use a tokenizer with an end-of-sequence token");
  const uint64_t vocab = uint64_t(tok->vocab_size());
  if (uint64_t(eos) >= vocab) fail("tokenizer", opt.tokenizer + ": EOS id is outside the vocabulary");
  const DocumentBuilder builder(*tok, fields, uint32_t(eos), vocab);  // binds the chat template

  const std::vector<std::string> files = expand_inputs(opt.inputs);
  CorpusReader reader(files);

  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) fail_writing(opt.out_dir, "cannot create the output directory: " + ec.message());
  remove_stale_outputs(opt.out_dir);

  Manifest m;
  m.tokenizer_path = opt.tokenizer;
  m.tokenizer_hash = tok_hash;
  m.vocab_size = vocab;
  m.eos_id = eos;
  m.text_field = opt.text_field;
  m.val_fraction = opt.val_fraction;
  m.shard_bytes = opt.shard_bytes;
  m.loss_mask = sft;
  m.prompt_field = opt.prompt_field;
  m.completion_field = opt.completion_field;
  m.messages_field = opt.messages_field;
  m.chat_template = opt.chat_template;
  for (const auto& f : files) m.sources.push_back({f, 0, 0});

  ShardWriter::Options wo;
  wo.dir = opt.out_dir;
  wo.target_bytes = opt.shard_bytes;
  wo.tokenizer_hash = tok_hash;
  wo.vocab_size = vocab;
  wo.loss_mask = sft;
  wo.prefix = "train";
  ShardWriter train(wo);
  wo.prefix = "val";
  std::unique_ptr<ShardWriter> val;
  if (opt.val_fraction > 0) val = std::make_unique<ShardWriter>(wo);

  int threads = opt.threads > 0 ? opt.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const size_t max_inflight = size_t(threads) * 2 + 2;
  PrepareResult result;
  uint64_t bytes_written = 0;  // input bytes whose documents are in the shards (progress)
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  auto report = [&](bool done) {
    if (!opt.progress) return;
    auto now = std::chrono::steady_clock::now();
    if (!done && now - last_report < std::chrono::milliseconds(100)) return;
    last_report = now;
    PrepareProgress p;
    p.bytes_read = bytes_written;
    p.bytes_total = reader.total_file_bytes();
    p.documents = result.documents;
    p.tokens = result.tokens;
    p.seconds = std::chrono::duration<double>(now - t0).count();
    p.done = done;
    opt.progress(p);
  };

  {
    TokenizerPool pool(threads, builder, files);
    std::deque<std::shared_ptr<Batch>> inflight;
    uint64_t next_doc = 0;
    bool eof = false;
    for (;;) {
      while (!eof && inflight.size() < max_inflight) {
        auto b = std::make_shared<Batch>();
        b->first_doc = next_doc;
        size_t bytes = 0;
        RawDocument d;
        while (bytes < opt.batch_bytes && b->docs.size() < 4096) {
          if (!reader.next(&d)) {
            eof = true;
            break;
          }
          bytes += d.payload.size();
          b->docs.push_back(std::move(d));
          d = RawDocument{};
        }
        if (b->docs.empty()) break;
        b->input_bytes_after = reader.file_bytes_read();
        next_doc += b->docs.size();
        inflight.push_back(b);
        pool.submit(std::move(b));
      }
      if (inflight.empty()) break;
      std::shared_ptr<Batch> b = std::move(inflight.front());
      inflight.pop_front();
      pool.wait(*b);
      if (b->error) std::rethrow_exception(b->error);  // the pool's destructor stops the workers
      uint64_t begin = 0;
      for (size_t i = 0; i < b->ends.size(); ++i) {
        const uint64_t end = b->ends[i];
        ManifestSource& src = m.sources[b->sources[i]];
        ++src.documents;
        if (end == begin) {
          ++src.skipped;
          ++result.skipped;
          continue;
        }
        std::span<const uint32_t> doc(b->tokens.data() + begin, size_t(end - begin));
        std::span<const uint8_t> mask;
        if (sft) {
          mask = std::span<const uint8_t>(b->mask.data() + begin, size_t(end - begin));
          for (uint8_t v : mask) result.target_tokens += v;
        }
        ShardWriter& w = val && is_val_document(b->first_doc + i, opt.val_fraction) ? *val : train;
        w.add_document(doc, src.path, mask);
        ++result.documents;
        result.tokens += doc.size();
        begin = end;
      }
      bytes_written = b->input_bytes_after;
      report(false);
    }
  }

  m.splits["train"] = train.finish();
  if (val) m.splits["val"] = val->finish();
  write_manifest(opt.out_dir, m);
  report(true);
  result.manifest = std::move(m);
  return result;
}

}  // namespace zaya
