// safetensors reader/writer: round trips (F32, BF16, F16, metadata, sharded directories) and
// malformed inputs, each of which must raise zaya::Error naming the file and the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
class SafeTensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("zaya_st_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static void write_bytes(const std::string& p, const std::string& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), std::streamsize(bytes.size()));
  }
  // A raw safetensors image: length prefix, header text, `data_bytes` zero bytes.
  static std::string image(const std::string& header, size_t data_bytes, uint64_t claimed_len = UINT64_MAX) {
    uint64_t n = claimed_len == UINT64_MAX ? header.size() : claimed_len;
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = char(uint8_t(n >> (8 * i)));
    return s + header + std::string(data_bytes, '\0');
  }
  std::string write_image(const std::string& name, const std::string& header, size_t data_bytes) {
    std::string p = path(name);
    write_bytes(p, image(header, data_bytes));
    return p;
  }
  // Expects open() of `p` to throw zaya::Error whose text contains every phrase.
  static void expect_open_error(const std::string& p, const std::vector<std::string>& phrases) {
    try {
      SafeTensorsFileHolder h{zaya::SafeTensorsFile::open(p)};
      ADD_FAILURE() << "expected zaya::Error opening " << p;
    } catch (const zaya::Error& e) {
      std::string what = e.what();
      for (const auto& ph : phrases) EXPECT_NE(what.find(ph), std::string::npos) << "missing '" << ph << "' in: " << what;
    }
  }
  static void expect_dir_error(const std::string& d, const std::vector<std::string>& phrases) {
    try {
      zaya::SafeTensorsSet::open_dir(d);
      ADD_FAILURE() << "expected zaya::Error opening " << d;
    } catch (const zaya::Error& e) {
      std::string what = e.what();
      for (const auto& ph : phrases) EXPECT_NE(what.find(ph), std::string::npos) << "missing '" << ph << "' in: " << what;
    }
  }
  struct SafeTensorsFileHolder {
    std::unique_ptr<zaya::SafeTensorsFile> f;
  };
  fs::path dir_;
};

std::vector<float> test_values(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * float(i)) * float(1 + i % 7) * 0.731f;
  return v;
}

uint64_t header_len(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  uint8_t b[8];
  f.read(reinterpret_cast<char*>(b), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Round trips

TEST_F(SafeTensorsTest, RoundTripF32) {
  auto a = test_values(6);
  std::vector<float> b = {1.5f, -2.25f, 1e-30f};
  std::string p = path("f32.safetensors");
  zaya::write_safetensors(p, {{"w.a", zaya::DType::F32, {2, 3}, a.data()}, {"w.b", zaya::DType::F32, {3}, b.data()}});
  EXPECT_EQ((8 + header_len(p)) % 8, 0u) << "data section must be 8-byte aligned";
  EXPECT_FALSE(fs::exists(p + ".tmp." + std::to_string(::getpid())));

  auto f = zaya::SafeTensorsFile::open(p);
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "w.a");
  EXPECT_EQ(f->tensors()[1].name, "w.b");
  const zaya::SafeTensorInfo* ta = f->find("w.a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, zaya::DType::F32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->numel(), 6u);
  EXPECT_EQ(ta->begin, 0u);  // data laid out in the given order
  EXPECT_EQ(ta->end, 24u);
  EXPECT_EQ(f->find("w.b")->begin, 24u);
  EXPECT_EQ(std::memcmp(f->data(*ta), a.data(), 24), 0);
  EXPECT_EQ(f->find("missing"), nullptr);
  EXPECT_TRUE(f->metadata().empty());

  auto set = zaya::SafeTensorsSet::open_file(p);
  EXPECT_EQ(set.names(), (std::vector<std::string>{"w.a", "w.b"}));
  std::vector<float> got(3);
  set.read_f32("w.b", got.data());
  EXPECT_EQ(got, b);
}

TEST_F(SafeTensorsTest, RoundTripBF16RoundsToNearestEven) {
  auto v = test_values(37);
  v.push_back(1.00390625f);     // exactly halfway between two bf16 values: rounds to even (1.0)
  v.push_back(1.01171875f);     // halfway, rounds up to even
  std::vector<uint16_t> h(v.size());
  zaya::convert_from_f32(v.data(), v.size(), zaya::DType::BF16, h.data());
  std::string p = path("bf16.safetensors");
  zaya::write_safetensors(p, {{"x", zaya::DType::BF16, {int64_t(v.size())}, h.data()}});
  auto set = zaya::SafeTensorsSet::open_file(p);
  std::vector<float> got(v.size());
  set.read_f32("x", got.data());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(got[i], zaya::bf16_to_f32(zaya::f32_to_bf16(v[i]))) << i;
    EXPECT_LE(std::fabs(got[i] - v[i]), std::fabs(v[i]) * (1.0f / 256)) << i;
  }
  EXPECT_EQ(got[v.size() - 2], 1.0f);
  EXPECT_EQ(got[v.size() - 1], 1.015625f);
}

TEST_F(SafeTensorsTest, RoundTripF16AndIntegerDtypes) {
  std::vector<float> v = {0.0f, -1.0f, 65504.0f, 5.9604644775390625e-08f, 0.333251953125f};
  std::vector<uint16_t> h(v.size());
  zaya::convert_from_f32(v.data(), v.size(), zaya::DType::F16, h.data());
  std::vector<int64_t> ids = {1, -2, 1ll << 40};
  std::vector<uint8_t> bytes = {1, 2, 3};
  std::string p = path("f16.safetensors");
  zaya::write_safetensors(p, {{"half", zaya::DType::F16, {5}, h.data()},
                              {"ids", zaya::DType::I64, {3}, ids.data()},
                              {"u8", zaya::DType::U8, {3}, bytes.data()},
                              {"empty", zaya::DType::F32, {0, 4}, nullptr}});
  auto set = zaya::SafeTensorsSet::open_file(p);
  std::vector<float> got(v.size());
  set.read_f32("half", got.data());
  EXPECT_EQ(got, v);  // all exactly representable in f16
  const auto* e = set.find("ids");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info->dtype, zaya::DType::I64);
  EXPECT_EQ(std::memcmp(e->file->data(*e->info), ids.data(), 24), 0);
  EXPECT_EQ(set.find("empty")->info->numel(), 0u);
  // read_f32 refuses integer tensors, naming the tensor and the dtype.
  try {
    set.read_f32("ids", got.data());
    ADD_FAILURE() << "expected an error";
  } catch (const zaya::Error& err) {
    EXPECT_NE(std::string(err.what()).find("'ids'"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("I64"), std::string::npos) << err.what();
  }
  EXPECT_THROW(set.read_f32("nope", got.data()), zaya::Error);
}

TEST_F(SafeTensorsTest, RoundTripMetadata) {
  float x = 3.0f;
  std::string p = path("meta.safetensors");
  zaya::write_safetensors(p, {{"x", zaya::DType::F32, {}, &x}}, {{"format", "pt"}, {"step", "42"}});
  auto f = zaya::SafeTensorsFile::open(p);
  EXPECT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("step"), "42");
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_TRUE(f->tensors()[0].shape.empty());
  EXPECT_EQ(f->tensors()[0].numel(), 1u);
}

TEST_F(SafeTensorsTest, OverwritesExistingFileAtomically) {
  std::string p = path("over.safetensors");
  write_bytes(p, "garbage");
  float x = 7.0f;
  zaya::write_safetensors(p, {{"x", zaya::DType::F32, {1}, &x}});
  auto set = zaya::SafeTensorsSet::open_file(p);
  float got = 0;
  set.read_f32("x", &got);
  EXPECT_EQ(got, 7.0f);
}

TEST_F(SafeTensorsTest, WriteErrorsNameThePath) {
  float x = 1.0f;
  std::string p = path("no_such_dir/out.safetensors");
  try {
    zaya::write_safetensors(p, {{"x", zaya::DType::F32, {1}, &x}});
    ADD_FAILURE() << "expected an error";
  } catch (const zaya::Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  EXPECT_THROW(zaya::write_safetensors(path("dup.safetensors"),
                                       {{"x", zaya::DType::F32, {1}, &x}, {"x", zaya::DType::F32, {1}, &x}}),
               zaya::Error);
}

TEST_F(SafeTensorsTest, OpenDirSingleFile) {
  float x = 2.0f;
  zaya::write_safetensors(path("model.safetensors"), {{"x", zaya::DType::F32, {1}, &x}});
  auto set = zaya::SafeTensorsSet::open_dir(dir_.string());
  EXPECT_EQ(set.names(), std::vector<std::string>{"x"});
}

TEST_F(SafeTensorsTest, OpenDirShardedIndex) {
  auto a = test_values(4);
  auto b = test_values(8);
  std::vector<uint16_t> bh(b.size());
  zaya::convert_from_f32(b.data(), b.size(), zaya::DType::BF16, bh.data());
  zaya::write_safetensors(path("model-00001-of-00002.safetensors"), {{"a", zaya::DType::F32, {4}, a.data()}});
  zaya::write_safetensors(path("model-00002-of-00002.safetensors"),
                          {{"b", zaya::DType::BF16, {2, 4}, bh.data()}, {"c", zaya::DType::F32, {1}, a.data()}});
  write_bytes(path("model.safetensors.index.json"),
              R"({"metadata": {"total_size": 36}, "weight_map": {
                   "a": "model-00001-of-00002.safetensors",
                   "b": "model-00002-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
  auto set = zaya::SafeTensorsSet::open_dir(dir_.string());
  EXPECT_EQ(set.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(set.find("b")->file, set.find("c")->file);  // each shard opened once
  EXPECT_NE(set.find("a")->file, set.find("b")->file);
  std::vector<float> got(8);
  set.read_f32("b", got.data());
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(got[i], zaya::bf16_to_f32(zaya::f32_to_bf16(b[i])));
  set.read_f32("a", got.data());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], a[i]);
  // The set stays valid after a move.
  zaya::SafeTensorsSet moved = std::move(set);
  moved.read_f32("c", got.data());
  EXPECT_EQ(got[0], a[0]);
}

// ---------------------------------------------------------------------------------------------
// Malformed files

TEST_F(SafeTensorsTest, EmptyFile) {
  std::string p = path("empty.safetensors");
  write_bytes(p, "");
  expect_open_error(p, {p, "0 bytes", "at least 8"});
}

TEST_F(SafeTensorsTest, ShorterThanEightBytes) {
  std::string p = path("short.safetensors");
  write_bytes(p, "abc");
  expect_open_error(p, {p, "3 bytes", "at least 8"});
}

TEST_F(SafeTensorsTest, HeaderLengthLargerThanFile) {
  std::string p = path("lies.safetensors");
  write_bytes(p, image("{}", 0, 1000));
  expect_open_error(p, {p, "header length is 1000", "only 2 bytes"});
}

TEST_F(SafeTensorsTest, HeaderLengthAbsurd) {
  std::string p = path("huge.safetensors");
  write_bytes(p, image("{}", 0, uint64_t(1) << 62));
  expect_open_error(p, {p, "header length", "at most"});
}

TEST_F(SafeTensorsTest, TruncatedData) {
  float v[4] = {1, 2, 3, 4};
  std::string good = path("good.safetensors");
  zaya::write_safetensors(good, {{"t", zaya::DType::F32, {4}, v}});
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string p = path("truncated.safetensors");
  write_bytes(p, bytes.substr(0, bytes.size() - 5));
  expect_open_error(p, {p, "tensor 't'", "data_offsets", "past the end"});
}

TEST_F(SafeTensorsTest, NotJson) {
  std::string p = write_image("notjson.safetensors", "{\"a\": [1, 2", 0);
  expect_open_error(p, {p, "header", "not valid JSON"});
}

TEST_F(SafeTensorsTest, HeaderNotAnObject) {
  std::string p = write_image("array.safetensors", "[1, 2, 3]", 0);
  expect_open_error(p, {p, "header must be a JSON object", "[1,2,3]"});
}

TEST_F(SafeTensorsTest, EntryNotAnObject) {
  std::string p = write_image("entry.safetensors", R"({"t": 5})", 0);
  expect_open_error(p, {p, "tensor 't'", "expected an object"});
}

TEST_F(SafeTensorsTest, OverlappingOffsets) {
  std::string p = write_image("overlap.safetensors",
                              R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                              12);
  expect_open_error(p, {p, "tensor 'b'", "data_offsets", "overlaps tensor 'a'"});
}

TEST_F(SafeTensorsTest, IdenticalOffsetsOverlap) {
  std::string p = write_image("same.safetensors",
                              R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})",
                              8);
  expect_open_error(p, {p, "data_offsets", "overlaps"});
}

TEST_F(SafeTensorsTest, OutOfRangeOffsets) {
  std::string p = write_image("range.safetensors",
                              R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 16);
  expect_open_error(p, {p, "tensor 'a'", "data_offsets", "ends at 24", "16 bytes"});
}

TEST_F(SafeTensorsTest, BeginAfterEnd) {
  std::string p = write_image("order.safetensors",
                              R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 16);
  expect_open_error(p, {p, "tensor 'a'", "data_offsets", "begin 8 > end 4"});
}

TEST_F(SafeTensorsTest, SizeMismatch) {
  std::string p = write_image("size.safetensors",
                              R"({"a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 16]}})", 16);
  expect_open_error(p, {p, "tensor 'a'", "data_offsets", "spans 16 bytes", "needs 12 bytes"});
}

TEST_F(SafeTensorsTest, UnknownDtype) {
  std::string p = write_image("dtype.safetensors",
                              R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  expect_open_error(p, {p, "tensor 'w'", "dtype", "\"F64\""});
}

TEST_F(SafeTensorsTest, NegativeShape) {
  std::string p = write_image("neg.safetensors",
                              R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 0]}})", 0);
  expect_open_error(p, {p, "tensor 'w'", "shape", "non-negative integer", "-1"});
}

TEST_F(SafeTensorsTest, NonIntegerShape) {
  std::string p = write_image("float.safetensors",
                              R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4);
  expect_open_error(p, {p, "tensor 'w'", "shape", "non-negative integer", "1.5"});
  std::string q = write_image("str.safetensors",
                              R"({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})", 8);
  expect_open_error(q, {q, "tensor 'w'", "shape"});
}

TEST_F(SafeTensorsTest, ShapeOverflow) {
  std::string p = write_image(
      "overflow.safetensors",
      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 0]}})", 0);
  expect_open_error(p, {p, "tensor 'w'", "shape", "64 bits"});
  std::string q = write_image(
      "overflow2.safetensors",
      R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0);
  expect_open_error(q, {q, "tensor 'w'", "shape", "64 bits"});
}

TEST_F(SafeTensorsTest, DuplicateTensorName) {
  std::string p = write_image("dup.safetensors",
                              R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                  "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                              8);
  expect_open_error(p, {p, "duplicate tensor name 'w'"});
}

TEST_F(SafeTensorsTest, DuplicateField) {
  std::string p = write_image("dupfield.safetensors",
                              R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})", 4);
  expect_open_error(p, {p, "'w'", "duplicate field 'dtype'"});
}

TEST_F(SafeTensorsTest, DeepNesting) {
  std::string deep = "{\"w\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  std::string p = write_image("deep.safetensors", deep, 0);
  expect_open_error(p, {p, "header", "nests deeper"});
  std::string q = write_image("nested.safetensors", R"([{"a": 1, "a": 2}])", 0);
  expect_open_error(q, {q, "duplicate key 'a'"});
}

TEST_F(SafeTensorsTest, UnknownField) {
  std::string p = write_image(
      "field.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "layout": "C"}})", 4);
  expect_open_error(p, {p, "tensor 'w'", "unknown field 'layout'"});
}

TEST_F(SafeTensorsTest, MissingField) {
  std::string p = write_image("missing.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", 4);
  expect_open_error(p, {p, "tensor 'w'", "missing field 'data_offsets'"});
}

TEST_F(SafeTensorsTest, BadMetadata) {
  std::string p = write_image("meta.safetensors", R"({"__metadata__": {"step": 3}})", 0);
  expect_open_error(p, {p, "__metadata__.step", "must be a string"});
  std::string q = write_image("meta2.safetensors", R"({"__metadata__": [1]})", 0);
  expect_open_error(q, {q, "__metadata__", "must be an object"});
}

TEST_F(SafeTensorsTest, BadDataOffsets) {
  std::string p = write_image("offs.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4);
  expect_open_error(p, {p, "tensor 'w'", "data_offsets", "[begin, end]"});
  std::string q =
      write_image("offs2.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4);
  expect_open_error(q, {q, "tensor 'w'", "data_offsets"});
}

TEST_F(SafeTensorsTest, EmptyTensorsDoNotOverlap) {
  std::string p = write_image("zeros.safetensors",
                              R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                                  "c": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
                              8);
  auto f = zaya::SafeTensorsFile::open(p);
  EXPECT_EQ(f->tensors().size(), 3u);
}

TEST_F(SafeTensorsTest, HeaderWithPaddingAndHoles) {
  // Trailing spaces in the header and unused bytes in the data section are accepted.
  std::string p = write_image("pad.safetensors",
                              R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]}}    )", 8);
  auto f = zaya::SafeTensorsFile::open(p);
  ASSERT_NE(f->find("a"), nullptr);
  EXPECT_EQ(f->find("a")->begin, 6u);
}

TEST_F(SafeTensorsTest, ParseInMemory) {
  std::string img = image(R"({"a": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})", 4);
  std::vector<zaya::SafeTensorInfo> ts;
  std::map<std::string, std::string> meta;
  uint64_t off = 0;
  zaya::parse_safetensors(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "mem", &ts, &meta, &off);
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(off, img.size() - 4);
  EXPECT_THROW(zaya::parse_safetensors(nullptr, 0, "mem", &ts, &meta, &off), zaya::Error);
}

TEST_F(SafeTensorsTest, MissingFileAndDirectory) {
  expect_open_error(path("absent.safetensors"), {path("absent.safetensors"), "cannot open"});
  expect_open_error(dir_.string(), {dir_.string(), "not a regular file"});
  expect_dir_error(dir_.string(), {dir_.string(), "model.safetensors.index.json", "model.safetensors"});
}

// ---------------------------------------------------------------------------------------------
// Malformed sharded directories

TEST_F(SafeTensorsTest, IndexNamesMissingShard) {
  float x = 1;
  zaya::write_safetensors(path("s1.safetensors"), {{"a", zaya::DType::F32, {1}, &x}});
  write_bytes(path("model.safetensors.index.json"),
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_dir_error(dir_.string(), {"model.safetensors.index.json", "weight_map.b", "s2.safetensors", "does not exist"});
}

TEST_F(SafeTensorsTest, IndexNamesTensorNotInShard) {
  float x = 1;
  zaya::write_safetensors(path("s1.safetensors"), {{"a", zaya::DType::F32, {1}, &x}});
  write_bytes(path("model.safetensors.index.json"),
              R"({"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}})");
  expect_dir_error(dir_.string(), {"model.safetensors.index.json", "weight_map.ghost", "s1.safetensors", "no such tensor"});
}

TEST_F(SafeTensorsTest, ShardHasTensorMissingFromIndex) {
  float x[2] = {1, 2};
  zaya::write_safetensors(path("s1.safetensors"),
                          {{"a", zaya::DType::F32, {1}, &x[0]}, {"extra", zaya::DType::F32, {1}, &x[1]}});
  write_bytes(path("model.safetensors.index.json"), R"({"weight_map": {"a": "s1.safetensors"}})");
  expect_dir_error(dir_.string(), {"model.safetensors.index.json", "s1.safetensors", "'extra'", "weight_map"});
}

TEST_F(SafeTensorsTest, ShardNameWithParentDirectory) {
  float x = 1;
  zaya::write_safetensors(path("s1.safetensors"), {{"a", zaya::DType::F32, {1}, &x}});
  fs::create_directories(dir_ / "sub");
  write_bytes(path("sub/model.safetensors.index.json"), R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_dir_error((dir_ / "sub").string(),
                   {"model.safetensors.index.json", "weight_map.a", "../s1.safetensors", "plain file name"});
  write_bytes(path("sub/model.safetensors.index.json"), R"({"weight_map": {"a": "/etc/passwd"}})");
  expect_dir_error((dir_ / "sub").string(), {"weight_map.a", "plain file name"});
}

TEST_F(SafeTensorsTest, BadIndexJson) {
  write_bytes(path("model.safetensors.index.json"), "{not json");
  expect_dir_error(dir_.string(), {"model.safetensors.index.json", "not valid JSON"});
  write_bytes(path("model.safetensors.index.json"), R"({"metadata": {}})");
  expect_dir_error(dir_.string(), {"model.safetensors.index.json", "missing field 'weight_map'"});
  write_bytes(path("model.safetensors.index.json"), R"({"weight_map": {"a": 3}})");
  expect_dir_error(dir_.string(), {"model.safetensors.index.json", "weight_map.a", "shard file name"});
  write_bytes(path("model.safetensors.index.json"), R"({"weight_map": {"a": "x", "a": "y"}})");
  expect_dir_error(dir_.string(), {"model.safetensors.index.json", "duplicate"});
}

TEST_F(SafeTensorsTest, BadShardIsReportedWithItsPath) {
  write_bytes(path("s1.safetensors"), "junk");
  write_bytes(path("model.safetensors.index.json"), R"({"weight_map": {"a": "s1.safetensors"}})");
  expect_dir_error(dir_.string(), {path("s1.safetensors"), "at least 8"});
}
