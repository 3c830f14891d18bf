// The host GPU emulation's scheduler itself (simt_runtime.cpp), under each schedule it offers:
// barriers hold every thread until the block's (or the warp's) last one arrives, shuffles read
// the lane their mask names, a divergent warp stops the run, threads that exited count as
// arrived at the block's barrier, each schedule orders threads as simt_runtime.h says (round
// robin, ahead, reverse), a kernel missing a barrier reads the unwritten fill of shared memory,
// and threads that can no longer all make progress stop the launch with an error; and the
// launch limits on shared memory of the device each warp width stands for. Built with 32-lane
// warps (zaya_simt_tests) and 64-lane warps (zaya_simt_wave64_tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "simt_runtime.h"
#include "test_helpers.h"

namespace zaya {
namespace {

constexpr int kW = GPU_WARP_SIZE;
constexpr int kThreads = 2 * kW;  // two warps

struct NamedSchedule {
  const char* name;
  simt::Schedule schedule;
};

const std::vector<NamedSchedule>& all_schedules() {
  static const std::vector<NamedSchedule> schedules = {
      {"round_robin", {true, false, false}},
      {"ahead", {false, false, false}},
      {"round_robin_reverse", {true, false, true}},
      {"ahead_reverse", {false, false, true}},
  };
  return schedules;
}

// Runs each test under a schedule it sets, and puts the process's schedule back afterwards.
class SimtRuntime : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = simt::schedule(); }
  void TearDown() override { simt::set_schedule(saved_); }

 private:
  simt::Schedule saved_;
};

// One step of a thread: which thread, and which of the kernel's phases it logged.
struct Step {
  int thread;
  char phase;
};

// A: before a __syncwarp; B: between it and a __syncthreads; C: after both.
std::vector<Step> run_phases() {
  std::vector<Step> log;
  simt::launch(dim3(1), dim3(kThreads), 0, [&] {
    const int t = int(threadIdx.x);
    log.push_back({t, 'A'});
    __syncwarp();
    log.push_back({t, 'B'});
    __syncthreads();
    log.push_back({t, 'C'});
  });
  return log;
}

size_t position(const std::vector<Step>& log, int thread, char phase) {
  for (size_t i = 0; i < log.size(); ++i)
    if (log[i].thread == thread && log[i].phase == phase) return i;
  ADD_FAILURE() << "thread " << thread << " never logged phase " << phase;
  return log.size();
}

TEST_F(SimtRuntime, BarriersHoldEveryThreadUntilTheLastArrives) {
  for (const NamedSchedule& s : all_schedules()) {
    SCOPED_TRACE(s.name);
    simt::set_schedule(s.schedule);
    const std::vector<Step> log = run_phases();
    ASSERT_EQ(log.size(), size_t(3 * kThreads));
    size_t last_b = 0, first_c = log.size();
    for (int t = 0; t < kThreads; ++t) {
      last_b = std::max(last_b, position(log, t, 'B'));
      first_c = std::min(first_c, position(log, t, 'C'));
    }
    EXPECT_LT(last_b, first_c) << "a thread passed __syncthreads before every thread reached it";
    for (int warp = 0; warp < 2; ++warp) {
      size_t last_a = 0, first_b = log.size();
      for (int l = 0; l < kW; ++l) {
        last_a = std::max(last_a, position(log, warp * kW + l, 'A'));
        first_b = std::min(first_b, position(log, warp * kW + l, 'B'));
      }
      EXPECT_LT(last_a, first_b) << "warp " << warp
                                 << ": a lane passed __syncwarp before every lane reached it";
    }
  }
}

// A shuffle returns the value of the lane its mask names, for every mask and every lane, with
// values of 4 and 8 bytes; the shuffles come back to back, so a lane that reads a deposit of
// the wrong exchange (the deposits are double buffered, and read after the exchange returns)
// gets the other shuffle's value.
TEST_F(SimtRuntime, ShufflesReadTheLaneTheMaskNames) {
  for (const NamedSchedule& s : all_schedules()) {
    SCOPED_TRACE(s.name);
    simt::set_schedule(s.schedule);
    std::vector<int> narrow(size_t(kThreads * kW), -1);
    std::vector<double> wide(size_t(kThreads * kW), -1.0);
    simt::launch(dim3(1), dim3(kThreads), 0, [&] {
      const int t = int(threadIdx.x);
      for (int mask = 0; mask < kW; ++mask) {
        narrow[size_t(t * kW + mask)] = simt::shfl_xor(t * 1000 + mask, mask);
        wide[size_t(t * kW + mask)] = simt::shfl_xor(double(t) + 0.25 * mask, mask ^ 1);
      }
    });
    for (int t = 0; t < kThreads; ++t) {
      const int warp_base = t / kW * kW, lane = t % kW;
      for (int mask = 0; mask < kW; ++mask) {
        const int from = warp_base + (lane ^ mask), wide_from = warp_base + (lane ^ (mask ^ 1));
        EXPECT_EQ(narrow[size_t(t * kW + mask)], from * 1000 + mask) << "thread " << t << " mask " << mask;
        EXPECT_EQ(wide[size_t(t * kW + mask)], double(wide_from) + 0.25 * mask) << "thread " << t << " mask " << mask;
      }
    }
  }
}

// Lanes of one warp at different warp-wide instructions (a divergent warp) stop the run with
// the lanes named, before any lane reads a deposit of the other instruction.
TEST(SimtRuntimeDeathTest, LanesAtDifferentWarpWideInstructionsStopTheRun) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(simt::launch(dim3(1), dim3(kW), 0,
                            [] {
                              if (threadIdx.x % 2 == 0) (void)simt::shfl_xor(int(threadIdx.x), 1);
                              else __syncwarp();
                            }),
               "simt: block \\(0, 0, 0\\) warp 0: lanes [0-9]+ and [0-9]+ are at different warp-wide instructions");
}

TEST_F(SimtRuntime, SchedulesOrderThreadsAsDocumented) {
  // Round robin: the warps advance together, so warp 1 starts before warp 0 goes past its
  // __syncwarp.
  simt::set_schedule({true, false, false});
  std::vector<Step> log = run_phases();
  EXPECT_LT(position(log, kW, 'A'), position(log, 0, 'B'));
  EXPECT_EQ(log.front().thread, 0);
  // Ahead: warp 0 runs on to the block's barrier before warp 1 starts.
  simt::set_schedule({false, false, false});
  log = run_phases();
  for (int l = 0; l < kW; ++l) EXPECT_LT(position(log, l, 'B'), position(log, kW, 'A')) << "lane " << l;
  // Reverse: the last thread goes first, and (ahead) the last warp reaches the block's barrier
  // before the first warp starts.
  simt::set_schedule({true, false, true});
  log = run_phases();
  EXPECT_EQ(log.front().thread, kThreads - 1);
  EXPECT_LT(position(log, kW - 1, 'A'), position(log, kThreads - 1, 'B'));
  simt::set_schedule({false, false, true});
  log = run_phases();
  EXPECT_EQ(log.front().thread, kThreads - 1);
  for (int l = kW; l < kThreads; ++l)
    EXPECT_LT(position(log, l, 'B'), position(log, kW - 1, 'A')) << "thread " << l;
}

// Each thread stores its index in shared memory and reads its neighbour's, with or without the
// barrier between.
std::vector<uint32_t> neighbours(bool with_barrier) {
  std::vector<uint32_t> out(kThreads, 0);
  simt::launch(dim3(2), dim3(kThreads), kThreads * sizeof(uint32_t), [&] {
    ZAYA_DYNAMIC_SHARED(smem_bytes);
    auto* smem = reinterpret_cast<uint32_t*>(smem_bytes);
    const int t = int(threadIdx.x);
    smem[t] = uint32_t(t + 1000 * int(blockIdx.x));
    if (with_barrier) __syncthreads();
    if (blockIdx.x == 1) out[size_t(t)] = smem[(t + 1) % kThreads];
  });
  return out;
}

TEST_F(SimtRuntime, AMissingBarrierReadsTheUnwrittenFill) {
  for (const NamedSchedule& s : all_schedules()) {
    SCOPED_TRACE(s.name);
    simt::set_schedule(s.schedule);
    const std::vector<uint32_t> good = neighbours(true);
    for (int t = 0; t < kThreads; ++t)
      EXPECT_EQ(good[size_t(t)], uint32_t(1000 + (t + 1) % kThreads)) << "thread " << t;
    // Without the barrier, the thread that runs first reads its neighbour's slot before it is
    // written: the fill (NaN bytes), from the second block too (every block starts filled).
    const std::vector<uint32_t> bad = neighbours(false);
    const int first = s.schedule.reverse ? kThreads - 1 : 0;
    EXPECT_EQ(bad[size_t(first)], 0xffffffffu);
  }
}

TEST_F(SimtRuntime, ExitedThreadsCountAsArrivedAtTheBlockBarrier) {
  for (const NamedSchedule& s : all_schedules()) {
    SCOPED_TRACE(s.name);
    simt::set_schedule(s.schedule);
    std::vector<int> passes(kThreads, 0);
    simt::launch(dim3(3), dim3(kThreads), 0, [&] {
      const int t = int(threadIdx.x);
      if (t >= kW) return;  // the second warp leaves at once
      __syncthreads();
      __syncthreads();
      ++passes[size_t(t)];
    });
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(passes[size_t(t)], t < kW ? 3 : 0) << "thread " << t;
  }
}

TEST_F(SimtRuntime, ThreadsThatCanNoLongerAllProgressStopTheLaunch) {
  for (const NamedSchedule& s : all_schedules()) {
    SCOPED_TRACE(s.name);
    simt::set_schedule(s.schedule);
    // Lane 0 skips a shuffle its warp's other lanes wait in, and exits: they wait forever.
    test::expect_error(
        [] {
          simt::launch(dim3(1), dim3(kThreads), 0, [] {
            if (threadIdx.x == 0) return;
            (void)simt::shfl_xor(int(threadIdx.x), 1);
          });
        },
        {"simt", "block (0, 0, 0): " + std::to_string(kW - 1) + " threads wait",
         "that the others never reach"});
    // The emulation goes on working after the failed launch.
    const std::vector<uint32_t> good = neighbours(true);
    EXPECT_EQ(good[0], 1001u);
  }
}

// Launch limits on shared memory, as the device the build's warp width stands for: 48 KiB
// without an attribute and up to 227 KiB with one (H100, 32 lanes); 64 KiB with or without one
// (CDNA's LDS, 64 lanes: a kernel the HIP build launches with more fails as it would on AMD).
TEST(SimtLaunchLimits, SharedMemoryAsTheEmulatedDevice) {
  static int kernel_a = 0, kernel_b = 0;  // stand-ins for kernel addresses
  const bool cdna = GPU_WARP_SIZE == 64;
  const size_t default_bytes = cdna ? 64 << 10 : 48 << 10;
  const size_t max_bytes = cdna ? 64 << 10 : 227 << 10;
  EXPECT_EQ(size_t(gpu_device_max_shared_per_block(0)), max_bytes);
  (void)gpuGetLastError();
  EXPECT_TRUE(simt::check_launch(&kernel_a, dim3(1), dim3(kW), default_bytes));
  EXPECT_FALSE(simt::check_launch(&kernel_a, dim3(1), dim3(kW), default_bytes + 16));
  EXPECT_EQ(gpuGetLastError(), gpuErrorInvalidValue);
  // An attribute allows up to the device's most, never past it.
  EXPECT_EQ(gpuFuncSetAttribute(&kernel_b, gpuFuncAttributeMaxDynamicSharedMemorySize, int(max_bytes)), gpuSuccess);
  EXPECT_TRUE(simt::check_launch(&kernel_b, dim3(1), dim3(kW), max_bytes));
  EXPECT_FALSE(simt::check_launch(&kernel_b, dim3(1), dim3(kW), max_bytes + 16));
  EXPECT_EQ(gpuGetLastError(), gpuErrorInvalidValue);
  EXPECT_EQ(gpuFuncSetAttribute(&kernel_b, gpuFuncAttributeMaxDynamicSharedMemorySize, int(max_bytes) + 1),
            gpuErrorInvalidValue);
  EXPECT_EQ(gpuGetLastError(), gpuErrorInvalidValue);
  EXPECT_EQ(gpuGetLastError(), gpuSuccess);
}

}  // namespace
}  // namespace zaya
