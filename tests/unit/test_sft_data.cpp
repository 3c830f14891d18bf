// Supervised fine-tuning data: `zaya data prepare --prompt-field P --completion-field C` writes
// shards whose loss mask marks the completions as the only training targets (format version
// 2). Checked here: the documents and masks prepare writes, its errors, the version and
// validation of masked shards (every corruption names the file), the loader's targets (-1 for
// a prompt token, across a shard boundary too), held-out scoring of completions only, and
// the trainer's step: its loss and gradient are the mean over the completions' targets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../common/small_tokenizer.h"
#include "backend/backend.h"
#include "ckpt/checksum.h"
#include "core/error.h"
#include "data/data_stats.h"
#include "data/document_tokens.h"
#include "data/loader.h"
#include "data/shard_format.h"
#include "data/shard_reader.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"
#include "eval/eval_data.h"
#include "eval/perplexity.h"
#include "model/config.h"
#include "model/model.h"
#include "model/model_io.h"
#include "test_helpers.h"
#include "train/recipe.h"
#include "train/train_data.h"
#include "train/train_support.h"
#include "train/trainer.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

using test::expect_error;

struct Record {
  std::string prompt, completion;
};

const std::vector<Record> kRecords = {
    {"The cat sat on the", " mat."},
    {"A dog ran in the", " park. Birds fly south."},
    {"Birds fly", ""},     // an empty completion: nothing to train, skipped
    {"", "The cat sat."},  // no prompt: every token is a target
    {"The mat. The park. The cat sat on", " the mat."},
};

std::string records_jsonl(const std::vector<Record>& records) {
  std::string s;
  for (const Record& r : records)
    s += nlohmann::json{{"id", 1}, {"prompt", r.prompt}, {"completion", r.completion}}.dump() + "\n";
  return s;
}

// A shard directory of masked documents written by ShardWriter directly: documents of 5..24
// tokens whose first half is prompt (all of it with all_prompt). Small shards, so that windows
// cross shard boundaries.
std::vector<std::pair<std::vector<uint32_t>, std::vector<uint8_t>>> write_masked_dir(
    const std::string& dir, uint64_t shard_bytes, bool all_prompt = false) {
  std::vector<std::pair<std::vector<uint32_t>, std::vector<uint8_t>>> docs;
  Manifest m;
  m.vocab_size = 64;
  m.eos_id = 1;
  m.loss_mask = true;
  m.prompt_field = "prompt";
  m.completion_field = "completion";
  for (const char* split : {"train", "val"}) {
    ShardWriter::Options o{dir, split, shard_bytes, 0, 64, true};
    ShardWriter w(o);
    for (int d = 0; d < 40; ++d) {
      const int len = 5 + (d * 7) % 20;
      std::vector<uint32_t> toks;
      std::vector<uint8_t> mask;
      for (int i = 0; i < len; ++i) {
        toks.push_back(uint32_t(2 + (d * 13 + i * 5) % 62));
        mask.push_back(i >= len / 2 && !all_prompt ? 1 : 0);
      }
      toks.back() = 1;  // EOS
      w.add_document(toks, "synthetic", mask);
      if (std::string(split) == "train") docs.emplace_back(toks, mask);
    }
    m.splits[split] = w.finish();
  }
  write_manifest(dir, m);
  return docs;
}

// A zaya-tiny run on the shards in dir/data from a model initialised with `seed` (saved to
// dir/init): one micro-batch of 2 x 16 per step, no held-out loss, checkpoints or samples.
Recipe sft_recipe(const std::string& dir, uint64_t seed, Backend& be) {
  Model init(preset_config("zaya-tiny"), be);
  init.init_random(seed);
  save_model(init, dir + "/init", DType::F32);
  Recipe r;
  r.run_dir = dir + "/run";
  r.model.init_from = dir + "/init";
  r.data.train = dir + "/data";
  r.data.val = "";
  r.data.tokenizer = "";
  r.data.seq_len = 16;
  r.batch.micro_batch = 2;
  r.batch.global_batch = 2;
  r.schedule.warmup_steps = 0;
  r.checkpoint.every = 0;
  r.eval.every = 0;
  r.eval.sample_tokens = 0;
  r.logging.plot = false;
  return r;
}

class SftData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::fresh_dir("sft", "suite"));
    tokenizer_ = new std::string(test::train_small_tokenizer(*dir_ + "/tok"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete tokenizer_;
  }
  PrepareOptions options(const std::string& out, const std::string& input) const {
    PrepareOptions o;
    o.tokenizer = *tokenizer_;
    o.inputs = {input};
    o.out_dir = *dir_ + "/" + out;
    o.prompt_field = "prompt";
    o.completion_field = "completion";
    o.threads = 2;
    return o;
  }
  static inline std::string* dir_ = nullptr;
  static inline std::string* tokenizer_ = nullptr;
};

TEST_F(SftData, PrepareMasksThePromptAndTrainsTheCompletion) {
  const std::string input = *dir_ + "/records.jsonl";
  write_bytes(input, records_jsonl(kRecords));
  const PrepareOptions o = options("prepared", input);
  const PrepareResult result = prepare_shards(o);
  auto tok = load_tokenizer(*tokenizer_);

  // Each kept record: the prompt as the server tokenises one (special tokens on), then the
  // completion, then EOS; only the completion and EOS are targets.
  std::vector<uint32_t> want_tokens;
  std::vector<uint8_t> want_mask;
  uint64_t kept = 0;
  for (const Record& r : kRecords) {
    if (r.completion.empty()) continue;
    ++kept;
    for (int32_t id : tok->encode(r.prompt, true)) {  // an empty prompt still gets BOS
      want_tokens.push_back(uint32_t(id));
      want_mask.push_back(0);
    }
    for (int32_t id : tok->encode(r.completion)) {
      want_tokens.push_back(uint32_t(id));
      want_mask.push_back(1);
    }
    want_tokens.push_back(uint32_t(tok->eos_id()));
    want_mask.push_back(1);
  }
  ASSERT_GT(tok->bos_id(), -1);
  EXPECT_EQ(want_tokens.front(), uint32_t(tok->bos_id()));  // the prompt's special token is there
  EXPECT_EQ(tok->encode("", true), std::vector<int32_t>{tok->bos_id()});  // also for the empty prompt
  EXPECT_EQ(result.documents, kept);
  EXPECT_EQ(result.skipped, 1u);
  EXPECT_EQ(result.tokens, want_tokens.size());
  uint64_t targets = 0;
  for (uint8_t v : want_mask) targets += v;
  EXPECT_EQ(result.target_tokens, targets);

  ShardDataset::Options so;
  so.verify = ShardVerify::Full;
  const ShardDataset ds = ShardDataset::open(o.out_dir, so);
  EXPECT_TRUE(ds.has_loss_mask());
  EXPECT_EQ(ds.manifest().prompt_field, "prompt");
  EXPECT_EQ(ds.manifest().completion_field, "completion");
  ASSERT_EQ(ds.tokens(), want_tokens.size());
  std::vector<uint32_t> got_tokens(want_tokens.size());
  std::vector<uint8_t> got_mask(want_tokens.size());
  ds.read(0, got_tokens.size(), got_tokens.data());
  ds.read_loss_mask(0, got_mask.size(), got_mask.data());
  EXPECT_EQ(got_tokens, want_tokens);
  EXPECT_EQ(got_mask, want_mask);
  EXPECT_EQ(ds.shard(0).header().version, 2u);
  EXPECT_TRUE(ds.shard(0).header().has_loss_mask());

  const std::vector<SplitStats> stats = compute_data_stats(o.out_dir);
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_TRUE(stats[0].loss_mask);
  EXPECT_EQ(stats[0].target_tokens, targets);
  EXPECT_NE(format_data_stats(stats, nullptr).find("targets"), std::string::npos);

  // Plain documents keep format version 1 (readable by a zaya that knows only it) and no mask.
  PrepareOptions plain = options("plain", input);
  plain.prompt_field = plain.completion_field = "";
  plain.text_field = "prompt";
  prepare_shards(plain);
  const ShardDataset pds = ShardDataset::open(plain.out_dir, so);
  EXPECT_FALSE(pds.has_loss_mask());
  EXPECT_EQ(pds.shard(0).header().version, 1u);
  EXPECT_EQ(pds.shard(0).header().flags, 0u);
  std::vector<uint8_t> ones(size_t(pds.tokens()));
  pds.read_loss_mask(0, ones.size(), ones.data());
  EXPECT_EQ(ones, std::vector<uint8_t>(ones.size(), 1));
}

// A conversation: the fields are arrays of turns, and every completion is a target.
TEST_F(SftData, PrepareTrainsEveryTurnOfAConversation) {
  const std::string input = *dir_ + "/chat.jsonl";
  const std::vector<std::string> prompts = {"The cat sat on the", " A dog ran in the", " Birds"},
                                 completions = {" mat.", "", " fly south."};  // the second reply is empty
  write_bytes(input, nlohmann::json{{"prompt", prompts}, {"completion", completions}}.dump() + "\n" +
                         nlohmann::json{{"prompt", {"The cat", "The dog"}}, {"completion", {"", ""}}}.dump() +
                         "\n");
  const PrepareOptions o = options("chat", input);
  const PrepareResult result = prepare_shards(o);
  EXPECT_EQ(result.documents, 1u);
  EXPECT_EQ(result.skipped, 1u);  // a conversation with no completion at all trains nothing
  auto tok = load_tokenizer(*tokenizer_);
  // Each later prompt is what the server's tokenisation of the conversation so far adds (here
  // it always extends the ids before it); each completion is tokenised on its own.
  std::vector<uint32_t> want_tokens;
  std::vector<uint8_t> want_mask;
  std::string text;
  std::vector<size_t> prompt_ends;
  for (size_t i = 0; i < prompts.size(); ++i) {
    text += prompts[i];
    const std::vector<int32_t> context = tok->encode(text, /*add_special=*/true);
    ASSERT_GE(context.size(), want_tokens.size());
    for (size_t k = 0; k < want_tokens.size(); ++k)
      ASSERT_EQ(uint32_t(context[k]), want_tokens[k]) << "turn " << i;
    for (size_t k = want_tokens.size(); k < context.size(); ++k) {
      want_tokens.push_back(uint32_t(context[k]));
      want_mask.push_back(0);
    }
    prompt_ends.push_back(want_tokens.size());
    for (int32_t id : tok->encode(completions[i])) {
      want_tokens.push_back(uint32_t(id));
      want_mask.push_back(1);
    }
    text += completions[i];
  }
  want_tokens.push_back(uint32_t(tok->eos_id()));
  want_mask.push_back(1);
  const ShardDataset ds = ShardDataset::open(o.out_dir);
  std::vector<uint32_t> got_tokens(size_t(ds.tokens()));
  std::vector<uint8_t> got_mask(got_tokens.size());
  ds.read(0, got_tokens.size(), got_tokens.data());
  ds.read_loss_mask(0, got_mask.size(), got_mask.data());
  EXPECT_EQ(got_tokens, want_tokens);
  EXPECT_EQ(got_mask, want_mask);
  EXPECT_EQ(std::count(want_tokens.begin(), want_tokens.end(), uint32_t(tok->bos_id())), 1);
  // The last reply is trained after exactly the ids the server gives the conversation's text.
  const std::vector<int32_t> served =
      tok->encode(text.substr(0, text.size() - completions.back().size()), true);
  ASSERT_EQ(served.size(), prompt_ends.back());
  for (size_t k = 0; k < served.size(); ++k) EXPECT_EQ(got_tokens[k], uint32_t(served[k])) << k;

  // zaya eval reads the same conversations from the JSONL: the same tokens and mask, and bits per
  // byte count the replies' bytes.
  EvalDataOptions eo;
  eo.prompt_field = "prompt";
  eo.completion_field = "completion";
  const EvalTokens ev = load_eval_tokens({input}, tok.get(), eo);
  EXPECT_EQ(std::vector<uint32_t>(ev.tokens.begin(), ev.tokens.end()), want_tokens);
  EXPECT_EQ(ev.target_mask, want_mask);
  EXPECT_EQ(ev.text_bytes, uint64_t(completions[0].size() + completions[2].size()));
  EXPECT_EQ(ev.document_starts, std::vector<uint64_t>{0});

  // Where the conversation's text tokenises differently across a join ("the" + "mat" reads as
  // "themat"), the later prompt is tokenised on its own.
  PromptCompletion joined;
  joined.turns = {{"The cat sat on the", "mat"}, {" and", " ran."}};
  {
    std::vector<int32_t> apart = tok->encode("The cat sat on the", true),
                         whole = tok->encode("The cat sat on themat and", true);
    const std::vector<int32_t> mat = tok->encode("mat");
    apart.insert(apart.end(), mat.begin(), mat.end());
    ASSERT_FALSE(whole.size() >= apart.size() && std::equal(apart.begin(), apart.end(), whole.begin()));
  }
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  ASSERT_TRUE(append_prompt_completion(*tok, joined, 2, 320, "test", ids, mask));
  std::vector<uint32_t> want;
  for (const auto& [piece, special] : std::vector<std::pair<std::string, bool>>{
           {"The cat sat on the", true}, {"mat", false}, {" and", false}, {" ran.", false}})
    for (int32_t id : tok->encode(piece, special)) want.push_back(uint32_t(id));
  want.push_back(2);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(mask.size(), ids.size());
}

TEST_F(SftData, PrepareErrorsNameTheFileAndTheField) {
  const std::string input = *dir_ + "/bad.jsonl";
  write_bytes(input, "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\", \"answer\": \"b\"}\n");
  expect_error([&] { prepare_shards(options("bad", input)); },
               {input + ":2", "no field 'completion'", "--completion-field"});
  // A record is two strings or two arrays of strings of one length; each error names the shape.
  for (const char* line :
       {"{\"prompt\": 3, \"completion\": \"b\"}", "{\"prompt\": [\"a\"], \"completion\": \"b\"}",
        "{\"prompt\": [\"a\", \"c\"], \"completion\": [\"b\"]}", "{\"prompt\": [], \"completion\": []}"}) {
    write_bytes(input, std::string(line) + "\n");
    expect_error([&] { prepare_shards(options("bad", input)); },
                 {input + ":1", "must both be strings, or both arrays of strings of the same length"});
  }
  write_bytes(input, "{\"prompt\": [\"a\", 1], \"completion\": [\"b\", \"c\"]}\n");
  expect_error([&] { prepare_shards(options("bad", input)); },
               {input + ":1", "turn 2 of 2 is not a pair of strings"});
  const std::string text = *dir_ + "/plain.txt";
  write_bytes(text, "a plain document");
  expect_error([&] { prepare_shards(options("bad", text)); }, {text, "needs JSONL records"});
  PrepareOptions one = options("bad", input);
  one.prompt_field = "";
  expect_error([&] { prepare_shards(one); }, {"both --prompt-field and --completion-field"});
  PrepareOptions same = options("bad", input);
  same.completion_field = "prompt";
  expect_error([&] { prepare_shards(same); }, {"are both 'prompt'"});
}

// The masked shard's header and sections are validated like the rest; each error names the file.
TEST_F(SftData, MaskCorruptionIsCaughtAndNamesTheFile) {
  const std::string dir = *dir_ + "/corrupt_src";
  fs::create_directories(dir);
  write_masked_dir(dir, 1 << 20);
  const std::string good = read_bytes(dir + "/train-00000.zshard");
  const std::string path = *dir_ + "/corrupt.zshard";
  auto open_expect = [&](const std::string& bytes, ShardVerify v, const std::vector<std::string>& parts) {
    write_bytes(path, bytes);
    std::vector<std::string> all = parts;
    all.push_back(path);
    expect_error([&] { ShardReader::open(path, v); }, all);
  };
  auto reencode = [](std::string bytes, const std::function<void(ShardHeader&)>& edit) {
    auto* p = reinterpret_cast<uint8_t*>(bytes.data());
    ShardHeader h = decode_shard_header_unchecked(p);
    edit(h);
    encode_shard_header(h, p, [](const void* d, size_t n) { return crc32c(d, n); });
    return bytes;
  };
  write_bytes(path, good);
  auto r = ShardReader::open(path, ShardVerify::Full);
  ASSERT_TRUE(r->has_loss_mask());
  const ShardHeader h = r->header();
  r.reset();

  std::string b = good;
  b[size_t(h.mask_offset + 3)] = 2;  // a mask byte that is neither 0 nor 1
  // (its CRC updated, so that the value check is what fails)
  b = reencode(b, [&](ShardHeader& x) {
    x.mask_crc = crc32c(reinterpret_cast<const uint8_t*>(b.data()) + h.mask_offset, size_t(h.mask_bytes));
  });
  open_expect(b, ShardVerify::Full, {"loss mask byte of token 3 is 2"});
  b = good;
  b[size_t(h.mask_offset + 5)] ^= 1;
  open_expect(b, ShardVerify::Full, {"loss mask section checksum mismatch"});
  open_expect(good.substr(0, good.size() - 1), ShardVerify::Structure, {"file size"});
  open_expect(reencode(good, [](ShardHeader& x) { x.mask_offset += 8; }), ShardVerify::Structure,
              {"loss mask section offset"});
  open_expect(reencode(good, [](ShardHeader& x) { x.mask_bytes -= 1; }), ShardVerify::Structure,
              {"loss mask section size"});
  // One encoding per shard: version 2 always has the mask flag, version 1 never.
  open_expect(reencode(good, [](ShardHeader& x) { x.version = 1; }), ShardVerify::Structure,
              {"header flags are 1, expected 0", "format version 1"});
  open_expect(reencode(good, [](ShardHeader& x) { x.flags = 3; }), ShardVerify::Structure,
              {"header flags are 3, expected 1"});
  open_expect(reencode(good, [](ShardHeader& x) { x.flags = 0; }), ShardVerify::Structure,
              {"header flags are 0, expected 1", "format version 2"});
  open_expect(reencode(good, [](ShardHeader& x) { x.version = 3; }), ShardVerify::Structure,
              {"format version 3", "newer zaya"});
  // A version 1 header with the mask fields set: they are reserved bytes there.
  open_expect(reencode(good, [](ShardHeader& x) { x.version = 1, x.flags = 0; }), ShardVerify::Structure,
              {"reserved header byte 96 is not zero"});
  open_expect(
      reencode(good, [](ShardHeader& x) { x.version = 1, x.flags = 0, x.mask_offset = x.mask_bytes = 0; }),
      ShardVerify::Structure, {"reserved header byte 112 is not zero"});

  // A manifest and its shards must agree on the mask.
  nlohmann::json m = nlohmann::json::parse(read_bytes(dir + "/manifest.json"));
  m.erase("loss_mask");
  write_bytes(dir + "/manifest.json", m.dump());
  expect_error([&] { ShardDataset::open(dir); },
               {dir + "/train-00000.zshard", "has a loss mask, but the manifest"});
  m["loss_mask"] = {{"prompt_field", "p"}};
  write_bytes(dir + "/manifest.json", m.dump());
  expect_error([&] { ShardDataset::open(dir); }, {"manifest.json", "loss_mask.completion_field"});
}

// Target t of a window is the token at t + 1, and it counts only where that token's mask byte
// is 1; the inputs are unchanged. Windows cross shard boundaries; the eval windows follow the
// same rule.
TEST_F(SftData, LoaderTargetsSkipPromptTokens) {
  const std::string dir = *dir_ + "/loader";
  fs::create_directories(dir);
  const auto docs = write_masked_dir(dir, 256);  // about 30 tokens per shard
  std::vector<uint32_t> all;
  std::vector<uint8_t> mask;
  for (const auto& [t, m] : docs) {
    all.insert(all.end(), t.begin(), t.end());
    mask.insert(mask.end(), m.begin(), m.end());
  }
  ShardDataset ds = ShardDataset::open(dir);
  ASSERT_GT(ds.shard_count(), 4u);
  std::vector<uint64_t> shard_starts = {0};  // global token offset of each shard
  for (size_t i = 0; i < ds.shard_count(); ++i)
    shard_starts.push_back(shard_starts.back() + ds.shard(i).tokens());
  std::vector<uint8_t> read_mask(mask.size());
  ds.read_loss_mask(0, mask.size(), read_mask.data());
  EXPECT_EQ(read_mask, mask);
  EXPECT_THROW(ds.read_loss_mask(mask.size() - 1, 2, read_mask.data()), Error);

  LoaderOptions lo;
  const int64_t T = 16;
  lo.phases = {PhaseSpec{"sft", 0, T, {{"sft", dir, 1.0}}, 0, 1}};
  lo.seed = 5;
  lo.micro_batch = 2;
  lo.prefetch = 0;
  Loader loader(lo);
  int64_t masked = 0, counted = 0, crossing = 0;
  for (int64_t s = 0; s < 30; ++s) {
    std::vector<int32_t> in(T), tg(T);
    const SampleRef ref = loader.read_sample(s, in.data(), tg.data());
    for (uint64_t b : shard_starts)  // a shard starts inside the window [start, start + T + 1)
      crossing += b > uint64_t(ref.start) && b <= uint64_t(ref.start) + uint64_t(T);
    for (int64_t t = 0; t < T; ++t) {
      const uint64_t at = ref.start + uint64_t(t);
      ASSERT_EQ(in[size_t(t)], int32_t(all[at])) << "sample " << s << " position " << t;
      const int32_t want = mask[at + 1] ? int32_t(all[at + 1]) : -1;
      ASSERT_EQ(tg[size_t(t)], want) << "sample " << s << " position " << t;
      (want < 0 ? masked : counted) += 1;
    }
  }
  EXPECT_GT(crossing, 5);  // windows across shard boundaries were among them
  EXPECT_GT(masked, 100);
  EXPECT_GT(counted, 100);

  EvalSet eval = EvalSet::open({DatasetSpec{"sft", dir, 1.0}}, T);
  ASSERT_EQ(eval.datasets(), 1u);
  std::vector<int32_t> in(T), tg(T);
  eval.fill(0, 1, 1, in.data(), tg.data());
  const ShardDataset val = ShardDataset::open(dir, {"val", std::nullopt, ShardVerify::Structure});
  std::vector<uint32_t> vt(T + 1);
  std::vector<uint8_t> vm(T + 1);
  val.read(uint64_t(T), uint64_t(T) + 1, vt.data());
  val.read_loss_mask(uint64_t(T), uint64_t(T) + 1, vm.data());
  for (int64_t t = 0; t < T; ++t)
    EXPECT_EQ(tg[size_t(t)], vm[size_t(t + 1)] ? int32_t(vt[size_t(t + 1)]) : -1);
}

// Held-out scoring with a target mask scores exactly the masked-in tokens: its loss sum is the
// sum of those tokens' losses, taken from an unmasked run one window at a time.
TEST_F(SftData, PerplexityScoresOnlyTheTargets) {
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(3);
  const int64_t T = 12, n = 40;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  for (int64_t i = 0; i < n; ++i) {
    tokens.push_back(int32_t((i * 37 + 5) % m.config().vocab_size));
    mask.push_back((i / 3) % 2 == 0 ? 1 : 0);
  }
  PerplexityOptions o;
  o.seq_len = T;
  o.batch = 2;
  o.target_mask = &mask;
  const PerplexityResult got = evaluate_perplexity(m, tokens, o);
  int64_t want_count = 0;
  for (int64_t i = 1; i < n; ++i) want_count += mask[size_t(i)];
  EXPECT_EQ(got.scored_tokens, want_count);
  // The same sum token by token: each scored position alone, with its window's context.
  double want_sum = 0;
  for (int64_t w = 0; w * T < n - 1; ++w) {
    std::vector<int32_t> ids(T, 0), tg(T, -1);
    for (int64_t t = 0; t < T && w * T + t < n; ++t) ids[size_t(t)] = tokens[size_t(w * T + t)];
    for (int64_t t = 0; t < T && w * T + t + 1 < n; ++t)
      if (mask[size_t(w * T + t + 1)]) tg[size_t(t)] = tokens[size_t(w * T + t + 1)];
    int64_t c = 0;
    want_sum += eval_loss_sum(m, ids.data(), tg.data(), 1, T, &c);
  }
  EXPECT_NEAR(got.loss_sum, want_sum, 1e-5 * std::abs(want_sum));
  EXPECT_NEAR(got.loss, want_sum / double(want_count), 1e-5);
  o.target_mask = nullptr;
  const PerplexityResult unmasked = evaluate_perplexity(m, tokens, o);
  EXPECT_EQ(unmasked.scored_tokens, n - 1);
  EXPECT_GT(std::abs(unmasked.loss_sum - got.loss_sum), 1.0);
  std::vector<uint8_t> none(size_t(n), 0);
  o.target_mask = &none;
  expect_error([&] { evaluate_perplexity(m, tokens, o); }, {"no scored token"});
}

// With document starts, each document of a window runs alone: the loss over a window of three
// documents (each one's first token not scored, so no target crosses a boundary) is the sum of
// the three scored one by one; without them, later documents see the earlier ones.
TEST_F(SftData, PerplexityWithDocumentResetsScoresEachDocumentAlone) {
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(8);
  const std::vector<int64_t> lengths = {7, 12, 9};
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<uint64_t> starts;
  std::vector<std::vector<int32_t>> docs;
  for (size_t d = 0; d < lengths.size(); ++d) {
    starts.push_back(tokens.size());
    docs.emplace_back();
    for (int64_t i = 0; i < lengths[d]; ++i) {
      docs.back().push_back(int32_t((d * 101 + size_t(i) * 29 + 3) % size_t(m.config().vocab_size)));
      tokens.push_back(docs.back().back());
      mask.push_back(i == 0 ? 0 : 1);
    }
  }
  PerplexityOptions o;
  o.seq_len = 32;
  o.target_mask = &mask;
  o.document_starts = &starts;
  const PerplexityResult together = evaluate_perplexity(m, tokens, o);
  double alone = 0;
  int64_t alone_count = 0;
  for (const auto& doc : docs) {
    std::vector<uint8_t> doc_mask(doc.size(), 1);
    doc_mask[0] = 0;
    PerplexityOptions one;
    one.seq_len = 32;
    one.target_mask = &doc_mask;
    const PerplexityResult r = evaluate_perplexity(m, doc, one);
    alone += r.loss_sum;
    alone_count += r.scored_tokens;
  }
  EXPECT_EQ(together.scored_tokens, alone_count);
  EXPECT_NEAR(together.loss_sum, alone, 1e-4 * std::abs(alone));
  o.document_starts = nullptr;
  const PerplexityResult packed = evaluate_perplexity(m, tokens, o);
  EXPECT_GT(std::abs(packed.loss_sum - alone), 1e-2);
}

// Document resets across windows and batch rows: windows of 8, two per pass; documents that end
// at a window's end, start at its first position, start exactly at its end, and straddle two
// windows. Reference: every window cut at its document starts, each piece scored alone (its last
// position predicts the window's next token, as in the window).
TEST_F(SftData, PerplexityResetsFollowDocumentsAcrossWindowsAndRows) {
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(12);
  const std::vector<uint64_t> starts = {0, 5, 8, 13, 16, 22};
  const int64_t n = 27, T = 8;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  for (int64_t i = 0; i < n; ++i) {
    tokens.push_back(int32_t((i * 53 + 7) % m.config().vocab_size));
    mask.push_back(std::count(starts.begin(), starts.end(), uint64_t(i)) ? 0
                                                                         : 1);  // no target across documents
  }
  PerplexityOptions o;
  o.seq_len = T;
  o.batch = 2;
  o.target_mask = &mask;
  o.document_starts = &starts;
  const PerplexityResult got = evaluate_perplexity(m, tokens, o);
  double want = 0;
  int64_t want_count = 0;
  for (int64_t first = 0; first < n - 1; first += T) {
    const int64_t end = std::min(first + T, n);
    std::vector<int64_t> cuts = {first};
    for (uint64_t s0 : starts)
      if (int64_t(s0) > first && int64_t(s0) < end) cuts.push_back(int64_t(s0));
    cuts.push_back(end);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int64_t a = cuts[c], b = cuts[c + 1], len = b - a;
      std::vector<int32_t> ids(tokens.begin() + a, tokens.begin() + b), tg(size_t(len), -1);
      for (int64_t t = 0; t < len; ++t)
        if (a + t + 1 < n && mask[size_t(a + t + 1)]) tg[size_t(t)] = tokens[size_t(a + t + 1)];
      want += eval_loss_sum(m, ids.data(), tg.data(), 1, len, &want_count);
    }
  }
  EXPECT_EQ(got.scored_tokens, want_count);
  EXPECT_NEAR(got.loss_sum, want, 1e-4 * std::abs(want));
  const std::vector<uint64_t> unsorted = {0, 8, 5};
  o.document_starts = &unsorted;
  expect_error([&] { evaluate_perplexity(m, tokens, o); }, {"not in ascending order"});
}

// The trainer's first step on masked data: its logged loss is the mean over the completions'
// targets, and its gradient (the logged norm, clipping off) is that mean's gradient, computed
// here from the same micro-batches the loader gives.
TEST_F(SftData, TrainerStepIsTheMeanOverCompletionTargets) {
  const std::string dir = test::fresh_dir("sft", "trainer");
  fs::create_directories(dir + "/data");
  write_masked_dir(dir + "/data", 4096);
  auto be = make_cpu_backend();
  Recipe r = sft_recipe(dir, 21, *be);
  r.seed = 9;
  r.batch.global_batch = 4;
  r.optimizer.clip_grad_norm = 0;
  r.schedule.total_steps = 1;
  TrainOptions quiet;
  quiet.quiet = true;
  train(r, quiet);
  std::ifstream metrics(r.run_dir + "/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  const nlohmann::json rec = nlohmann::json::parse(line);

  LoaderOptions lo;
  lo.phases = recipe_phases(r);
  lo.seed = uint64_t(r.seed);
  lo.micro_batch = r.batch.micro_batch;
  lo.prefetch = 0;
  lo.global_batch = [&](int64_t) { return r.batch.global_batch; };
  Loader loader(lo);
  const int64_t B = r.batch.micro_batch, T = r.data.seq_len;
  std::vector<std::vector<int32_t>> ins, tgs;
  int64_t targets = 0;
  for (int64_t mb = 0; mb < r.batch.global_batch / B; ++mb) {
    ins.emplace_back(size_t(B * T));
    tgs.emplace_back(size_t(B * T));
    loader.next(ins.back().data(), tgs.back().data());
    for (int32_t t : tgs.back()) targets += t >= 0;
  }
  ASSERT_GT(targets, 0);
  ASSERT_LT(targets, r.batch.global_batch * T / 4 * 3);  // a good share of the positions is prompt
  Model m(preset_config("zaya-tiny"), *be);
  load_weights(m, dir + "/init");
  std::vector<float> grads(size_t(m.layout().total), 0.0f);
  double loss_sum = 0;
  for (size_t mb = 0; mb < ins.size(); ++mb)
    loss_sum += m.forward_backward(ins[mb].data(), tgs[mb].data(), B, T, grads.data(), 1.0f / float(targets))
                    .loss_sum;
  double sq = 0;
  for (float g : grads) sq += double(g) * double(g);
  EXPECT_NEAR(rec.at("loss").get<double>(), loss_sum / double(targets), 1e-5);
  EXPECT_NEAR(rec.at("grad_norm").get<double>(), std::sqrt(sq), 1e-4 * std::sqrt(sq));
  fs::remove_all(dir);
}

// A step whose batch holds no target (all prompt) is not a fault: no update, no bad-step count
// (so no rollback, which would need a checkpoint), an event without a loss in metrics.jsonl,
// and the run still resumes from its log.
TEST_F(SftData, AStepWithoutTargetsIsSkippedAndTheRunResumes) {
  const std::string dir = test::fresh_dir("sft", "no_targets");
  fs::create_directories(dir + "/data");
  write_masked_dir(dir + "/data", 4096, /*all_prompt=*/true);
  auto be = make_cpu_backend();
  Recipe r = sft_recipe(dir, 4, *be);
  r.schedule.total_steps = 3;
  r.checkpoint.every = 1;
  r.logging.plot = true;
  r.stability.policy = "rollback";
  r.stability.max_bad_steps = 1;
  TrainOptions quiet;
  quiet.quiet = true;
  TrainOptions two = quiet;
  two.stop_after_steps = 2;
  train(r, two);
  const TrainSummary s = train(r, quiet);  // resumes at step 2, reading its log back
  EXPECT_EQ(s.steps, 3);
  std::ifstream metrics(r.run_dir + "/metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(metrics, line); ++records) {
    const nlohmann::json rec = nlohmann::json::parse(line);
    EXPECT_EQ(rec.at("event"), "no_targets") << line;
    EXPECT_FALSE(rec.contains("loss")) << line;
  }
  EXPECT_EQ(records, 3);
  // No update: the exported weights are the ones the run started from.
  auto init = load_model(dir + "/init", *be), trained = load_model(r.run_dir + "/model", *be);
  ASSERT_EQ(trained->layout().total, init->layout().total);
  EXPECT_TRUE(std::equal(init->params(), init->params() + init->layout().total, trained->params()));
  fs::remove_all(dir);
}

// A resumed run reads its metrics back: a loss or held-out loss written as null (a skipped
// step's NaN; an evaluation with nothing to score) or left out (a step without targets) reads
// as NaN, and lines past the resumed step are dropped.
TEST(SftResume, TheLossCurveReadsNullAndMissingLossesAsNan) {
  const std::string dir = test::fresh_dir("sft", "curve");
  const std::string path = dir + "/metrics.jsonl";
  std::ofstream(path) << "{\"step\": 1, \"loss\": 2.5}\n"
                      << "{\"step\": 2, \"loss\": null, \"event\": \"bad_step\"}\n"
                      << "{\"step\": 3, \"event\": \"no_targets\", \"val_loss\": null}\n"
                      << "{\"step\": 4, \"loss\": 1.5, \"val_loss\": 1.25}\n"
                      << "{\"step\": 5, \"loss\": 1.0}\n";
  LossCurve curve;
  reload_curve(path, 4, &curve);
  ASSERT_EQ(curve.steps, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(curve.train_loss[0], 2.5);
  EXPECT_TRUE(std::isnan(curve.train_loss[1]));
  EXPECT_TRUE(std::isnan(curve.train_loss[2]));
  EXPECT_EQ(curve.train_loss[3], 1.5);
  ASSERT_EQ(curve.val_steps, (std::vector<double>{3, 4}));
  EXPECT_TRUE(std::isnan(curve.val_loss[0]));
  EXPECT_EQ(curve.val_loss[1], 1.25);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zaya
