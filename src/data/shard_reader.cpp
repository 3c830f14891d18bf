// Shard reader: validation of the header, sections and document index (parse_shard), the
// mmap'd ShardReader, manifest.json parsing and the multi-shard ShardDataset.
#include "data/shard_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ckpt/checksum.h"
#include "core/error.h"

namespace zaya {

namespace {

constexpr const char* kShardReadComponent = "shards";

[[noreturn]] void fail_in(const std::string& source, const std::string& message, const std::string& hint = {}) {
  fail(kShardReadComponent, source + ": " + message, hint);
}

std::string hex(uint32_t v) { return checksum_hex(v); }

const char* kTruncatedHint = "the file is truncated or corrupt; re-run `zaya data prepare`";
const char* kCorruptHint = "the file is corrupt; re-run `zaya data prepare`";

}  // namespace

ShardHeader parse_shard(const uint8_t* bytes, size_t size, const std::string& source, ShardVerify verify) {
  using namespace shard_field;
  if (size >= 8 && std::memcmp(bytes, kShardMagic, 8) != 0)
    fail_in(source, "bad magic: the first 8 bytes are not \"ZAYASHRD\"",
            "this is not a zaya token shard (.zshard); create shards with `zaya data prepare`");
  if (size < kShardHeaderBytes)
    fail_in(source,
            "file is " + std::to_string(size) + " bytes, too short for the " +
                std::to_string(kShardHeaderBytes) + "-byte header",
            kTruncatedHint);
  const ShardHeader h = decode_shard_header_unchecked(bytes);
  if (h.version < kShardVersionNoMask || h.version > kShardVersion)
    fail_in(source,
            "format version " + std::to_string(h.version) + " is not supported (this zaya reads versions " +
                std::to_string(kShardVersionNoMask) + " to " + std::to_string(kShardVersion) + ")",
            h.version > kShardVersion
                ? "the shard was written by a newer zaya; upgrade or re-run `zaya data prepare`"
                : kCorruptHint);
  if (h.header_bytes != kShardHeaderBytes)
    fail_in(source,
            "header size field is " + std::to_string(h.header_bytes) + ", expected " +
                std::to_string(kShardHeaderBytes),
            kCorruptHint);
  const uint32_t stored_crc = shard_detail::load_u32(bytes + kHeaderCrc);
  const uint32_t actual_crc = crc32c(bytes, kHeaderCrc);
  if (stored_crc != actual_crc)
    fail_in(source, "header checksum mismatch: stored " + hex(stored_crc) + ", computed " + hex(actual_crc), kCorruptHint);
  // Each shard has one encoding: version 1 has no mask and flags 0 (bytes 96..123 reserved);
  // version 2 exists only for the mask, so it has flag bit 0 and nothing else.
  const uint32_t expected_flags = h.version >= 2 ? kShardFlagLossMask : 0;
  if (h.flags != expected_flags)
    fail_in(source,
            "header flags are " + std::to_string(h.flags) + ", expected " + std::to_string(expected_flags) +
                " in format version " + std::to_string(h.version) +
                (h.version >= 2 ? " (bit 0: the loss mask that version 2 adds)" : ""),
            kCorruptHint);
  for (size_t i = h.has_loss_mask() ? kReserved : kMaskOffset; i < kHeaderCrc; ++i)
    if (bytes[i] != 0)
      fail_in(source, "reserved header byte " + std::to_string(i) + " is not zero", kCorruptHint);
  if (h.vocab_size == 0 || h.vocab_size > (uint64_t(1) << 32))
    fail_in(source,
            "vocab size " + std::to_string(h.vocab_size) + " is outside [1, 2^32] (token ids are u32)",
            kCorruptHint);

  // Section bounds: each checked against the real size before anything is read from it.
  if (h.file_size != size)
    fail_in(source,
            "header records file size " + std::to_string(h.file_size) + " bytes, but the file is " +
                std::to_string(size) + " bytes",
            kTruncatedHint);
  if (h.token_count > (UINT64_MAX >> 2) || h.tokens_bytes != h.token_count * 4)
    fail_in(source,
            "tokens section size " + std::to_string(h.tokens_bytes) + " bytes does not match token count " +
                std::to_string(h.token_count) + " (4 bytes per token)",
            kCorruptHint);
  if (h.tokens_offset != kShardHeaderBytes)
    fail_in(source,
            "tokens section offset " + std::to_string(h.tokens_offset) + ", expected " +
                std::to_string(kShardHeaderBytes),
            kCorruptHint);
  if (h.tokens_bytes > size - h.tokens_offset)
    fail_in(source,
            "tokens section [" + std::to_string(h.tokens_offset) + ", " +
                std::to_string(h.tokens_offset + h.tokens_bytes) + ") extends past the end of the file (" +
                std::to_string(size) + " bytes)",
            kTruncatedHint);
  if (h.document_count >= (UINT64_MAX >> 3) || h.index_bytes != (h.document_count + 1) * 8)
    fail_in(source,
            "index section size " + std::to_string(h.index_bytes) + " bytes does not match document count " +
                std::to_string(h.document_count) + " (8 bytes per entry, documents + 1 entries)",
            kCorruptHint);
  if (h.index_offset > size || h.index_bytes > size - h.index_offset)
    fail_in(source,
            "index section at offset " + std::to_string(h.index_offset) + " (" +
                std::to_string(h.index_bytes) + " bytes) lies outside the file (" + std::to_string(size) +
                " bytes)",
            kTruncatedHint);
  const uint64_t tokens_end = h.tokens_offset + h.tokens_bytes;
  const uint64_t expect_index = (tokens_end + 7) / 8 * 8;
  if (h.index_offset != expect_index)
    fail_in(source,
            "index section offset " + std::to_string(h.index_offset) + ", expected " +
                std::to_string(expect_index) + " (the tokens section ends at " + std::to_string(tokens_end) +
                ")",
            kCorruptHint);
  const uint64_t index_end = h.index_offset + h.index_bytes;
  if (!h.has_loss_mask() && index_end != size)
    fail_in(source,
            "index section ends at " + std::to_string(index_end) + ", but the file is " +
                std::to_string(size) + " bytes",
            kCorruptHint);
  if (h.has_loss_mask()) {
    if (h.mask_offset != index_end)
      fail_in(source,
              "loss mask section offset " + std::to_string(h.mask_offset) + ", expected " +
                  std::to_string(index_end) + " (the index section ends there)",
              kCorruptHint);
    if (h.mask_bytes != h.token_count)
      fail_in(source,
              "loss mask section size " + std::to_string(h.mask_bytes) +
                  " bytes does not match token count " + std::to_string(h.token_count) +
                  " (1 byte per token)",
              kCorruptHint);
    if (h.mask_offset > size || h.mask_bytes != size - h.mask_offset)
      fail_in(source,
              "loss mask section [" + std::to_string(h.mask_offset) + ", " +
                  std::to_string(h.mask_offset + h.mask_bytes) + ") does not end at the end of the file (" +
                  std::to_string(size) + " bytes)",
              kTruncatedHint);
  }
  for (uint64_t i = tokens_end; i < h.index_offset; ++i)
    if (bytes[i] != 0)
      fail_in(source, "padding byte " + std::to_string(i) + " after the tokens section is not zero",
              kCorruptHint);

  // Document index: first 0, monotone, in range, last = token count.
  const uint8_t* index = bytes + h.index_offset;
  const uint64_t entries = h.document_count + 1;
  uint64_t prev = 0;
  for (uint64_t i = 0; i < entries; ++i) {
    const uint64_t v = shard_detail::load_u64(index + i * 8);
    if (v > h.token_count)
      fail_in(source,
              "document index entry " + std::to_string(i) + " (offset " + std::to_string(v) +
                  ") exceeds token count " + std::to_string(h.token_count),
              kCorruptHint);
    if (i == 0 && v != 0)
      fail_in(source, "document index entry 0 (offset " + std::to_string(v) + ") is not 0", kCorruptHint);
    if (v < prev)
      fail_in(source,
              "document index entry " + std::to_string(i) + " (offset " + std::to_string(v) +
                  ") is less than entry " + std::to_string(i - 1) + " (offset " + std::to_string(prev) +
                  "): the index is not monotone",
              kCorruptHint);
    prev = v;
  }
  if (prev != h.token_count)
    fail_in(source,
            "document index entry " + std::to_string(h.document_count) + " (offset " + std::to_string(prev) +
                ") is not the token count " + std::to_string(h.token_count),
            kCorruptHint);

  if (verify == ShardVerify::Full) {
    const uint32_t tc = crc32c(bytes + h.tokens_offset, size_t(h.tokens_bytes));
    if (tc != h.tokens_crc)
      fail_in(source, "tokens section checksum mismatch: header " + hex(h.tokens_crc) + ", computed " + hex(tc),
              kCorruptHint);
    const uint32_t ic = crc32c(index, size_t(h.index_bytes));
    if (ic != h.index_crc)
      fail_in(source, "index section checksum mismatch: header " + hex(h.index_crc) + ", computed " + hex(ic),
              kCorruptHint);
    if (h.has_loss_mask()) {
      const uint8_t* mask = bytes + h.mask_offset;
      const uint32_t mc = crc32c(mask, size_t(h.mask_bytes));
      if (mc != h.mask_crc)
        fail_in(source,
                "loss mask section checksum mismatch: header " + hex(h.mask_crc) + ", computed " + hex(mc),
                kCorruptHint);
      for (uint64_t i = 0; i < h.mask_bytes; ++i)
        if (mask[i] > 1)
          fail_in(source,
                  "loss mask byte of token " + std::to_string(i) + " is " + std::to_string(mask[i]) +
                      ", expected 0 or 1",
                  kCorruptHint);
    }
    // Branch-free max over blocks; locate the offender only on failure.
    const uint8_t* tok = bytes + h.tokens_offset;
    const uint64_t limit = h.vocab_size;
    constexpr uint64_t kBlock = 4096;
    for (uint64_t b = 0; b < h.token_count; b += kBlock) {
      const uint64_t e = std::min(h.token_count, b + kBlock);
      uint32_t mx = 0;
      for (uint64_t i = b; i < e; ++i) mx = std::max(mx, shard_detail::load_u32(tok + i * 4));
      if (uint64_t(mx) >= limit) {
        for (uint64_t i = b; i < e; ++i) {
          const uint32_t t = shard_detail::load_u32(tok + i * 4);
          if (uint64_t(t) >= limit)
            fail_in(source,
                    "token " + std::to_string(i) + " has id " + std::to_string(t) +
                        ", not below the vocab size " + std::to_string(limit),
                    kCorruptHint);
        }
      }
    }
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// ShardReader

std::unique_ptr<ShardReader> ShardReader::open(const std::string& path, ShardVerify verify) {
  std::unique_ptr<ShardReader> r(new ShardReader());
  r->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_in(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string err = std::strerror(errno);
    ::close(fd);
    fail_in(path, "cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_in(path, "is not a regular file");
  }
  r->size_ = size_t(st.st_size);
  if (r->size_ > 0) {
    void* p = ::mmap(nullptr, r->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string err = std::strerror(errno);
      ::close(fd);
      fail_in(path, "cannot mmap " + std::to_string(r->size_) + " bytes: " + err);
    }
    r->base_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  r->header_ = parse_shard(r->base_, r->size_, path, verify);  // on failure the unique_ptr unmaps
  // mmap is page-aligned and the sections are 4- and 8-aligned, so typed access is valid.
  r->tokens_ = reinterpret_cast<const uint32_t*>(r->base_ + r->header_.tokens_offset);
  r->index_ = reinterpret_cast<const uint64_t*>(r->base_ + r->header_.index_offset);
  if (r->header_.has_loss_mask()) r->mask_ = r->base_ + r->header_.mask_offset;
  return r;
}

ShardReader::~ShardReader() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

std::span<const uint32_t> ShardReader::document(uint64_t d) const {
  if (d >= header_.document_count)
    fail_in(path_, "document " + std::to_string(d) + " requested, but the shard has " +
                       std::to_string(header_.document_count));
  return {tokens_ + index_[d], size_t(index_[d + 1] - index_[d])};
}

std::span<const uint32_t> ShardReader::tokens(uint64_t offset, uint64_t n) const {
  if (offset > header_.token_count || n > header_.token_count - offset)
    fail_in(path_, "tokens [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                       ") requested, but the shard has " + std::to_string(header_.token_count));
  return {tokens_ + offset, size_t(n)};
}

uint32_t ShardReader::file_crc() const { return crc32c(base_, size_); }

// ---------------------------------------------------------------------------------------------
// Manifest

namespace {

using nlohmann::json;

std::string shard_dir_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool plain_manifest_entry(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (c == '/' || c == '\\' || c == '\0') return false;
  return true;
}

struct ManifestParser {
  std::string path;

  const json& field(const json& obj, const char* key, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail_in(path, "missing field '" + where + key + "'");
    return *it;
  }
  uint64_t u64(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
    fail_in(path, "field '" + where + key + "' must be a non-negative integer, found " + v.dump());
  }
  std::string str(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_string()) fail_in(path, "field '" + where + key + "' must be a string, found " + v.dump());
    return v.get<std::string>();
  }
  uint32_t crc(const json& obj, const char* key, const std::string& where) const {
    uint32_t c = 0;
    if (!parse_checksum_hex(str(obj, key, where), &c))
      fail_in(path, "field '" + where + key + "' must be 8 hex digits (CRC-32C)");
    return c;
  }
  const json& object(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_object()) fail_in(path, "field '" + where + key + "' must be an object");
    return v;
  }
  const json& array(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_array()) fail_in(path, "field '" + where + key + "' must be an array");
    return v;
  }
};

}  // namespace

Manifest read_manifest(const std::string& dir) {
  const std::string path = shard_dir_path(dir, kManifestName);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(kShardReadComponent, path + ": cannot open: " + std::strerror(errno),
         "pass a directory written by `zaya data prepare`");
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    fail_in(path, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail_in(path, "expected a JSON object");
  ManifestParser p{path};
  Manifest m;
  if (p.str(j, "format", "") != kManifestFormat)
    fail_in(path, "field 'format' is " + j["format"].dump() + ", expected \"" + kManifestFormat + "\"");
  m.version = uint32_t(std::min<uint64_t>(p.u64(j, "format_version", ""), UINT32_MAX));
  if (m.version != kManifestVersion)
    fail_in(path, "field 'format_version' is " + std::to_string(m.version) + ", this zaya reads version " +
                      std::to_string(kManifestVersion));
  const json& tok = p.object(j, "tokenizer", "");
  m.tokenizer_path = p.str(tok, "path", "tokenizer.");
  m.tokenizer_hash = p.crc(tok, "crc32c", "tokenizer.");
  m.vocab_size = p.u64(tok, "vocab_size", "tokenizer.");
  const json& eos = p.field(tok, "eos_id", "tokenizer.");
  if (!eos.is_number_integer()) fail_in(path, "field 'tokenizer.eos_id' must be an integer");
  m.eos_id = eos.get<int64_t>();
  m.text_field = p.str(j, "text_field", "");
  const json& vf = p.field(j, "val_fraction", "");
  if (!vf.is_number() || vf.get<double>() < 0 || vf.get<double>() > 1)
    fail_in(path, "field 'val_fraction' must be a number in [0, 1]");
  m.val_fraction = vf.get<double>();
  m.shard_bytes = p.u64(j, "shard_bytes", "");
  if (j.contains("loss_mask")) {  // written only for supervised fine-tuning data
    const json& lm = p.object(j, "loss_mask", "");
    m.loss_mask = true;
    if (lm.contains("messages_field")) {
      m.messages_field = p.str(lm, "messages_field", "loss_mask.");
      m.chat_template = p.str(lm, "chat_template", "loss_mask.");
    } else {
      m.prompt_field = p.str(lm, "prompt_field", "loss_mask.");
      m.completion_field = p.str(lm, "completion_field", "loss_mask.");
    }
  }
  const json& sources = p.array(j, "sources", "");
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string where = "sources[" + std::to_string(i) + "].";
    if (!sources[i].is_object())
      fail_in(path, "field 'sources[" + std::to_string(i) + "]' must be an object");
    m.sources.push_back({p.str(sources[i], "path", where), p.u64(sources[i], "documents", where),
                         p.u64(sources[i], "skipped", where)});
  }
  const json& splits = p.object(j, "splits", "");
  for (auto it = splits.begin(); it != splits.end(); ++it) {
    const std::string sw = "splits." + it.key() + ".";
    if (!it->is_object()) fail_in(path, "field 'splits." + it.key() + "' must be an object");
    ManifestSplit s;
    s.tokens = p.u64(*it, "tokens", sw);
    s.documents = p.u64(*it, "documents", sw);
    const json& shards = p.array(*it, "shards", sw);
    uint64_t tokens = 0, docs = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string w = sw + "shards[" + std::to_string(i) + "].";
      if (!shards[i].is_object())
        fail_in(path, "field '" + sw + "shards[" + std::to_string(i) + "]' must be an object");
      ManifestShard sh;
      sh.file = p.str(shards[i], "file", w);
      if (!plain_manifest_entry(sh.file))
        fail_in(path, "field '" + w + "file' is '" + sh.file + "', expected a plain file name in the directory");
      sh.bytes = p.u64(shards[i], "bytes", w);
      sh.checksum = p.crc(shards[i], "checksum", w);
      sh.tokens = p.u64(shards[i], "tokens", w);
      sh.documents = p.u64(shards[i], "documents", w);
      const json& src = p.array(shards[i], "sources", w);
      for (const auto& s2 : src) {
        if (!s2.is_string()) fail_in(path, "field '" + w + "sources' must be an array of strings");
        sh.sources.push_back(s2.get<std::string>());
      }
      if (__builtin_add_overflow(tokens, sh.tokens, &tokens) || __builtin_add_overflow(docs, sh.documents, &docs))
        fail_in(path, "field '" + sw + "shards' token or document counts overflow");
      s.shards.push_back(std::move(sh));
    }
    if (tokens != s.tokens || docs != s.documents)
      fail_in(path, "split '" + it.key() + "' records " + std::to_string(s.tokens) + " tokens and " +
                        std::to_string(s.documents) + " documents, but its shards add up to " +
                        std::to_string(tokens) + " and " + std::to_string(docs));
    m.splits[it.key()] = std::move(s);
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// ShardDataset

ShardDataset ShardDataset::open(const std::string& dir, const Options& options) {
  ShardDataset ds;
  ds.dir_ = dir;
  ds.split_ = options.split;
  ds.manifest_ = read_manifest(dir);
  const std::string mpath = shard_dir_path(dir, kManifestName);
  const Manifest& m = ds.manifest_;
  if (options.expected_tokenizer_hash && *options.expected_tokenizer_hash != m.tokenizer_hash)
    fail_in(mpath,
            "tokenizer hash " + hex(m.tokenizer_hash) + " (" + m.tokenizer_path + ") differs from the expected " +
                hex(*options.expected_tokenizer_hash),
            "the shards were tokenised with a different tokenizer; re-run `zaya data prepare` with this one");
  auto sit = m.splits.find(options.split);
  if (sit == m.splits.end()) {
    std::string have;
    for (const auto& [name, s] : m.splits) have += (have.empty() ? "" : ", ") + name;
    fail_in(mpath, "no split '" + options.split + "' (the manifest has: " + (have.empty() ? "none" : have) + ")",
            options.split == "val" ? "prepare with --val-fraction to get a validation split" : "");
  }
  ds.token_starts_.push_back(0);
  ds.doc_starts_.push_back(0);
  for (const ManifestShard& e : sit->second.shards) {
    const std::string path = shard_dir_path(dir, e.file);
    auto r = ShardReader::open(path, options.verify);
    const ShardHeader& h = r->header();
    if (h.tokenizer_hash != m.tokenizer_hash)
      fail_in(path,
              "tokenizer hash " + hex(h.tokenizer_hash) + " differs from the manifest's " + hex(m.tokenizer_hash),
              "the directory mixes shards from different tokenizers; re-run `zaya data prepare`");
    if (h.vocab_size != m.vocab_size)
      fail_in(path, "vocab size " + std::to_string(h.vocab_size) + " differs from the manifest's " +
                        std::to_string(m.vocab_size));
    if (h.file_size != e.bytes || h.token_count != e.tokens || h.document_count != e.documents)
      fail_in(path,
              "holds " + std::to_string(h.file_size) + " bytes, " + std::to_string(h.token_count) +
                  " tokens and " + std::to_string(h.document_count) +
                  " documents, but the manifest records " + std::to_string(e.bytes) + ", " +
                  std::to_string(e.tokens) + " and " + std::to_string(e.documents),
              "the shard does not belong to this manifest; re-run `zaya data prepare`");
    if (r->has_loss_mask() != m.loss_mask)
      fail_in(path,
              std::string(r->has_loss_mask()
                              ? "has a loss mask, but the manifest records none"
                              : "has no loss mask, but the manifest records supervised fine-tuning "
                                "data (loss_mask)"),
              "the shard does not belong to this manifest; re-run `zaya data prepare`");
    if (options.verify == ShardVerify::Full) {
      const uint32_t c = r->file_crc();
      if (c != e.checksum)
        fail_in(path, "file checksum " + hex(c) + " differs from the manifest's " + hex(e.checksum), kCorruptHint);
    }
    ds.total_tokens_ += h.token_count;
    ds.total_documents_ += h.document_count;
    ds.token_starts_.push_back(ds.total_tokens_);
    ds.doc_starts_.push_back(ds.total_documents_);
    ds.shards_.push_back(std::move(r));
  }
  return ds;
}

size_t ShardDataset::shard_of_token(uint64_t offset) const {
  // Last shard whose start is <= offset (empty shards are skipped by upper_bound).
  auto it = std::upper_bound(token_starts_.begin(), token_starts_.end(), offset);
  return size_t(it - token_starts_.begin()) - 1;
}

uint32_t ShardDataset::token(uint64_t offset) const {
  if (offset >= total_tokens_)
    fail_in(dir_, "token " + std::to_string(offset) + " requested, but split '" + split_ + "' has " +
                      std::to_string(total_tokens_));
  const size_t s = shard_of_token(offset);
  return shards_[s]->token_span()[size_t(offset - token_starts_[s])];
}

void ShardDataset::for_each_piece(
    uint64_t offset, uint64_t n, const char* what,
    const std::function<void(const ShardReader&, uint64_t, uint64_t, uint64_t)>& piece) const {
  if (offset > total_tokens_ || n > total_tokens_ - offset)
    fail_in(dir_, std::string(what) + " [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                      ") requested, but split '" + split_ + "' has " + std::to_string(total_tokens_));
  uint64_t done = 0;
  for (size_t s = n > 0 ? shard_of_token(offset) : 0; done < n; ++s) {
    const uint64_t local = offset + done - token_starts_[s];
    const uint64_t take = std::min(n - done, shards_[s]->tokens() - local);
    piece(*shards_[s], local, take, done);
    done += take;
  }
}

void ShardDataset::read(uint64_t offset, uint64_t n, uint32_t* dst) const {
  for_each_piece(offset, n, "tokens",
                 [&](const ShardReader& sh, uint64_t local, uint64_t take, uint64_t done) {
                   std::memcpy(dst + done, sh.token_span().data() + local, size_t(take) * 4);
                 });
}

void ShardDataset::read_loss_mask(uint64_t offset, uint64_t n, uint8_t* dst) const {
  for_each_piece(offset, n, "loss mask of tokens",
                 [&](const ShardReader& sh, uint64_t local, uint64_t take, uint64_t done) {
                   const std::span<const uint8_t> mask = sh.loss_mask_span();
                   for (uint64_t i = 0; i < take; ++i)
                     dst[done + i] = mask.empty() || mask[size_t(local + i)] != 0 ? 1 : 0;
                 });
}

size_t ShardDataset::shard_of_doc(uint64_t d) const {
  if (d >= total_documents_)
    fail_in(dir_, "document " + std::to_string(d) + " requested, but split '" + split_ + "' has " +
                      std::to_string(total_documents_));
  auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), d);
  return size_t(it - doc_starts_.begin()) - 1;
}

std::span<const uint32_t> ShardDataset::document(uint64_t d) const {
  const size_t s = shard_of_doc(d);
  return shards_[s]->document(d - doc_starts_[s]);
}

uint64_t ShardDataset::document_start(uint64_t d) const {
  const size_t s = shard_of_doc(d);
  return token_starts_[s] + shards_[s]->index()[size_t(d - doc_starts_[s])];
}

}  // namespace zaya
