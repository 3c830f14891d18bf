// ZeRO-1 / distributed Muon without MPI: the ownership that DataParallel computes, simulated
// for 1, 2 and 3 ranks in one process. Every tensor has one owner, Newton-Schulz runs exactly
// once per matrix per step across the ranks, and the owners' updates put together equal the
// single-process optimizer step bit for bit. The gradient buckets tile the layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "backend/backend.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "model/config.h"
#include "model/params.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"

namespace zaya {
namespace {

TEST(DataParallel, DistributedMuonEqualsSingleProcessAndRunsNewtonSchulzOnce) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  auto be = make_cpu_backend();
  std::vector<float> p0(static_cast<size_t>(L.total)), g1(p0.size()), g2(p0.size());
  Rng rng(5);
  for (auto& x : p0) x = float(rng.normal() * 0.05);
  for (auto& x : g1) x = float(rng.normal());
  for (auto& x : g2) x = float(rng.normal());

  std::vector<float> want = p0;
  Optimizer full(L, OptimizerConfig{}, *be);
  full.step(want.data(), g1.data(), 1e-2f);
  full.step(want.data(), g2.data(), 1e-2f);

  for (int R : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << R << " ranks");
    const std::vector<int> owner = assign_tensor_owners(L, 5, R);
    ASSERT_EQ(owner.size(), L.params.size());
    std::vector<float> got = p0;
    std::map<std::pair<size_t, int64_t>, int64_t> ns;  // (tensor, expert) -> NS calls over ranks
    std::vector<double> load(size_t(R), 0.0);
    for (int r = 0; r < R; ++r) {
      std::vector<bool> mine(L.params.size());
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = owner[i] == r;
      Optimizer part(L, OptimizerConfig{}, *be, mine);
      std::vector<float> local = p0;  // every rank starts from the same parameters
      part.step(local.data(), g1.data(), 1e-2f);
      part.step(local.data(), g2.data(), 1e-2f);
      for (size_t i = 0; i < L.params.size(); ++i)
        if (mine[i]) {
          const ParamSpec& p = L.params[i];
          std::copy(local.begin() + p.offset, local.begin() + p.offset + p.numel, got.begin() + p.offset);
          load[size_t(r)] += optimizer_cost(p, 5);
        }
      for (size_t k = 0; k < part.muon_matrices().size(); ++k)
        ns[{part.muon_matrices()[k].param, part.muon_matrices()[k].expert}] += part.ns_calls()[k];
    }
    EXPECT_EQ(got, want);  // bit for bit: the same ops on the same data
    ASSERT_EQ(ns.size(), full.muon_matrices().size());
    for (const auto& [key, calls] : ns) EXPECT_EQ(calls, 2) << L.params[key.first].name << " expert " << key.second;
    if (R > 1) {  // bin packing spreads the Newton-Schulz work
      const double hi = *std::max_element(load.begin(), load.end()), lo = *std::min_element(load.begin(), load.end());
      EXPECT_GT(lo, 0.5 * hi);
    }
  }
}

TEST(DataParallel, OwnershipIsDeterministicAndCovered) {
  ModelConfig c = preset_config("zaya-small");
  ParamLayout L = build_param_layout(c);
  for (int R : {1, 2, 3, 7}) {
    auto a = assign_tensor_owners(L, 5, R), b = assign_tensor_owners(L, 5, R);
    EXPECT_EQ(a, b);
    std::set<int> used(a.begin(), a.end());
    for (int o : a) EXPECT_TRUE(o >= 0 && o < R);
    EXPECT_EQ(int(used.size()), R);
  }
}

TEST(DataParallel, SingleProcessBucketsCoverTheLayoutAndKeepGradients) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  auto comm = make_single_comm();
  DataParallelOptions o;
  o.bucket_bytes = 16 << 10;
  DataParallel dp(*comm, L, 5, o);
  EXPECT_GT(dp.buckets(), 2);
  std::vector<float> g(static_cast<size_t>(L.total));
  Rng rng(3);
  for (auto& x : g) x = float(rng.normal());
  const std::vector<float> before = g;
  dp.begin_step(g.data());
  for (int64_t l = c.num_hidden_layers - 1; l >= 0; --l) dp.block_done(l);
  dp.finish_gradients();
  EXPECT_EQ(g, before);
  auto be = make_cpu_backend();
  double ss = 0;
  for (const ParamSpec& p : L.params)
    for (int64_t i = 0; i < p.numel; ++i) ss += double(g[size_t(p.offset + i)]) * g[size_t(p.offset + i)];
  EXPECT_NEAR(dp.grad_sum_squares(*be, g.data()), ss, 1e-9 * ss);
  for (size_t i = 0; i < L.params.size(); ++i) EXPECT_TRUE(dp.owns(i));
}

// A communicator of one rank that records when reduce-scatters are issued, to see buckets
// start during the backward (overlap) rather than all at the end.
// Rank 0 of `ranks`: records the reduce-scatters (total floats over ranks, in issue order) and
// completes them at once without touching the buffers.
class RecordingComm : public Comm {
 public:
  explicit RecordingComm(int ranks = 2) : ranks_(ranks) {}
  std::string name() const override { return "recording"; }
  int rank() const override { return 0; }
  int size() const override { return ranks_; }
  std::vector<int64_t> issued;
  CommHandle all_reduce(const void* s, void* r, int64_t n, CommType t, ReduceOp o) override {
    return inner_->all_reduce(s, r, n, t, o);
  }
  CommHandle reduce_scatter(const void* s, void* r, const std::vector<int64_t>& c, CommType t, ReduceOp o) override {
    (void)s, (void)r, (void)t, (void)o;
    int64_t total = 0;
    for (int64_t n : c) total += n;
    issued.push_back(total);
    return std::make_unique<Done>();
  }
  CommHandle all_gather(const void* s, void* r, const std::vector<int64_t>& c, CommType t) override {
    return inner_->all_gather(s, r, c, t);
  }
  CommHandle broadcast(void* b, int64_t n, CommType t, int root) override { return inner_->broadcast(b, n, t, root); }
  CommHandle barrier() override { return inner_->barrier(); }
  CommHandle send(const void* b, int64_t n, CommType t, int p, int tag) override { return inner_->send(b, n, t, p, tag); }
  CommHandle recv(void* b, int64_t n, CommType t, int p, int tag) override { return inner_->recv(b, n, t, p, tag); }

 private:
  struct Done : CommRequest {
    void wait() override {}
    bool test() override { return true; }
  };
  int ranks_;
  std::unique_ptr<Comm> inner_ = make_single_comm();
};

TEST(DataParallel, BucketsStartDuringTheBackward) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  RecordingComm comm;
  DataParallelOptions o;
  o.bucket_bytes = 4;  // one bucket per block (each block is larger), plus the non-block tensors
  DataParallel dp(comm, L, 5, o);
  ASSERT_EQ(dp.buckets(), c.num_hidden_layers + 1);
  std::vector<float> g(static_cast<size_t>(L.total), 1.0f);
  dp.begin_step(g.data());
  EXPECT_TRUE(comm.issued.empty());
  dp.block_done(c.num_hidden_layers - 1);  // the last block finishes first
  EXPECT_EQ(comm.issued.size(), 1u);
  for (int64_t l = c.num_hidden_layers - 2; l >= 0; --l) dp.block_done(l);
  EXPECT_EQ(int64_t(comm.issued.size()), c.num_hidden_layers);  // every block's bucket before the end
  dp.finish_gradients();
  EXPECT_EQ(int64_t(comm.issued.size()), c.num_hidden_layers + 1);
  int64_t total = 0, params = 0;
  for (int64_t n : comm.issued) total += n;
  for (const ParamSpec& p : L.params) params += p.numel;
  EXPECT_EQ(total, params);  // every tensor reduced exactly once
}

TEST(DataParallel, OneRankIssuesNoCollectivesAndLeavesGradientsAsTheyAre) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  RecordingComm comm(1);
  DataParallel dp(comm, L, 5);
  std::vector<float> g(static_cast<size_t>(L.total));
  for (size_t i = 0; i < g.size(); ++i) g[i] = float(i % 97) - 48.0f;
  const std::vector<float> before = g;
  dp.begin_step(g.data());
  for (int64_t l = c.num_hidden_layers - 1; l >= 0; --l) dp.block_done(l);
  dp.finish_gradients();
  EXPECT_TRUE(comm.issued.empty());
  EXPECT_EQ(g, before);
}

}  // namespace
}  // namespace zaya

namespace zaya {
namespace {

// Rank 0 of 2 whose peer holds the same gradients and, for the parameter all-gather, sends 7s:
// reduce-scatters return twice this rank's block, all-gathers fill the peer's blocks with 7.
class MirroredPeerComm : public Comm {
 public:
  std::string name() const override { return "mirrored"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int64_t reduce_scatters = 0, all_gathers = 0;
  CommHandle all_reduce(const void* s, void* r, int64_t n, CommType t, ReduceOp) override {
    EXPECT_TRUE(t == CommType::F64 || t == CommType::I64);
    for (int64_t i = 0; i < n; ++i) {
      if (t == CommType::F64) static_cast<double*>(r)[i] = 2 * static_cast<const double*>(s)[i];
      else static_cast<int64_t*>(r)[i] = 2 * static_cast<const int64_t*>(s)[i];
    }
    return done();
  }
  CommHandle reduce_scatter(const void* s, void* r, const std::vector<int64_t>& c, CommType, ReduceOp) override {
    ++reduce_scatters;
    for (int64_t i = 0; i < c[0]; ++i) static_cast<float*>(r)[i] = 2 * static_cast<const float*>(s)[i];
    return done();
  }
  CommHandle all_gather(const void* s, void* r, const std::vector<int64_t>& c, CommType) override {
    ++all_gathers;
    float* out = static_cast<float*>(r);
    std::copy(static_cast<const float*>(s), static_cast<const float*>(s) + c[0], out);
    std::fill(out + c[0], out + c[0] + c[1], 7.0f);
    return done();
  }
  CommHandle broadcast(void*, int64_t, CommType, int) override { return done(); }
  CommHandle barrier() override { return done(); }
  CommHandle send(const void*, int64_t, CommType, int, int) override { return done(); }
  CommHandle recv(void*, int64_t, CommType, int, int) override { return done(); }

 private:
  struct Done : CommRequest {
    void wait() override {}
    bool test() override { return true; }
  };
  static CommHandle done() { return std::make_unique<Done>(); }
};

// Host-staged (the job's comm) and device-buffer (data_comm) buckets move the same bytes: owned
// gradients come back summed over both ranks, the others untouched; the all-gather writes the
// peer's tensors and leaves this rank's own.
TEST(DataParallel, HostStagedAndDeviceBufferPathsPackAndUnpackAlike) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  auto be = make_cpu_backend();
  std::vector<float> g0(static_cast<size_t>(L.total)), p0(g0.size());
  Rng rng(9);
  for (auto& x : g0) x = float(rng.normal());
  for (auto& x : p0) x = float(rng.normal());
  for (bool device_path : {false, true}) {
    SCOPED_TRACE(device_path ? "data_comm (backend buffers)" : "host-staged");
    MirroredPeerComm comm, data;
    DataParallelOptions o;
    o.bucket_bytes = 8 << 10;
    o.backend = be.get();
    if (device_path) o.data_comm = &data;
    DataParallel dp(comm, L, 5, o);
    std::vector<float> g = g0, p = p0;
    dp.begin_step(g.data());
    for (int64_t l = c.num_hidden_layers - 1; l >= 0; --l) dp.block_done(l);
    dp.finish_gradients();
    dp.gather_parameters(p.data());
    int owned = 0;
    for (size_t i = 0; i < L.params.size(); ++i) {
      const ParamSpec& s = L.params[i];
      for (int64_t k = 0; k < s.numel; ++k) {
        const size_t at = size_t(s.offset + k);
        ASSERT_EQ(g[at], dp.owns(i) ? 2 * g0[at] : g0[at]) << s.name;
        ASSERT_EQ(p[at], dp.owns(i) ? p0[at] : 7.0f) << s.name;
      }
      owned += dp.owns(i);
    }
    EXPECT_GT(owned, 0);
    EXPECT_LT(owned, int(L.params.size()));
    Comm& used = device_path ? static_cast<Comm&>(data) : static_cast<Comm&>(comm);
    const Comm& unused = device_path ? static_cast<Comm&>(comm) : static_cast<Comm&>(data);
    EXPECT_EQ(static_cast<MirroredPeerComm&>(used).reduce_scatters, dp.buckets());
    EXPECT_EQ(static_cast<MirroredPeerComm&>(used).all_gathers, 1);
    EXPECT_EQ(static_cast<const MirroredPeerComm&>(unused).reduce_scatters, 0);
    double loss[1] = {1.5};
    dp.sum(loss, 1);  // small sums always over the job's comm
    EXPECT_EQ(loss[0], 3.0);
  }
}

}  // namespace
}  // namespace zaya
