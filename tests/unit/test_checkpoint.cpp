// Training checkpoints: CRC-32C, bit-exact round trips, retention, the atomic commit, and
// recovery from damaged checkpoints (truncated, flipped byte, missing file, corrupt manifest,
// leftover temp directory), each of which must fall back with a warning naming the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/checksum.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "test_helpers.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using zaya::test::read_file;
using zaya::test::write_file;

// ---------------------------------------------------------------------------------------------
// CRC-32C

TEST(Crc32c, KnownVectors) {
  const char* check = "123456789";
  EXPECT_EQ(zaya::crc32c(check, 9), 0xE3069283u);  // the standard check value
  EXPECT_EQ(zaya::crc32c_portable(0, check, 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[size_t(i)] = uint8_t(i);
    dec[size_t(i)] = uint8_t(31 - i);
  }
  // RFC 3720 B.4 test vectors.
  EXPECT_EQ(zaya::crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(zaya::crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(zaya::crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(zaya::crc32c(dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(zaya::crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, HardwareMatchesTableAndCombineMatchesConcatenation) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(5000);
  for (auto& b : buf) b = uint8_t(rng());
  for (size_t start : {0, 1, 3, 7}) {
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 1000, 4993}) {
      const uint8_t* p = buf.data() + start;
      EXPECT_EQ(zaya::crc32c(p, len), zaya::crc32c_portable(0, p, len)) << start << " " << len;
      for (size_t cut : {size_t(0), len / 3, len}) {
        uint32_t a = zaya::crc32c(p, cut), b = zaya::crc32c(p + cut, len - cut);
        EXPECT_EQ(zaya::crc32c_combine(a, b, len - cut), zaya::crc32c(p, len)) << len << " cut " << cut;
        EXPECT_EQ(zaya::crc32c(a, p + cut, len - cut), zaya::crc32c(p, len));
      }
    }
  }
  // Long inputs take the three-stream path (24 KiB blocks) with any alignment and tail.
  std::vector<uint8_t> big(200000);
  for (auto& b : big) b = uint8_t(rng());
  for (size_t start : {0, 5})
    for (size_t len : {24575, 24576, 24577, 49152 + 13, 199990}) {
      const uint8_t* p = big.data() + start;
      EXPECT_EQ(zaya::crc32c(p, len), zaya::crc32c_portable(0, p, len)) << start << " " << len;
      EXPECT_EQ(zaya::crc32c(0x1234u, p, len), zaya::crc32c_portable(0x1234u, p, len)) << start << " " << len;
    }
  uint32_t v = 0;
  EXPECT_TRUE(zaya::parse_checksum_hex(zaya::checksum_hex(0x0012abCDu), &v));
  EXPECT_EQ(v, 0x0012abcdu);
  EXPECT_EQ(zaya::checksum_hex(0x0012abcdu), "0012abcd");
  EXPECT_FALSE(zaya::parse_checksum_hex("12345", &v));
  EXPECT_FALSE(zaya::parse_checksum_hex("1234567g", &v));
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

std::vector<float> ramp(size_t n, float seed) {
  std::vector<float> v(n);
  std::mt19937 rng(uint32_t(seed * 1000));
  std::normal_distribution<float> d;
  for (auto& x : v) x = d(rng) * seed;
  return v;
}

// Rewrites a manifest after a test edit, with a valid self-checksum.
void write_signed_manifest(const std::string& path, const nlohmann::ordered_json& m) {
  std::string text = m.dump(2) + "\n";  // any layout works as long as the first field comes first
  const std::string head = "{\n  \"manifest_checksum\": \"";
  ASSERT_EQ(text.compare(0, head.size(), head), 0);
  text.replace(head.size(), 8, "00000000");
  text.replace(head.size(), 8, zaya::checksum_hex(zaya::crc32c(text.data(), text.size())));
  write_file(path, text);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = (fs::path(::testing::TempDir()) / ("zaya_ckpt_" + std::to_string(::getpid()) + "_" + info->name())).string();
    fs::remove_all(root_);
    // A small "model": parameters in one group, optimizer moments in another, plus a scalar
    // and an empty tensor.
    w_ = ramp(6 * 5, 1.0f);
    b_ = ramp(5, 2.0f);
    m_ = ramp(6 * 5, 3.0f);
    s_ = {3.25f};
    w_[3] = -0.0f;
    w_[4] = std::numeric_limits<float>::denorm_min();
    w_[5] = std::numeric_limits<float>::quiet_NaN();
    w_[6] = -std::numeric_limits<float>::infinity();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  std::vector<zaya::CheckpointTensor> tensors() const {
    return {{"model.w", {6, 5}, w_.data(), "params"},
            {"model.b", {5}, b_.data(), "params"},
            {"opt.m.model.w", {6, 5}, m_.data(), "optimizer"},
            {"opt.step_scale", {}, s_.data(), "optimizer"},
            {"model.empty", {0, 4}, nullptr, "params"}};
  }
  json meta(int64_t step) const {
    return {{"tokens_seen", step * 4096},
            {"data_cursor", {{"shard", 3}, {"offset", 123456789012345LL}}},
            {"rng", {{"seed", 18446744073709551557ULL}, {"counter", step}}},
            {"lr", 0.1},
            {"tiny", 1e-300},
            {"recipe", "model: zaya1-tiny\nlr: 3e-4\n# comment with \"quotes\" and unicode \xce\xbb\n"}};
  }
  std::string save(int64_t step, int keep_last = 0) {
    return zaya::save_checkpoint(root_, step, tensors(), meta(step), keep_last, {capture()});
  }
  zaya::CheckpointWarn capture() {
    return [this](const std::string& w) { warnings_.push_back(w); };
  }
  zaya::CheckpointLoadOptions opts(bool verify = true) {
    zaya::CheckpointLoadOptions o;
    o.verify_checksums = verify;
    o.warn = capture();
    return o;
  }
  std::string dir(int64_t step) const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%08lld", (long long)step);
    return (fs::path(root_) / buf).string();
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(root_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  // Byte offset of a tensor's data inside a safetensors file.
  static uint64_t tensor_offset(const std::string& path, const std::string& name) {
    std::string bytes = read_file(path);
    std::vector<zaya::SafeTensorInfo> infos;
    uint64_t data_offset = 0;
    zaya::parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path, &infos, nullptr,
                            &data_offset);
    for (const auto& i : infos)
      if (i.name == name) return data_offset + i.begin;
    ADD_FAILURE() << "no tensor " << name;
    return 0;
  }
  static void flip_byte(const std::string& path, uint64_t offset) {
    std::string b = read_file(path);
    ASSERT_LT(offset, b.size());
    b[offset] = char(b[offset] ^ 0x10);
    write_file(path, b);
  }
  void expect_bit_exact(const zaya::LoadedCheckpoint& ck) {
    std::vector<float> w(30), b(5), m(30), s(1);
    ck.read_all({{"model.w", {6, 5}, w.data()},
                 {"model.b", {5}, b.data()},
                 {"opt.m.model.w", {6, 5}, m.data()},
                 {"opt.step_scale", {}, s.data()},
                 {"model.empty", {0, 4}, nullptr}});
    EXPECT_EQ(std::memcmp(w.data(), w_.data(), 30 * 4), 0);
    EXPECT_EQ(std::memcmp(b.data(), b_.data(), 5 * 4), 0);
    EXPECT_EQ(std::memcmp(m.data(), m_.data(), 30 * 4), 0);
    EXPECT_EQ(std::memcmp(s.data(), s_.data(), 4), 0);
  }
  // Damages step 200 with `damage`, then expects load_latest to fall back to 100 with a
  // warning containing every phrase, and load_checkpoint(step-200) to throw naming them.
  void expect_fallback(const std::function<void(const std::string&)>& damage, const std::vector<std::string>& phrases) {
    save(100);
    save(200);
    damage(dir(200));
    warnings_.clear();
    auto ck = zaya::load_latest_checkpoint(root_, opts());
    ASSERT_TRUE(ck.has_value());
    EXPECT_EQ(ck->step, 100);
    EXPECT_EQ(ck->meta, meta(100));
    expect_bit_exact(*ck);
    ASSERT_EQ(warnings_.size(), 1u);
    EXPECT_NE(warnings_[0].find("step-00000200"), std::string::npos) << warnings_[0];
    for (const auto& p : phrases) EXPECT_NE(warnings_[0].find(p), std::string::npos) << "'" << p << "' in " << warnings_[0];
    try {
      zaya::load_checkpoint(dir(200));
      ADD_FAILURE() << "expected zaya::Error";
    } catch (const zaya::Error& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("step-00000200/"), std::string::npos) << what;
      for (const auto& p : phrases) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' in " << what;
    }
  }

  std::string root_;
  std::vector<float> w_, b_, m_, s_;
  std::vector<std::string> warnings_;
};

TEST_F(CheckpointTest, RoundTripIsBitExact) {
  std::string d = save(123);
  EXPECT_EQ(d, dir(123));
  EXPECT_EQ(entries(), std::vector<std::string>{"step-00000123"});
  EXPECT_TRUE(fs::exists(fs::path(d) / "params.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(d) / "optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(d) / "manifest.json"));
  EXPECT_TRUE(warnings_.empty());

  for (bool verify : {true, false}) {
    auto ck = zaya::load_latest_checkpoint(root_, opts(verify));
    ASSERT_TRUE(ck.has_value());
    EXPECT_EQ(ck->step, 123);
    EXPECT_EQ(ck->dir, d);
    EXPECT_EQ(ck->meta, meta(123));
    EXPECT_EQ(ck->meta["rng"]["seed"].get<uint64_t>(), 18446744073709551557ULL);
    EXPECT_EQ(ck->meta["tiny"].get<double>(), 1e-300);
    EXPECT_EQ(ck->names(), (std::vector<std::string>{"model.w", "model.b", "opt.m.model.w", "opt.step_scale",
                                                     "model.empty"}));
    EXPECT_EQ(ck->shape("opt.step_scale"), std::vector<int64_t>{});
    expect_bit_exact(*ck);
    // The manifest records the format and every file and tensor.
    const json& m = ck->manifest;
    EXPECT_EQ(m["format"], "zaya-checkpoint");
    EXPECT_EQ(m["version"], zaya::kCheckpointFormatVersion);
    EXPECT_EQ(m["world_size"], 1);
    EXPECT_EQ(m["files"].size(), 2u);
    EXPECT_EQ(m["files"][0]["name"], "params.safetensors");
    EXPECT_EQ(m["files"][0]["bytes"].get<uint64_t>(), fs::file_size(fs::path(d) / "params.safetensors"));
    EXPECT_EQ(m["tensors"][2]["pieces"][0]["file"], "optimizer.safetensors");
    // The file checksum (assembled at save from header + tensor CRCs) matches the bytes.
    std::string bytes = read_file((fs::path(d) / "params.safetensors").string());
    EXPECT_EQ(m["files"][0]["checksum"], zaya::checksum_hex(zaya::crc32c(bytes.data(), bytes.size())));
  }
  EXPECT_TRUE(warnings_.empty());
  // The parameter file is a plain safetensors file other tools can read.
  auto set = zaya::SafeTensorsSet::open_file((fs::path(d) / "params.safetensors").string());
  EXPECT_EQ(set.names(), (std::vector<std::string>{"model.b", "model.empty", "model.w"}));
  auto rep = zaya::verify_checkpoint(d);
  EXPECT_TRUE(rep.ok());
}

TEST_F(CheckpointTest, LatestIsHighestStepNumerically) {
  save(9);
  save(100000000);  // nine digits sorts after step-00000009 numerically, not as text
  save(10);
  auto list = zaya::list_checkpoints(root_);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].step, 100000000);
  EXPECT_EQ(list[2].step, 9);
  auto ck = zaya::load_latest_checkpoint(root_, opts());
  ASSERT_TRUE(ck);
  EXPECT_EQ(ck->step, 100000000);
  // Saving a lower step while higher ones exist works but warns.
  ASSERT_FALSE(warnings_.empty());
  EXPECT_NE(warnings_.back().find("later steps"), std::string::npos) << warnings_.back();
}

TEST_F(CheckpointTest, NoCheckpointGivesNullopt) {
  EXPECT_FALSE(zaya::load_latest_checkpoint(root_, opts()).has_value());  // root missing
  fs::create_directories(root_);
  EXPECT_FALSE(zaya::load_latest_checkpoint(root_, opts()).has_value());
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(CheckpointTest, KeepLastPrunesOldest) {
  for (int s = 1; s <= 5; ++s) save(s * 10, 2);
  EXPECT_EQ(entries(), (std::vector<std::string>{"step-00000040", "step-00000050"}));
  // keep_last <= 0 keeps everything.
  save(60, 0);
  save(70, 0);
  EXPECT_EQ(entries().size(), 4u);
  // The checkpoint just written is kept even when later steps exist.
  save(5, 1);
  EXPECT_EQ(entries(), (std::vector<std::string>{"step-00000005", "step-00000070"}));
}

TEST_F(CheckpointTest, TruncatedFileFallsBack) {
  expect_fallback(
      [](const std::string& d) {
        auto p = fs::path(d) / "params.safetensors";
        fs::resize_file(p, fs::file_size(p) - 10);
      },
      {"params.safetensors", "truncated"});
}

TEST_F(CheckpointTest, FlippedTensorByteFallsBack) {
  expect_fallback(
      [](const std::string& d) {
        std::string p = (fs::path(d) / "optimizer.safetensors").string();
        flip_byte(p, tensor_offset(p, "opt.m.model.w") + 17);
      },
      {"optimizer.safetensors", "checksum mismatch for tensor 'opt.m.model.w'"});
}

TEST_F(CheckpointTest, FlippedHeaderByteFallsBack) {
  expect_fallback(
      [](const std::string& d) {
        // A letter of the header's metadata: still valid safetensors, but the checksum differs.
        std::string p = (fs::path(d) / "params.safetensors").string();
        std::string b = read_file(p);
        size_t pos = b.find("zaya-checkpoint");
        ASSERT_LT(pos, tensor_offset(p, "model.w"));
        b[pos] = 'Z';
        write_file(p, b);
      },
      {"params.safetensors", "checksum mismatch"});
}

TEST_F(CheckpointTest, MissingFileFallsBack) {
  expect_fallback([](const std::string& d) { fs::remove(fs::path(d) / "optimizer.safetensors"); },
                  {"optimizer.safetensors", "missing"});
}

TEST_F(CheckpointTest, CorruptManifestFallsBack) {
  expect_fallback(
      [](const std::string& d) {
        std::string p = (fs::path(d) / "manifest.json").string();
        std::string b = read_file(p);
        size_t pos = b.find("\"tokens_seen\": 819200");
        ASSERT_NE(pos, std::string::npos);
        b[pos + 15] = '9';  // still valid JSON, silently wrong meta without the self-checksum
        write_file(p, b);
      },
      {"manifest.json", "checksum mismatch"});
}

TEST_F(CheckpointTest, TruncatedManifestFallsBack) {
  expect_fallback(
      [](const std::string& d) {
        auto p = fs::path(d) / "manifest.json";
        fs::resize_file(p, fs::file_size(p) / 2);
      },
      {"manifest.json"});
}

TEST_F(CheckpointTest, MissingManifestFallsBack) {
  expect_fallback([](const std::string& d) { fs::remove(fs::path(d) / "manifest.json"); },
                  {"manifest.json", "missing"});
}

TEST_F(CheckpointTest, NewerVersionAndWrongStepAreRejected) {
  save(100);
  save(200);
  std::string p = (fs::path(dir(200)) / "manifest.json").string();
  auto m = nlohmann::ordered_json::parse(read_file(p));
  m["version"] = 99;
  write_signed_manifest(p, m);
  try {
    zaya::load_checkpoint(dir(200));
    ADD_FAILURE();
  } catch (const zaya::Error& e) {
    EXPECT_NE(std::string(e.what()).find("version 99 is newer"), std::string::npos) << e.what();
  }
  m["version"] = 1;
  m["step"] = 300;
  write_signed_manifest(p, m);
  EXPECT_THROW(zaya::load_checkpoint(dir(200)), zaya::Error);
  // Wrong JSON types in a hand-edited manifest are zaya::Errors, not JSON exceptions.
  m["step"] = 200;
  m["format"] = 5;
  write_signed_manifest(p, m);
  EXPECT_THROW(zaya::load_checkpoint(dir(200)), zaya::Error);
  m["format"] = "zaya-checkpoint";
  m["tensors"][0]["pieces"][0]["key"] = 17;
  m["files"][0]["rank"] = "zero";
  write_signed_manifest(p, m);
  EXPECT_THROW(zaya::load_checkpoint(dir(200)), zaya::Error);
  EXPECT_FALSE(zaya::verify_checkpoint(dir(200)).ok());
  auto ck = zaya::load_latest_checkpoint(root_, opts());
  ASSERT_TRUE(ck);
  EXPECT_EQ(ck->step, 100);
}

TEST_F(CheckpointTest, UnverifiedLoadChecksEachTensorOnRead) {
  save(100);
  std::string p = (fs::path(dir(100)) / "params.safetensors").string();
  flip_byte(p, tensor_offset(p, "model.b") + 2);
  auto ck = zaya::load_checkpoint(dir(100), opts(/*verify=*/false));
  std::vector<float> w(30), b(5);
  ck.read("model.w", {6, 5}, w.data());  // undamaged tensors still read
  EXPECT_EQ(std::memcmp(w.data(), w_.data(), 120), 0);
  try {
    ck.read("model.b", {5}, b.data());
    ADD_FAILURE();
  } catch (const zaya::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("params.safetensors: checksum mismatch for tensor 'model.b'"), std::string::npos) << what;
  }
  auto rep = zaya::verify_checkpoint(dir(100));
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_NE(rep.problems[0].find("model.b"), std::string::npos);
}

TEST_F(CheckpointTest, ShapeMismatchAndMissingTensorsAreListed) {
  save(1);
  auto ck = zaya::load_checkpoint(dir(1));
  std::vector<float> buf(100);
  try {
    ck.read_all({{"model.w", {5, 6}, buf.data()}, {"model.nope", {3}, buf.data()}, {"model.b", {5}, buf.data()}});
    ADD_FAILURE();
  } catch (const zaya::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("missing 1: model.nope"), std::string::npos) << what;
    EXPECT_NE(what.find("model.w [6, 5] (expected [5, 6])"), std::string::npos) << what;
  }
  EXPECT_THROW(ck.read("model.w", {30}, buf.data()), zaya::Error);
  EXPECT_THROW(ck.shape("nope"), zaya::Error);
}

TEST_F(CheckpointTest, LeftoverTmpDirectoryIsIgnoredAndCleaned) {
  save(100);
  // A crash mid-save of step 200: a temp directory with a partial file and no manifest.
  fs::path tmp = fs::path(root_) / ".tmp-step-00000200-999999";
  fs::create_directories(tmp);
  write_file((tmp / "params.safetensors").string(), "garbage");
  auto ck = zaya::load_latest_checkpoint(root_, opts());
  ASSERT_TRUE(ck);
  EXPECT_EQ(ck->step, 100);
  EXPECT_TRUE(warnings_.empty());
  expect_bit_exact(*ck);
  // The next save removes it and leaves the previous checkpoint intact.
  save(300, 5);
  EXPECT_EQ(entries(), (std::vector<std::string>{"step-00000100", "step-00000300"}));
  EXPECT_TRUE(zaya::verify_checkpoint(dir(100)).ok());
}

TEST_F(CheckpointTest, FailedSaveLeavesNoStepDirectory) {
  save(100);
  auto ts = tensors();
  ts.push_back({"model.w", {1}, w_.data(), "params"});  // duplicate name
  EXPECT_THROW(zaya::save_checkpoint(root_, 200, ts, meta(200), 3), zaya::Error);
  ts.pop_back();
  ts.push_back({"bad", {2}, w_.data(), "no/slash"});
  EXPECT_THROW(zaya::save_checkpoint(root_, 200, ts, meta(200), 3), zaya::Error);
  ts.pop_back();
  ts.push_back({"null", {2}, nullptr, "params"});
  EXPECT_THROW(zaya::save_checkpoint(root_, 200, ts, meta(200), 3), zaya::Error);
  EXPECT_THROW(zaya::save_checkpoint(root_, -1, tensors(), meta(0), 3), zaya::Error);
  json bad_meta = {{"text", std::string("\xff\xfe")}};  // invalid UTF-8 cannot be dumped
  EXPECT_THROW(zaya::save_checkpoint(root_, 200, tensors(), bad_meta, 3), zaya::Error);
  EXPECT_EQ(entries(), std::vector<std::string>{"step-00000100"});
}

TEST_F(CheckpointTest, SavingAnExistingStepReplacesIt) {
  save(100);
  save(200);
  // Damage 200, resume from 100 (the fallback), train on, and save step 200 again.
  fs::remove(fs::path(dir(200)) / "params.safetensors");
  auto ck = zaya::load_latest_checkpoint(root_, opts());
  ASSERT_TRUE(ck);
  EXPECT_EQ(ck->step, 100);
  w_[0] = 42.0f;
  save(200);
  EXPECT_EQ(entries(), (std::vector<std::string>{"step-00000100", "step-00000200"}));
  warnings_.clear();
  ck = zaya::load_latest_checkpoint(root_, opts());
  ASSERT_TRUE(ck);
  EXPECT_EQ(ck->step, 200);
  EXPECT_TRUE(warnings_.empty());
  expect_bit_exact(*ck);  // the new contents
  std::vector<float> w(30);
  ck->read("model.w", {6, 5}, w.data());
  EXPECT_EQ(w[0], 42.0f);
}

// The loader already reads the multi-rank layout: a tensor split into pieces owned by
// different ranks, each piece a 1-D tensor in that rank's file.
TEST_F(CheckpointTest, LoaderAssemblesMultiRankPieces) {
  fs::path d = fs::path(root_) / "step-00000007";
  fs::create_directories(d);
  std::vector<float> full = ramp(12, 5.0f);
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  nlohmann::ordered_json pieces = nlohmann::ordered_json::array();
  for (int rank = 0; rank < 2; ++rank) {
    // Rank 0 owns elements [0, 5), rank 1 owns [5, 12): a cut inside a row.
    const int64_t off = rank == 0 ? 0 : 5, len = rank == 0 ? 5 : 7;
    std::string name = "params.rank" + std::to_string(rank) + ".safetensors";
    std::string key = "w@" + std::to_string(off);
    zaya::write_safetensors((d / name).string(), {{key, zaya::DType::F32, {len}, full.data() + off}});
    std::string bytes = read_file((d / name).string());
    files.push_back({{"name", name}, {"rank", rank}, {"bytes", bytes.size()},
                     {"checksum", zaya::checksum_hex(zaya::crc32c(bytes.data(), bytes.size()))}});
    pieces.push_back({{"rank", rank}, {"file", name}, {"key", key}, {"offset", off}, {"length", len},
                      {"checksum", zaya::checksum_hex(zaya::crc32c(full.data() + off, size_t(len) * 4))}});
  }
  nlohmann::ordered_json m = {{"manifest_checksum", "00000000"}, {"format", "zaya-checkpoint"}, {"version", 1},
                              {"step", 7}, {"world_size", 2}, {"meta", {{"k", 1}}}, {"files", files},
                              {"tensors", nlohmann::ordered_json::array(
                                              {{{"name", "w"}, {"shape", {3, 4}}, {"dtype", "F32"}, {"pieces", pieces}}})}};
  write_signed_manifest((d / "manifest.json").string(), m);
  auto ck = zaya::load_latest_checkpoint(root_, opts());
  ASSERT_TRUE(ck);
  EXPECT_TRUE(warnings_.empty()) << warnings_[0];
  std::vector<float> out(12);
  ck->read("w", {3, 4}, out.data());
  EXPECT_EQ(std::memcmp(out.data(), full.data(), 48), 0);
  // Overlapping pieces are rejected.
  m["tensors"][0]["pieces"][1]["offset"] = 4;
  write_signed_manifest((d / "manifest.json").string(), m);
  EXPECT_THROW(zaya::load_checkpoint(d.string()), zaya::Error);
}

}  // namespace
