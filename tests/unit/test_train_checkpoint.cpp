// The trainer's checkpoint copy (state_copy_fn): parameters and optimizer state are backend
// memory and must be copied with Backend::to_host (device memory on a GPU), the balancer's state
// is host memory and must not be. A timing decorator around the CPU backend counts the to_host
// calls, so the distinction is visible without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "../../bench/timed_backend.h"
#include "dist/comm.h"
#include "model/config.h"
#include "model/model.h"
#include "train/balancer.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"
#include "train/train_checkpoint.h"

namespace zaya {
namespace {

TEST(TrainCheckpoint, BackendStateGoesThroughToHostAndBalancerStateDoesNot) {
  auto cpu = make_cpu_backend();
  bench::TimedBackend be(*cpu);
  Model model(preset_config("zaya-tiny"), be);
  model.init_random(3);
  auto comm = make_single_comm();
  DataParallel dp(*comm, model.layout(), 5);
  Optimizer optim(model.layout(), OptimizerConfig{}, be, dp.owned_mask());
  BiasBalancer balancer(model.layout(), BalancerConfig{}, be);
  TrainState state{model, optim, balancer, dp};
  const DistCopyFn copy = state_copy_fn(state, be);
  be.enabled = true;
  int backend_pieces = 0, host_pieces = 0;
  for (const DistPiece& p : owned_pieces(state)) {
    be.reset();
    std::vector<float> staged(static_cast<size_t>(p.length), -1.0f);
    copy(staged.data(), p.data, size_t(p.length) * 4);
    const int64_t to_host_calls = be.stats.count("to_host") ? be.stats.at("to_host").calls : 0;
    if (p.group == "balancer") {
      EXPECT_EQ(to_host_calls, 0) << p.name;
      ++host_pieces;
    } else {
      EXPECT_EQ(to_host_calls, 1) << p.name;
      ++backend_pieces;
    }
    EXPECT_EQ(std::memcmp(staged.data(), p.data, size_t(p.length) * 4), 0) << p.name;
  }
  EXPECT_GT(backend_pieces, 0);
  EXPECT_GT(host_pieces, 0);
}

}  // namespace
}  // namespace zaya
