// The single-process communicator (rank 0 of 1: collectives copy, in place is a no-op, messages
// have no peer), CommType sizes and names, make_comm's choice and ZAYA_COMM_TIMEOUT. The MPI
// communicator is checked under mpirun by tests/mpi/comm_check.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"

using zaya::CommType;
using zaya::ReduceOp;

namespace {

// Sets (or unsets, for nullptr) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

void expect_comm_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "expected a comm error mentioning '" << fragment << "'";
  } catch (const zaya::Error& e) {
    EXPECT_EQ(e.component(), "comm");
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Comm, TypeSizesAndNames) {
  EXPECT_EQ(zaya::comm_type_size(CommType::F32), 4);
  EXPECT_EQ(zaya::comm_type_size(CommType::F64), 8);
  EXPECT_EQ(zaya::comm_type_size(CommType::I32), 4);
  EXPECT_EQ(zaya::comm_type_size(CommType::I64), 8);
  EXPECT_EQ(zaya::comm_type_size(CommType::U8), 1);
  EXPECT_STREQ(zaya::comm_type_name(CommType::F32), "f32");
  EXPECT_STREQ(zaya::comm_type_name(CommType::F64), "f64");
  EXPECT_STREQ(zaya::comm_type_name(CommType::I32), "i32");
  EXPECT_STREQ(zaya::comm_type_name(CommType::I64), "i64");
  EXPECT_STREQ(zaya::comm_type_name(CommType::U8), "u8");
}

TEST(Comm, SingleRankAndName) {
  auto comm = zaya::make_single_comm();
  EXPECT_EQ(comm->name(), "single");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->local_rank(), 0);
  EXPECT_EQ(comm->local_size(), 1);
}

TEST(Comm, SingleCollectivesCopy) {
  auto comm = zaya::make_single_comm();
  std::vector<float> send(100), recv(100, -1.0f);
  std::iota(send.begin(), send.end(), 1.0f);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    std::fill(recv.begin(), recv.end(), -1.0f);
    auto h = comm->all_reduce(send.data(), recv.data(), 100, CommType::F32, op);
    EXPECT_TRUE(h->test());
    h->wait();
    EXPECT_EQ(recv, send);
  }

  std::vector<int64_t> s64 = {int64_t(1) << 40, -3, 7}, r64(3, 0);
  comm->reduce_scatter(s64.data(), r64.data(), {3}, CommType::I64, ReduceOp::Sum)->wait();
  EXPECT_EQ(r64, s64);

  std::vector<uint8_t> s8 = {1, 2, 3, 250}, r8(4, 0);
  comm->all_gather(s8.data(), r8.data(), {4}, CommType::U8)->wait();
  EXPECT_EQ(r8, s8);

  std::vector<double> b = {1.5, 2.5};
  comm->broadcast(b.data(), 2, CommType::F64, 0)->wait();
  EXPECT_EQ(b, (std::vector<double>{1.5, 2.5}));
  comm->barrier()->wait();
  EXPECT_TRUE(comm->barrier()->test());

  // Zero elements, null buffers: nothing to do.
  comm->all_reduce(nullptr, nullptr, 0, CommType::F32, ReduceOp::Sum)->wait();
  comm->all_gather(nullptr, nullptr, {0}, CommType::I32)->wait();
}

TEST(Comm, SingleInPlace) {
  auto comm = zaya::make_single_comm();
  std::vector<int32_t> v = {5, -6, 7};
  comm->all_reduce(v.data(), v.data(), 3, CommType::I32, ReduceOp::Max)->wait();
  EXPECT_EQ(v, (std::vector<int32_t>{5, -6, 7}));
  comm->reduce_scatter(v.data(), v.data(), {3}, CommType::I32, ReduceOp::Sum)->wait();
  EXPECT_EQ(v, (std::vector<int32_t>{5, -6, 7}));
  comm->all_gather(v.data(), v.data(), {3}, CommType::I32)->wait();
  EXPECT_EQ(v, (std::vector<int32_t>{5, -6, 7}));
}

TEST(Comm, SingleErrors) {
  auto comm = zaya::make_single_comm();
  float x[2] = {0, 0};
  expect_comm_error([&] { comm->send(x, 2, CommType::F32, 1, 0); }, "no peers");
  expect_comm_error([&] { comm->recv(x, 2, CommType::F32, 0, 0); }, "no peers");
  expect_comm_error([&] { comm->broadcast(x, 2, CommType::F32, 1); }, "root 1");
  expect_comm_error([&] { comm->all_reduce(x, x, -1, CommType::F32, ReduceOp::Sum); }, "negative count");
  expect_comm_error([&] { comm->reduce_scatter(x, x, {1, 1}, CommType::F32, ReduceOp::Sum); }, "expected 1");
  expect_comm_error([&] { comm->all_gather(x, x, {}, CommType::F32); }, "expected 1");
}

TEST(Comm, TimeoutFromEnvironment) {
  zaya::CommOptions options;
  options.timeout_s = 600;
  {
    ScopedEnv env("ZAYA_COMM_TIMEOUT", nullptr);
    EXPECT_EQ(zaya::apply_comm_env(options).timeout_s, 600);
  }
  {
    ScopedEnv env("ZAYA_COMM_TIMEOUT", "12.5");
    EXPECT_EQ(zaya::apply_comm_env(options).timeout_s, 12.5);
  }
  {
    ScopedEnv env("ZAYA_COMM_TIMEOUT", "0");
    EXPECT_EQ(zaya::apply_comm_env(options).timeout_s, 0);
  }
  {
    ScopedEnv env("ZAYA_COMM_TIMEOUT", "5min");
    expect_comm_error([&] { zaya::apply_comm_env(options); }, "ZAYA_COMM_TIMEOUT='5min'");
  }
}

TEST(Comm, MakeCommWithoutLauncherIsSingle) {
  if (zaya::launched_by_mpi()) GTEST_SKIP() << "running under an MPI launcher";
  auto comm = zaya::make_comm(zaya::CommOptions{});
  EXPECT_EQ(comm->name(), "single");
  EXPECT_EQ(comm->size(), 1);
}
