// `zaya data stats --recipe`: mixture-weighted totals per phase from real shard directories.
#include <gtest/gtest.h>

#include <filesystem>

#include "data/phase_report.h"
#include "data/shard_writer.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;

// A shard directory with `docs` documents of `len` tokens (+ EOS) in its train split.
std::string make_dataset(const std::string& name, int docs, int len) {
  const std::string dir = (fs::temp_directory_path() / ("zaya_phase_report_" + name)).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  Manifest m;
  m.vocab_size = 64;
  m.eos_id = 1;
  ShardWriter w({dir, "train", 4096, 0, 64});
  for (int d = 0; d < docs; ++d) {
    std::vector<uint32_t> doc(static_cast<size_t>(len), uint32_t(2 + d % 60));
    doc.push_back(1);
    w.add_document(doc, name);
  }
  m.splits["train"] = w.finish();
  write_manifest(dir, m);
  return dir;
}

TEST(PhaseReport, SharesTokensAndEpochsPerPhase) {
  const std::string a = make_dataset("a", 100, 99), b = make_dataset("b", 50, 99);  // 10,000 and 5,000 tokens
  std::vector<PhaseSpec> phases = {{"one", 4000, 40, {{"a", a, 1.0}}, 0, 1},
                                   {"two", 0, 80, {{"a", a, 1.0}, {"b", b, 3.0}}, 1e5, 0.5}};
  auto rows = phase_mixture(phases, 8000);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].dataset, "a");
  EXPECT_DOUBLE_EQ(rows[0].share, 1.0);
  EXPECT_DOUBLE_EQ(rows[0].tokens, 4000);
  EXPECT_EQ(rows[0].available, 10000u);
  EXPECT_DOUBLE_EQ(rows[0].epochs, 0.4);
  EXPECT_NEAR(rows[1].share, 0.25, 1e-4);  // weights 1 : 3, exact per 65,536-sample block
  EXPECT_NEAR(rows[2].share, 0.75, 1e-4);
  EXPECT_DOUBLE_EQ(rows[1].share + rows[2].share, 1.0);
  EXPECT_NEAR(rows[2].tokens, 6000, 1);
  EXPECT_NEAR(rows[2].epochs, 1.2, 1e-3);
  const std::string text = format_phase_mixture(phases, rows, 8000);
  EXPECT_NE(text.find("phase 2 'two': 8000 tokens (to the end of the schedule) at seq_len 80"), std::string::npos)
      << text;
  EXPECT_NE(text.find("whole run (mixture-weighted)"), std::string::npos);
  EXPECT_NE(text.find("total                      12000 tokens"), std::string::npos) << text;  // 4000 + 8000
  EXPECT_NE(text.find("a                           6000 tokens   50.00%"), std::string::npos) << text;
  // No assumed length for the open-ended phase: shares only, no tokens.
  EXPECT_DOUBLE_EQ(phase_mixture(phases, 0)[2].tokens, 0);
}

}  // namespace
}  // namespace zaya
