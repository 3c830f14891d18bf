// Token shards (`zaya data prepare`): round trip of .txt/.jsonl/.jsonl.gz/.txt.zst inputs
// through a SentencePiece tokenizer trained here with spm_train, determinism across thread
// counts, shard boundaries, the val split, stats, and one test per corruption class (each
// error must name the file).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/checksum.h"
#include "core/error.h"
#include "data/corpus_input.h"
#include "data/data_stats.h"
#include "data/shard_format.h"
#include "data/shard_reader.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"
#include "test_helpers.h"

namespace {

namespace fs = std::filesystem;
using zaya::ShardVerify;
using zaya::test::read_file;
using zaya::test::write_file;

const std::vector<std::string> kWords = {
    "the", "model", "routes", "each", "token", "to", "a", "few", "experts", "and", "training", "runs", "for",
    "many", "steps", "with", "warmup", "cosine", "decay", "data", "shards", "are", "mapped", "into", "memory",
    "quickly", "zebra", "quokka", "caf\xC3\xA9", "na\xC3\xAFve", "12345", "3.14", "tokenizer", "vocabulary"};

// Deterministic pseudo-random text of `words` words.
std::string make_text(uint64_t seed, size_t words) {
  std::string s;
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t i = 0; i < words; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    if (i) s += (x >> 60) == 0 ? ".\n" : " ";
    s += kWords[(x >> 33) % kWords.size()];
  }
  return s + ".";
}

std::string gzip(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, uLong(data.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = uInt(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::string jsonl_line(const std::string& text, const std::string& extra = "") {
  std::string esc;
  for (char c : text) {
    if (c == '\n') esc += "\\n";
    else if (c == '"') esc += "\\\"";
    else if (c == '\\') esc += "\\\\";
    else esc += c;
  }
  return "{\"id\": 7, \"text\": \"" + esc + "\"" + extra + "}\n";
}

// Expects `fn` to throw zaya::Error whose message contains `file` and every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::string& file, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const zaya::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << "error does not name " << file << ": " << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    return;
  }
  ADD_FAILURE() << "no zaya::Error thrown (expected one naming " << file << ")";
}

class Shards : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("zaya_shards_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_ / "in");
    // Tokenizer training text.
    {
      std::ofstream out(*dir_ / "spm_corpus.txt");
      for (int i = 0; i < 300; ++i) out << make_text(uint64_t(i) + 1000, 12) << "\n";
    }
    std::string prefix = (*dir_ / "tok").string();
    std::string cmd = "spm_train --input=" + (*dir_ / "spm_corpus.txt").string() + " --model_prefix=" + prefix +
                      " --vocab_size=300 --model_type=bpe --character_coverage=1.0 --byte_fallback=true"
                      " --bos_id=1 --eos_id=2 --unk_id=0 --minloglevel=2 > " + (*dir_ / "train.log").string() +
                      " 2>&1";
    status_ = std::system(cmd.c_str());
    model_ = new std::string(prefix + ".model");

    // The corpus, in the order prepare reads it (inputs are listed explicitly below).
    docs_ = new std::vector<std::string>();  // every document read, in input order ("" = skipped)
    const fs::path in = *dir_ / "in";
    uint64_t seed = 1;
    auto doc = [&](size_t words) {
      docs_->push_back(make_text(seed++, words));
      return docs_->back();
    };
    write_file(in / "a.txt", doc(40));
    write_file(in / "b.txt", doc(500));  // long: larger than the small shard size used below
    {
      std::string s;
      for (int i = 0; i < 12; ++i) s += jsonl_line(doc(size_t(5 + i * 3)), ", \"meta\": {\"x\": [1, 2]}");
      s += "\n   \n";                      // blank lines are not documents
      docs_->push_back("");               // an empty text: read, then skipped
      s += jsonl_line("");
      const std::string last = jsonl_line(doc(9));
      s += last.substr(0, last.size() - 1);  // no final newline
      write_file(in / "c.jsonl", s);
    }
    {
      std::string m1, m2;
      for (int i = 0; i < 8; ++i) m1 += jsonl_line(doc(size_t(3 + i)));
      for (int i = 0; i < 8; ++i) m2 += jsonl_line(doc(size_t(20 + i)));
      write_file(in / "d.jsonl.gz", gzip(m1) + gzip(m2));  // two gzip members
    }
    write_file(in / "e.txt.zst", zstd(doc(60)));
    inputs_ = new std::vector<std::string>{(in / "a.txt").string(), (in / "b.txt").string(),
                                           (in / "c.jsonl").string(), (in / "d.jsonl.gz").string(),
                                           (in / "e.txt.zst").string()};
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete model_;
    delete docs_;
    delete inputs_;
  }
  void SetUp() override {
    if (status_ != 0 || !fs::exists(*model_))
      GTEST_FAIL() << "spm_train failed (status " << status_ << "); install it with scripts/setup.sh (Debian package "
                   << "'sentencepiece'); log: " << (*dir_ / "train.log").string();
    tok_ = zaya::load_tokenizer(*model_);
  }

  zaya::PrepareOptions options(const std::string& out, int threads = 2) const {
    zaya::PrepareOptions o;
    o.tokenizer = *model_;
    o.inputs = *inputs_;
    o.out_dir = (*dir_ / out).string();
    o.threads = threads;
    return o;
  }
  std::vector<uint32_t> expected_tokens(const std::string& text) const {
    std::vector<uint32_t> v;
    for (int32_t id : tok_->encode(text)) v.push_back(uint32_t(id));
    v.push_back(uint32_t(tok_->eos_id()));
    return v;
  }
  // Kept documents of a split, in order, as token vectors.
  std::vector<std::vector<uint32_t>> expected_split(double val_fraction, bool val) const {
    std::vector<std::vector<uint32_t>> out;
    for (size_t i = 0; i < docs_->size(); ++i) {
      if ((*docs_)[i].empty()) continue;
      if (zaya::is_val_document(i, val_fraction) != val) continue;
      out.push_back(expected_tokens((*docs_)[i]));
    }
    return out;
  }
  static void check_dataset(const zaya::ShardDataset& ds, const std::vector<std::vector<uint32_t>>& want) {
    ASSERT_EQ(ds.documents(), want.size());
    std::vector<uint32_t> all;
    for (size_t d = 0; d < want.size(); ++d) {
      auto got = ds.document(d);
      EXPECT_EQ(std::vector<uint32_t>(got.begin(), got.end()), want[d]) << "document " << d;
      EXPECT_EQ(ds.document_start(d), all.size()) << "document " << d;
      all.insert(all.end(), want[d].begin(), want[d].end());
    }
    ASSERT_EQ(ds.tokens(), all.size());
    std::vector<uint32_t> read(all.size());
    ds.read(0, all.size(), read.data());
    EXPECT_EQ(read, all);
    for (uint64_t i = 0; i < all.size(); i += 37) EXPECT_EQ(ds.token(i), all[i]) << "token " << i;
    EXPECT_THROW(ds.token(all.size()), zaya::Error);
    EXPECT_THROW(ds.document(want.size()), zaya::Error);
    EXPECT_THROW(ds.read(all.size() - 1, 2, read.data()), zaya::Error);
  }
  // The first shard of a prepared directory, for corruption tests.
  std::string valid_shard_bytes() {
    static std::string bytes;
    if (bytes.empty()) {
      zaya::prepare_shards(options("corrupt_src"));
      bytes = read_file(*dir_ / "corrupt_src" / "train-00000.zshard");
    }
    return bytes;
  }
  static std::string reencode(std::string bytes, const std::function<void(zaya::ShardHeader&)>& edit) {
    auto* p = reinterpret_cast<uint8_t*>(bytes.data());
    zaya::ShardHeader h = zaya::decode_shard_header_unchecked(p);
    edit(h);
    zaya::encode_shard_header(h, p, [](const void* d, size_t n) { return zaya::crc32c(d, n); });
    return bytes;
  }

  static inline fs::path* dir_ = nullptr;
  static inline int status_ = -1;
  static inline std::string* model_ = nullptr;
  static inline std::vector<std::string>* docs_ = nullptr;
  static inline std::vector<std::string>* inputs_ = nullptr;
  std::unique_ptr<zaya::Tokenizer> tok_;
};

TEST_F(Shards, RoundTripAllInputKinds) {
  auto r = zaya::prepare_shards(options("roundtrip"));
  const auto want = expected_split(0, false);
  EXPECT_EQ(r.documents, want.size());
  EXPECT_EQ(r.skipped, 1u);
  const auto& m = r.manifest;
  ASSERT_EQ(m.splits.size(), 1u);
  ASSERT_EQ(m.splits.at("train").shards.size(), 1u);
  EXPECT_EQ(m.tokenizer_hash, zaya::tokenizer_file_hash(*model_));
  EXPECT_EQ(m.splits.at("train").shards[0].sources, *inputs_);
  ASSERT_EQ(m.sources.size(), 5u);
  EXPECT_EQ(m.sources[2].documents, 14u);  // 12 + the empty one + the unterminated last line
  EXPECT_EQ(m.sources[2].skipped, 1u);
  EXPECT_EQ(m.sources[3].documents, 16u);  // both gzip members

  // The manifest on disk parses back to the same thing.
  const std::string dir = (*dir_ / "roundtrip").string();
  zaya::Manifest back = zaya::read_manifest(dir);
  EXPECT_EQ(back.tokenizer_hash, m.tokenizer_hash);
  EXPECT_EQ(back.splits.at("train").shards[0].checksum, m.splits.at("train").shards[0].checksum);
  EXPECT_EQ(back.vocab_size, uint64_t(tok_->vocab_size()));
  EXPECT_EQ(back.eos_id, tok_->eos_id());

  zaya::ShardDataset::Options o;
  o.verify = ShardVerify::Full;  // header, index, section CRCs, token ids, whole-file CRC
  o.expected_tokenizer_hash = zaya::tokenizer_file_hash(*model_);
  zaya::ShardDataset ds = zaya::ShardDataset::open(dir, o);
  check_dataset(ds, want);
  EXPECT_EQ(ds.shard(0).file_crc(), m.splits.at("train").shards[0].checksum);
  // Decoding gives the text back (up to SentencePiece's whitespace normalisation).
  auto d0 = ds.document(0);
  std::vector<int32_t> ids(d0.begin(), d0.end() - 1);
  EXPECT_EQ(tok_->decode(ids).substr(0, 12), (*docs_)[0].substr(0, 12));
}

TEST_F(Shards, DeterministicAcrossRunsAndThreadCounts) {
  auto a = options("det_a", 1);
  a.batch_bytes = 64;  // many small batches
  a.shard_bytes = 2048;
  a.val_fraction = 0.25;
  auto b = a;
  b.out_dir = (*dir_ / "det_b").string();
  b.threads = 3;
  b.batch_bytes = 1 << 20;
  zaya::prepare_shards(a);
  zaya::prepare_shards(b);
  auto files_of = [](const fs::path& d) {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(d)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  };
  const auto names = files_of(a.out_dir);
  ASSERT_EQ(names, files_of(b.out_dir));
  ASSERT_GT(names.size(), 3u);
  for (const auto& n : names)
    EXPECT_EQ(read_file(fs::path(a.out_dir) / n), read_file(fs::path(b.out_dir) / n)) << n << " differs";
  // Running again over the same directory (now with stale files in it) gives the same bytes.
  const std::string manifest_before = read_file(fs::path(a.out_dir) / "manifest.json");
  write_file(fs::path(a.out_dir) / "train-00999.zshard", "stale");
  write_file(fs::path(a.out_dir) / "val-00007.zshard.tmp", "stale");
  write_file(fs::path(a.out_dir) / "train-1.zshard", "not ours: kept");
  zaya::prepare_shards(a);
  EXPECT_TRUE(fs::remove(fs::path(a.out_dir) / "train-1.zshard")) << "a file prepare did not write was removed";
  EXPECT_EQ(files_of(a.out_dir), names);
  EXPECT_EQ(read_file(fs::path(a.out_dir) / "manifest.json"), manifest_before);
  EXPECT_EQ(manifest_before.find(a.out_dir), std::string::npos) << "the manifest must not record the output path";
}

TEST_F(Shards, ShardBoundaries) {
  auto o = options("small");
  o.shard_bytes = 1024;
  auto r = zaya::prepare_shards(o);
  const auto& shards = r.manifest.splits.at("train").shards;
  ASSERT_GT(shards.size(), 4u);
  bool saw_oversized = false;
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "train-%05zu.zshard", i);
    EXPECT_EQ(shards[i].file, name);
    EXPECT_EQ(fs::file_size(fs::path(o.out_dir) / name), shards[i].bytes);
    EXPECT_GE(shards[i].documents, 1u);
    if (shards[i].bytes > 1024) {
      EXPECT_EQ(shards[i].documents, 1u) << "only a single oversized document may exceed the target";
      saw_oversized = true;
    }
    // A shard closes only when the next document would not fit.
    if (i + 1 < shards.size() && shards[i].bytes <= 1024) {
      auto next = zaya::ShardReader::open((fs::path(o.out_dir) / shards[i + 1].file).string());
      const uint64_t next_doc = next->document(0).size();
      EXPECT_GT(zaya::shard_layout(shards[i].tokens + next_doc, shards[i].documents + 1).file_size, 1024u);
    }
  }
  EXPECT_TRUE(saw_oversized);
  zaya::ShardDataset ds = zaya::ShardDataset::open(o.out_dir);
  EXPECT_EQ(ds.shard_count(), shards.size());
  check_dataset(ds, expected_split(0, false));
  // A read straddling a shard boundary.
  const uint64_t boundary = shards[0].tokens;
  uint32_t buf[6];
  ds.read(boundary - 3, 6, buf);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(buf[i], ds.token(boundary - 3 + uint64_t(i)));
  EXPECT_EQ(buf[3], ds.shard(1).token_span()[0]);
}

TEST_F(Shards, ValidationSplit) {
  auto o = options("val");
  o.val_fraction = 0.3;
  auto r = zaya::prepare_shards(o);
  const auto want_train = expected_split(0.3, false), want_val = expected_split(0.3, true);
  ASSERT_GT(want_val.size(), 3u);
  ASSERT_GT(want_train.size(), want_val.size());
  EXPECT_EQ(r.documents, want_train.size() + want_val.size());
  EXPECT_TRUE(fs::exists(fs::path(o.out_dir) / "val-00000.zshard"));
  zaya::ShardDataset::Options vo;
  vo.split = "val";
  check_dataset(zaya::ShardDataset::open(o.out_dir), want_train);
  check_dataset(zaya::ShardDataset::open(o.out_dir, vo), want_val);
  // The split is a pure function of the document number.
  uint64_t n = 0;
  for (uint64_t i = 0; i < 100000; ++i) n += zaya::is_val_document(i, 0.3);
  EXPECT_NEAR(double(n) / 100000, 0.3, 0.01);
  // Without --val-fraction there is no val split, and asking for it says how to get one.
  auto plain = options("noval");
  zaya::prepare_shards(plain);
  expect_error([&] { zaya::ShardDataset::open(plain.out_dir, vo); }, "manifest.json", {"no split 'val'", "--val-fraction"});
}

TEST_F(Shards, Stats) {
  auto o = options("stats");
  o.val_fraction = 0.3;
  zaya::prepare_shards(o);
  auto stats = zaya::compute_data_stats(o.out_dir, 1000);  // every token, so EOS is listed
  ASSERT_EQ(stats.size(), 2u);
  auto top20 = zaya::compute_data_stats(o.out_dir, 20);
  EXPECT_EQ(top20[0].top_tokens.size(), 20u);
  EXPECT_EQ(top20[0].top_tokens[0], stats[0].top_tokens[0]);
  for (const auto& s : stats) {
    zaya::ShardDataset::Options so;
    so.split = s.split;
    auto ds = zaya::ShardDataset::open(o.out_dir, so);
    EXPECT_EQ(s.tokens, ds.tokens());
    EXPECT_EQ(s.documents, ds.documents());
    uint64_t hist = 0;
    for (uint64_t c : s.length_histogram) hist += c;
    EXPECT_EQ(hist, s.documents);
    ASSERT_FALSE(s.top_tokens.empty());
    uint64_t total = 0;
    for (const auto& [id, c] : s.top_tokens) total += c;
    EXPECT_EQ(total, s.tokens);
    for (size_t i = 1; i < s.top_tokens.size(); ++i) EXPECT_GE(s.top_tokens[i - 1].second, s.top_tokens[i].second);
    uint64_t eos_count = 0;
    for (const auto& [id, c] : s.top_tokens)
      if (int32_t(id) == tok_->eos_id()) eos_count = c;
    EXPECT_EQ(eos_count, s.documents);  // one EOS per document
  }
  const std::string text = zaya::format_data_stats(stats, tok_.get());
  EXPECT_NE(text.find("split train"), std::string::npos);
  EXPECT_NE(text.find("split val"), std::string::npos);
  EXPECT_NE(text.find("top tokens"), std::string::npos);
  EXPECT_NE(text.find("</s>"), std::string::npos) << text;  // EOS shown by name
}

// ---- corruption classes: every error names the file ----

class ShardCorruption : public Shards {
 protected:
  std::string path_ = (*dir_ / "corrupt.zshard").string();
  void open_expect(const std::string& bytes, ShardVerify v, const std::vector<std::string>& parts) {
    write_file(path_, bytes);
    expect_error([&] { zaya::ShardReader::open(path_, v); }, path_, parts);
  }
};

TEST_F(ShardCorruption, ValidShardOpens) {
  write_file(path_, valid_shard_bytes());
  auto r = zaya::ShardReader::open(path_, ShardVerify::Full);
  EXPECT_GT(r->documents(), 10u);
  EXPECT_EQ(r->index().front(), 0u);
  EXPECT_EQ(r->index().back(), r->tokens());
  // Out-of-range requests throw instead of reading past the mapping.
  expect_error([&] { r->document(r->documents()); }, path_, {"document"});
  expect_error([&] { r->tokens(r->tokens() - 2, 3); }, path_, {"tokens"});
  expect_error([&] { r->tokens(UINT64_MAX, 2); }, path_, {"tokens"});
  EXPECT_EQ(r->tokens(r->tokens(), 0).size(), 0u);
}

TEST_F(ShardCorruption, Truncated) {
  std::string b = valid_shard_bytes();
  open_expect(b.substr(0, b.size() - 8), ShardVerify::Structure, {"file size", "truncated"});
  open_expect(b.substr(0, 100), ShardVerify::Structure, {"too short"});
  open_expect("", ShardVerify::Structure, {"too short"});
}

TEST_F(ShardCorruption, BadMagic) {
  std::string b = valid_shard_bytes();
  b[3] = 'X';
  open_expect(b, ShardVerify::Structure, {"bad magic"});
  open_expect(std::string("ZAYATOK1") + std::string(200, '\0'), ShardVerify::Structure, {"bad magic"});
}

TEST_F(ShardCorruption, WrongVersion) {
  open_expect(reencode(valid_shard_bytes(), [](zaya::ShardHeader& h) { h.version = 3; }),
              ShardVerify::Structure, {"format version 3", "not supported", "newer zaya"});
  std::string b = valid_shard_bytes();
  b[8] = 0;  // version 0, header CRC not updated: the version is reported first
  open_expect(b, ShardVerify::Structure, {"format version 0"});
}

TEST_F(ShardCorruption, HeaderChecksum) {
  std::string b = valid_shard_bytes();
  b[zaya::shard_field::kTokenCount] ^= 1;
  open_expect(b, ShardVerify::Structure, {"header checksum mismatch"});
  b = valid_shard_bytes();
  b[zaya::shard_field::kHeaderCrc] ^= 0x40;
  open_expect(b, ShardVerify::Structure, {"header checksum mismatch"});
}

TEST_F(ShardCorruption, SectionOutOfBounds) {
  const std::string b = valid_shard_bytes();
  open_expect(reencode(b, [](zaya::ShardHeader& h) { h.index_offset = uint64_t(1) << 40; }), ShardVerify::Structure,
              {"index section", "outside the file"});
  open_expect(reencode(b, [](zaya::ShardHeader& h) { h.index_offset = UINT64_MAX - 7; }), ShardVerify::Structure,
              {"index section", "outside the file"});
  open_expect(reencode(b,
                       [](zaya::ShardHeader& h) {
                         h.token_count += 1000;
                         h.tokens_bytes += 4000;
                       }),
              ShardVerify::Structure, {"tokens section", "past the end"});
  open_expect(reencode(b, [](zaya::ShardHeader& h) { h.tokens_bytes = 12; }), ShardVerify::Structure,
              {"tokens section size", "token count"});
  open_expect(reencode(b, [](zaya::ShardHeader& h) { h.document_count += 1; }), ShardVerify::Structure,
              {"index section size", "document count"});
  open_expect(reencode(b, [](zaya::ShardHeader& h) { h.file_size += 8; }), ShardVerify::Structure, {"file size"});
}

TEST_F(ShardCorruption, NonMonotoneIndex) {
  std::string b = valid_shard_bytes();
  auto h = zaya::decode_shard_header_unchecked(reinterpret_cast<const uint8_t*>(b.data()));
  char* e1 = b.data() + h.index_offset + 8;
  char* e2 = b.data() + h.index_offset + 16;
  std::string tmp(e1, 8);
  std::memcpy(e1, e2, 8);
  std::memcpy(e2, tmp.data(), 8);
  open_expect(b, ShardVerify::Structure, {"document index entry 2", "not monotone"});
}

TEST_F(ShardCorruption, IndexEntryPastTokenCount) {
  std::string b = valid_shard_bytes();
  auto h = zaya::decode_shard_header_unchecked(reinterpret_cast<const uint8_t*>(b.data()));
  const uint64_t bad = h.token_count + 1000;
  std::memcpy(b.data() + h.index_offset + 17 * 8, &bad, 8);
  open_expect(b, ShardVerify::Structure,
              {"document index entry 17 (offset " + std::to_string(bad) + ") exceeds token count " +
               std::to_string(h.token_count)});
  // The last entry must equal the token count.
  b = valid_shard_bytes();
  const uint64_t short_end = h.token_count - 1;
  std::memcpy(b.data() + h.index_offset + h.document_count * 8, &short_end, 8);
  open_expect(b, ShardVerify::Structure, {"document index entry " + std::to_string(h.document_count), "token count"});
  b = valid_shard_bytes();
  const uint64_t one = 1;
  std::memcpy(b.data() + h.index_offset, &one, 8);
  open_expect(b, ShardVerify::Structure, {"document index entry 0", "is not 0"});
}

TEST_F(ShardCorruption, TokenIdOutOfVocabWhenFullyVerified) {
  std::string b = valid_shard_bytes();
  auto h = zaya::decode_shard_header_unchecked(reinterpret_cast<const uint8_t*>(b.data()));
  const uint32_t bad = uint32_t(h.vocab_size + 3);
  std::memcpy(b.data() + h.tokens_offset + 5 * 4, &bad, 4);
  // With stale CRCs, full verification reports the checksum; structure-only opens fine.
  open_expect(b, ShardVerify::Full, {"tokens section checksum mismatch"});
  write_file(path_, b);
  EXPECT_NO_THROW(zaya::ShardReader::open(path_, ShardVerify::Structure));
  // With consistent CRCs, it reports the id itself.
  const std::string fixed = reencode(b, [&](zaya::ShardHeader& hh) {
    hh.tokens_crc = zaya::crc32c(b.data() + hh.tokens_offset, size_t(hh.tokens_bytes));
  });
  open_expect(fixed, ShardVerify::Full, {"token 5 has id " + std::to_string(bad), "vocab size"});
  // An index byte flipped in a way that stays monotone is caught by the index CRC.
  b = valid_shard_bytes();
  open_expect(reencode(b, [](zaya::ShardHeader& hh) { hh.index_crc ^= 1; }), ShardVerify::Full,
              {"index section checksum mismatch"});
}

TEST_F(ShardCorruption, TokenizerHashMismatch) {
  valid_shard_bytes();
  const std::string dir = (*dir_ / "corrupt_src").string();
  const uint32_t real = zaya::tokenizer_file_hash(*model_);
  zaya::ShardDataset::Options o;
  o.expected_tokenizer_hash = real ^ 0x5a5a5a5au;
  expect_error([&] { zaya::ShardDataset::open(dir, o); }, dir + "/manifest.json", {"tokenizer hash", "differs"});
  o.expected_tokenizer_hash = real;
  EXPECT_NO_THROW(zaya::ShardDataset::open(dir, o));
  // A shard whose header disagrees with the manifest.
  const std::string copy = (*dir_ / "corrupt_mixed").string();
  fs::remove_all(copy);
  fs::copy(dir, copy);
  const fs::path shard = fs::path(copy) / "train-00000.zshard";
  write_file(shard, reencode(read_file(shard), [](zaya::ShardHeader& h) { h.tokenizer_hash ^= 1; }));
  expect_error([&] { zaya::ShardDataset::open(copy, o); }, shard.string(), {"tokenizer hash", "manifest"});
}

TEST_F(ShardCorruption, ManifestDisagreesWithShard) {
  valid_shard_bytes();
  const std::string copy = (*dir_ / "corrupt_manifest").string();
  fs::remove_all(copy);
  fs::copy((*dir_ / "corrupt_src").string(), copy);
  const fs::path shard = fs::path(copy) / "train-00000.zshard";
  // Same structure, one token changed and all shard CRCs fixed: only the manifest CRC catches it.
  std::string b = read_file(shard);
  auto h = zaya::decode_shard_header_unchecked(reinterpret_cast<const uint8_t*>(b.data()));
  uint32_t t;
  std::memcpy(&t, b.data() + h.tokens_offset + 8, 4);
  t = (t + 1) % uint32_t(h.vocab_size);
  std::memcpy(b.data() + h.tokens_offset + 8, &t, 4);
  b = reencode(b, [&](zaya::ShardHeader& hh) {
    hh.tokens_crc = zaya::crc32c(b.data() + hh.tokens_offset, size_t(hh.tokens_bytes));
  });
  write_file(shard, b);
  EXPECT_NO_THROW(zaya::ShardDataset::open(copy));
  zaya::ShardDataset::Options o;
  o.verify = ShardVerify::Full;
  expect_error([&] { zaya::ShardDataset::open(copy, o); }, shard.string(), {"file checksum", "manifest"});
  // A shard missing from the directory.
  fs::remove(shard);
  expect_error([&] { zaya::ShardDataset::open(copy); }, shard.string(), {"cannot open"});
  // A malformed manifest.
  write_file(fs::path(copy) / "manifest.json", "{\"format\": \"zaya-shards\"}");
  expect_error([&] { zaya::read_manifest(copy); }, copy + "/manifest.json", {"format_version"});
}

// Every single-byte change to the header and index is either rejected or harmless.
TEST_F(ShardCorruption, ByteFlipsNeverEscapeValidation) {
  const std::string b = valid_shard_bytes();
  auto h = zaya::decode_shard_header_unchecked(reinterpret_cast<const uint8_t*>(b.data()));
  std::vector<size_t> positions;
  for (size_t i = 0; i < zaya::kShardHeaderBytes; ++i) positions.push_back(i);
  for (size_t i = h.index_offset; i < b.size(); i += 3) positions.push_back(i);
  for (size_t pos : positions) {
    std::string c = b;
    c[pos] = char(c[pos] ^ 0x10);
    try {
      zaya::ShardHeader got = zaya::parse_shard(reinterpret_cast<const uint8_t*>(c.data()), c.size(), "x.zshard",
                                                ShardVerify::Full);
      ADD_FAILURE() << "flip at byte " << pos << " accepted (tokens " << got.token_count << ")";
    } catch (const zaya::Error& e) {
      EXPECT_NE(std::string(e.what()).find("x.zshard"), std::string::npos);
    }
  }
}

// ---- corpus input errors name the file (and line) ----

TEST_F(Shards, InputErrorsNameTheFile) {
  const fs::path d = *dir_ / "bad_inputs";
  fs::create_directories(d);
  auto run = [&](const std::string& name) {
    auto o = options("bad_out");
    o.inputs = {(d / name).string()};
    zaya::prepare_shards(o);
  };
  write_file(d / "bad.jsonl", jsonl_line("fine") + "{\"text\": oops}\n");
  expect_error([&] { run("bad.jsonl"); }, (d / "bad.jsonl").string() + ":2", {"not valid JSON"});
  write_file(d / "nofield.jsonl", "{\"body\": \"x\"}\n");
  expect_error([&] { run("nofield.jsonl"); }, (d / "nofield.jsonl").string() + ":1", {"no field 'text'", "--text-field"});
  write_file(d / "notstring.jsonl", "{\"text\": 5}\n");
  expect_error([&] { run("notstring.jsonl"); }, (d / "notstring.jsonl").string() + ":1", {"not a string"});
  write_file(d / "notes.md", "hello");
  expect_error([&] { run("notes.md"); }, (d / "notes.md").string(), {"unknown input type"});
  const std::string gz = gzip(std::string(5000, 'a'));
  write_file(d / "cut.txt.gz", gz.substr(0, gz.size() / 2));
  expect_error([&] { run("cut.txt.gz"); }, (d / "cut.txt.gz").string(), {"gzip", "truncated"});
  write_file(d / "junk.txt.gz", "this is not gzip at all");
  expect_error([&] { run("junk.txt.gz"); }, (d / "junk.txt.gz").string(), {"gzip data is corrupt"});
  const std::string zs = zstd(make_text(5, 3000));
  write_file(d / "cut.jsonl.zst", zs.substr(0, zs.size() - 10));
  expect_error([&] { run("cut.jsonl.zst"); }, (d / "cut.jsonl.zst").string(), {"zstd", "truncated"});
  expect_error([&] { run("nothing-*.txt"); }, (d / "nothing-*.txt").string(), {"matches no file"});
  // Globs expand in sorted order.
  auto files = zaya::expand_inputs({(*dir_ / "in" / "*.txt*").string(), (*dir_ / "in" / "a.txt").string()});
  EXPECT_EQ(files, (std::vector<std::string>{(*dir_ / "in" / "a.txt").string(), (*dir_ / "in" / "b.txt").string(),
                                             (*dir_ / "in" / "e.txt.zst").string()}));
  // A tokenizer change is visible in the hash.
  expect_error([&] { zaya::tokenizer_file_hash((d / "missing.model").string()); }, (d / "missing.model").string(), {});
}

}  // namespace
