// Context parallelism (model/context_parallel.h): the zig-zag layout, and a training step split
// over R in-process ranks (threads exchanging messages) equals the whole-sequence step: the same
// loss and routing, and gradients that sum to the whole step's within float rounding; with
// activation recomputation each rank's step is bitwise the same.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <thread>

#include "../common/error_of.h"
#include "../common/thread_comm.h"
#include "core/error.h"
#include "model/chunk_segments.h"
#include "model/context_parallel.h"
#include "model/model.h"
#include "test_helpers.h"

namespace zaya {
namespace {

TEST(ContextParallel, ZigZagChunksBalanceTheCausalWork) {
  test::ThreadCommGroup group(4);
  auto be = make_cpu_backend();
  // Ranks 0..3 of one group of 4 (and of two groups of 2).
  const int expect4[4][2] = {{0, 7}, {1, 6}, {2, 5}, {3, 4}};
  for (int r = 0; r < 4; ++r) {
    test::ThreadComm comm(group, r);
    ContextParallel cp(comm, 4, *be);
    EXPECT_EQ(cp.index(), r);
    EXPECT_EQ(cp.group(), 0);
    EXPECT_EQ(cp.chunk_of_slot(0), expect4[r][0]);
    EXPECT_EQ(cp.chunk_of_slot(1), expect4[r][1]);
    EXPECT_EQ(cp.owner_of(cp.chunk_of_slot(0)), r);
    EXPECT_EQ(cp.owner_of(cp.chunk_of_slot(1)), r);
    EXPECT_EQ(cp.chunk_of_row(2, 3), expect4[r][0]);  // rows are slot-major: 3 sequences per slot
    EXPECT_EQ(cp.chunk_of_row(3, 3), expect4[r][1]);
    ContextParallel half(comm, 2, *be);
    EXPECT_EQ(half.group(), r / 2);
    EXPECT_EQ(half.groups(), 2);
    EXPECT_EQ(half.index(), r % 2);
  }
  // split: rank 1 of 2 holds chunks 1 and 2 of every sequence (slot-major rows).
  test::ThreadComm comm(group, 1);
  ContextParallel cp(comm, 2, *be);
  std::vector<int32_t> full(16);
  for (int i = 0; i < 16; ++i) full[size_t(i)] = i;
  EXPECT_EQ(cp.split(full.data(), 2, 8), (std::vector<int32_t>{2, 3, 10, 11, 4, 5, 12, 13}));
  EXPECT_EQ(cp.chunk_len(8), 2);
  std::string msg = test::error_of([&] { cp.chunk_len(10); });
  EXPECT_NE(msg.find("sequence length 10 is not a multiple of 2 x parallel.context_parallel (4)"), std::string::npos)
      << msg;
  msg = test::error_of([&] { ContextParallel bad(comm, 3, *be); });
  EXPECT_NE(msg.find("parallel.context_parallel = 3 does not divide the 4 ranks"), std::string::npos) << msg;
}

struct StepResult {
  StepStats stats;
  std::vector<float> grads;
};

ModelConfig cp_config() {
  ModelConfig c = preset_config("zaya-tiny");
  c.layer_types = {"hybrid", "hybrid_sliding"};  // a sliding layer whose window is shorter than T
  c.sliding_window = 5;
  return c;
}

// One rank's step: its chunks of the batch, with context parallelism over `group`.
StepResult cp_step(int R, int rank, test::ThreadCommGroup& group, const std::vector<int32_t>& ids,
                   const std::vector<int32_t>& targets, const std::vector<int32_t>& starts, int64_t B,
                   int64_t T, float scale, int64_t* messages, bool recompute = false) {
  auto be = make_cpu_backend();
  Model model(cp_config(), *be);
  model.init_random(7);
  model.set_activation_recompute(recompute);
  test::ThreadComm comm(group, rank);
  ContextParallel cp(comm, R, *be);
  const std::vector<int32_t> my_ids = cp.split(ids.data(), B, T), my_targets = cp.split(targets.data(), B, T);
  const std::vector<int32_t> my_starts = starts.empty() ? starts : cp.split(starts.data(), B, T);
  StepResult out;
  out.grads.assign(size_t(model.layout().total), 0.0f);
  out.stats =
      model.forward_backward(my_ids.data(), my_targets.data(), 2 * B, cp.chunk_len(T), out.grads.data(),
                             scale, my_starts.empty() ? nullptr : my_starts.data(), {}, &cp);
  *messages = cp.messages();
  return out;
}

// Document starts of packed rows (reset_at_document_boundary), as the loader builds them: each
// token's document start within its row.
std::vector<int32_t> starts_of(const std::vector<std::vector<int64_t>>& docs, int64_t B, int64_t T) {
  std::vector<int32_t> starts(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t start = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d : docs[size_t(b)])
        if (d == t) start = int32_t(t);
      starts[size_t(b * T + t)] = start;
    }
  }
  return starts;
}

enum class Documents { Whole, Packed, Sparse };
void PrintTo(Documents d, std::ostream* os) {
  *os << (d == Documents::Whole    ? "whole sequences"
          : d == Documents::Packed ? "packed documents"
                                   : "sparse documents");
}

// Whole: no resets. Packed: row 0's documents begin at chunk starts for R = 2 and 4 (4, 8) and
// just before them (3: the rows a chunk receives straddle a start; 13); row 1's begin at the
// last token of a chunk (7), one position later (9, the second of a chunk of 2) and at 14; every
// rank's chunks hold a start. Sparse: starts at 9 and 10 only, so that for R = 2 and 4 some
// ranks' chunks (and the rows they receive) hold none and take the plain convolution.
std::vector<int32_t> document_starts(Documents docs, int64_t B, int64_t T) {
  switch (docs) {
    case Documents::Whole:
      return {};
    case Documents::Packed:
      return starts_of({{0, 3, 4, 8, 13}, {0, 7, 9, 14}}, B, T);
    case Documents::Sparse:
      return starts_of({{0, 9}, {0, 10}}, B, T);
  }
  return {};
}

// How many ranks of a group of R take the convolution with a start table (chunk_segments.h).
int ranks_whose_conv_has_starts(const std::vector<int32_t>& starts, int R, int64_t B, int64_t T, int64_t P) {
  test::ThreadCommGroup group(R);
  auto be = make_cpu_backend();
  int with_starts = 0;
  for (int r = 0; r < R; ++r) {
    test::ThreadComm comm(group, r);
    ContextParallel cp(comm, R, *be);
    const std::vector<int32_t> mine = cp.split(starts.data(), B, T);
    const int64_t Tc = cp.chunk_len(T);
    std::vector<int64_t> pos0(size_t(2 * B));
    for (int64_t i = 0; i < 2 * B; ++i) pos0[size_t(i)] = cp.chunk_of_row(i, B) * Tc;
    with_starts += chunk_segments(mine.data(), pos0.data(), 2 * B, Tc, P).conv_has_starts ? 1 : 0;
  }
  return with_starts;
}

class ContextParallelSteps : public ::testing::TestWithParam<Documents> {};

TEST_P(ContextParallelSteps, SplitStepEqualsTheWholeSequenceStep) {
  const bool resets = GetParam() != Documents::Whole;
  const int64_t B = 2, T = 16;
  const ModelConfig c = cp_config();
  Rng rng(3);
  std::vector<int32_t> ids(size_t(B * T)), targets(size_t(B * T));
  for (auto& x : ids) x = int32_t(rng.next_u64() % uint64_t(c.vocab_size));
  for (size_t i = 0; i < ids.size(); ++i) targets[i] = (i + 1) % size_t(T) == 0 ? -1 : ids[i + 1];
  targets[3] = -1;  // an uncounted target inside a chunk
  const float scale = 1.0f / float(B * T);
  const std::vector<int32_t> starts = document_starts(GetParam(), B, T);

  auto be = make_cpu_backend();
  Model whole(c, *be);
  whole.init_random(7);
  std::vector<float> ref(size_t(whole.layout().total), 0.0f);
  const StepStats ref_stats = whole.forward_backward(ids.data(), targets.data(), B, T, ref.data(), scale,
                                                     resets ? starts.data() : nullptr);
  if (resets) {  // the resets change the gradients (else the comparison below would not test them)
    std::vector<float> plain(ref.size(), 0.0f);
    whole.forward_backward(ids.data(), targets.data(), B, T, plain.data(), scale);
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(double(ref[i])));
      max_diff = std::max(max_diff, std::fabs(double(plain[i]) - ref[i]));
    }
    EXPECT_GT(max_diff / max_ref, 1e-2);
  }

  for (int R : {1, 2, 4}) {  // R = 4: chunks of 2 tokens, exactly the conv's carried rows
    SCOPED_TRACE(::testing::Message() << "context_parallel " << R);
    if (resets && R > 1) {  // the layouts reach the convolution paths they are meant to
      const int with_starts = ranks_whose_conv_has_starts(starts, R, B, T, c.conv_state_rows());
      if (GetParam() == Documents::Packed) {
        EXPECT_EQ(with_starts, R);
      } else {
        EXPECT_GT(R - with_starts, 0);
      }
      EXPECT_GT(with_starts, 0);
    }
    // Every rank's step, keeping every activation or (recompute) rerunning each block's forward,
    // with its exchanges, before the block's backward.
    const auto run_group = [&](bool recompute, std::vector<int64_t>& messages) {
      test::ThreadCommGroup group(R);
      std::vector<StepResult> res(static_cast<size_t>(R));
      messages.assign(static_cast<size_t>(R), 0);
      std::vector<std::exception_ptr> errors(static_cast<size_t>(R));
      std::vector<std::thread> threads;
      for (int r = 0; r < R; ++r)
        threads.emplace_back([&, r] {
          try {
            res[size_t(r)] =
                cp_step(R, r, group, ids, targets, starts, B, T, scale, &messages[size_t(r)], recompute);
          } catch (...) {
            errors[size_t(r)] = std::current_exception();
          }
        });
      for (auto& t : threads) t.join();
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
      return res;
    };
    std::vector<int64_t> messages, messages_recompute;
    const std::vector<StepResult> res = run_group(false, messages);
    const std::vector<StepResult> again = run_group(true, messages_recompute);
    for (int r = 0; r < R; ++r) {  // recomputation changes no bit of any rank's step
      const StepResult &a = res[size_t(r)], &b = again[size_t(r)];
      EXPECT_EQ(a.stats.loss_sum, b.stats.loss_sum) << "rank " << r;
      EXPECT_EQ(a.stats.expert_counts, b.stats.expert_counts) << "rank " << r;
      ASSERT_EQ(a.grads.size(), b.grads.size());
      EXPECT_EQ(std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)), 0)
          << "rank " << r << ": gradients differ with activation recomputation";
      // The rerun forwards exchange their boundary rows, keys and values again.
      if (R > 1) {
        EXPECT_GT(messages_recompute[size_t(r)], messages[size_t(r)]) << "rank " << r;
      }
    }

    double loss = 0;
    int64_t tokens = 0;
    std::vector<int64_t> counts(ref_stats.expert_counts.size(), 0);
    std::vector<double> grads(ref.size(), 0.0);
    for (const StepResult& r : res) {
      loss += r.stats.loss_sum;
      tokens += r.stats.tokens;
      for (size_t i = 0; i < counts.size(); ++i) counts[i] += r.stats.expert_counts[i];
      for (size_t i = 0; i < grads.size(); ++i) grads[i] += r.grads[i];
    }
    EXPECT_EQ(tokens, ref_stats.tokens);
    EXPECT_NEAR(loss, ref_stats.loss_sum, 1e-5 * std::fabs(ref_stats.loss_sum));
    EXPECT_EQ(counts, ref_stats.expert_counts);
    int checked = 0;
    for (const ParamSpec& p : whole.layout().params) {
      if (p.kind == ParamKind::Buffer) continue;
      double max_ref = 0, max_diff = 0;
      for (int64_t k = 0; k < p.numel; ++k) {
        const size_t at = size_t(p.offset + k);
        max_ref = std::max(max_ref, std::fabs(double(ref[at])));
        max_diff = std::max(max_diff, std::fabs(grads[at] - double(ref[at])));
      }
      ASSERT_GT(max_ref, 0.0) << p.name;
      EXPECT_LT(max_diff / max_ref, 1e-5) << p.name << ": max|diff| " << max_diff << " max|ref| " << max_ref;
      ++checked;
    }
    EXPECT_GT(checked, 20);
    // Per layer: the boundary pass forward and back, and K and V gathered and reduced.
    if (R > 1) {
      for (int64_t m : messages) EXPECT_GT(m, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DocumentResets, ContextParallelSteps,
                         ::testing::Values(Documents::Whole, Documents::Packed, Documents::Sparse),
                         [](const ::testing::TestParamInfo<Documents>& info) {
                           switch (info.param) {
                             case Documents::Whole:
                               return "WholeSequences";
                             case Documents::Packed:
                               return "PackedDocuments";
                             case Documents::Sparse:
                               return "SparseDocuments";
                           }
                           return "";
                         });

// A chunk's document-start table must hold positions within the whole sequence.
TEST(ContextParallel, ChunkStartTablesAreCheckedAndRestated) {
  const int64_t pos0[2] = {4, 12};
  // Row 0 (positions 4..7): its first document began at 3 (among the 2 received rows), the
  // next at 6. Row 1 (positions 12..15): a document begins at its first token.
  const std::vector<int32_t> good = {3, 3, 6, 6, 12, 12, 12, 15};
  const ChunkSegments cs = chunk_segments(good.data(), pos0, 2, 4, 2);
  EXPECT_EQ(cs.relative, (std::vector<int32_t>{-1, -1, 2, 2, 0, 0, 0, 3}));
  EXPECT_EQ(cs.starts_at_chunk, (std::vector<uint8_t>{0, 1}));
  // Extended rows of row 0 are positions 2..7: received row 2 belongs to an earlier document,
  // row 3 begins the first one. Row 1's received rows (10, 11) precede its first document.
  EXPECT_EQ(cs.extended, (std::vector<int32_t>{0, 1, 1, 1, 4, 4, 0, 0, 2, 2, 2, 5}));
  EXPECT_TRUE(cs.conv_has_starts);
  // One document over the received rows and the chunk: the plain convolution serves.
  const std::vector<int32_t> one_document = {1, 1, 1, 1, 9, 9, 9, 9};
  const ChunkSegments plain = chunk_segments(one_document.data(), pos0, 2, 4, 2);
  EXPECT_EQ(plain.extended, std::vector<int32_t>(12, 0));
  EXPECT_FALSE(plain.conv_has_starts);
  // The first chunk: a document beginning at position 0 covers the (zero) received rows too.
  const int64_t first_pos0[2] = {0, 0};
  const std::vector<int32_t> first_chunk = {0, 0, 0, 0, 0, 0, 2, 2};
  const ChunkSegments first = chunk_segments(first_chunk.data(), first_pos0, 2, 4, 2);
  EXPECT_EQ(first.extended, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4}));
  EXPECT_EQ(first.starts_at_chunk, (std::vector<uint8_t>{1, 1}));
  EXPECT_TRUE(first.conv_has_starts);
  EXPECT_FALSE(chunk_segments(first_chunk.data(), first_pos0, 1, 4, 2).conv_has_starts);
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{3, 3, 5, 5, 12, 12, 12, 15},  // 5 is not a start
        std::vector<int32_t>{8, 8, 8, 8, 12, 12, 12, 12},  // after position 4
        std::vector<int32_t>{-1, -1, -1, -1, 12, 12, 12, 12}}) {
    try {
      chunk_segments(bad.data(), pos0, 2, 4, 2);
      ADD_FAILURE() << "a bad table was accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("document start table of context-parallel chunk row 0"), std::string::npos)
          << e.message();
    }
  }
}

}  // namespace
}  // namespace zaya
