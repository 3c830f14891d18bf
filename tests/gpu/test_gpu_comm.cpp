// The NCCL communicator (src/backend/cuda/comm_nccl.h) in one process on one GPU: a communicator
// of one rank, bootstrapped over the single-process communicator. Every operation on device
// buffers (filled through the CUDA backend, results read back through it), for every type and
// reduction, in place and not, both count paths of reduce_scatter / all_gather (equal counts, and
// the uneven-count paths forced with uneven_paths_always), many operations in flight, the producer
// fence (a kernel writes a buffer, the communicator reads it with no synchronisation in between),
// and the argument errors; under the host emulation (tests/simt, its NCCL over MPI) also an
// asynchronous NCCL error. Skips with "skipped: no GPU" without a device. Two tests need no GPU:
// the clear error without a device, and a bad ZAYA_COMM_TIMEOUT. Multi-rank runs are
// tests/gpu/nccl_check.cpp (mpirun). Passed on an H100.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/comm_nccl.h"
#include "core/error.h"
#include "dist/comm.h"
#include "../common/comm_expect.h"
#include "gpu_test_support.h"
#if defined(ZAYA_SIMT)
#include "simt_nccl.h"
#endif

namespace zaya {
namespace {

using namespace gpu_test;

#ifdef ZAYA_HAVE_NCCL

// n elements of T in backend (device) memory, poisoned with 0xA5 bytes at creation.
template <class T>
class DevArray {
 public:
  DevArray(Backend& be, int64_t n) : be_(be), n_(n), p_(be.alloc(std::max<int64_t>(1, (n * int64_t(sizeof(T)) + 3) / 4))) {
    poison();
  }
  ~DevArray() { be_.free(p_); }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;

  T* p() const { return reinterpret_cast<T*>(p_); }
  void put(const std::vector<T>& h) {
    if (!h.empty()) be_.from_host(p_, h.data(), int64_t(h.size() * sizeof(T)));
  }
  std::vector<T> get() const {
    std::vector<T> h(static_cast<size_t>(n_));
    if (n_ > 0) be_.to_host(h.data(), p_, n_ * int64_t(sizeof(T)));
    return h;
  }
  void poison() {
    if (n_ == 0) return;
    std::vector<unsigned char> bytes(size_t(n_) * sizeof(T), 0xA5);
    be_.from_host(p_, bytes.data(), int64_t(bytes.size()));
  }

 private:
  Backend& be_;
  int64_t n_;
  float* p_;
};

using comm_expect::type_of;

template <class T>
std::vector<T> values(int64_t n, int salt) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = static_cast<T>((i * 7 + salt) % 113);
  return v;
}

struct Fixture {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Comm> boot;
  std::unique_ptr<Comm> comm;
};

Fixture make(bool uneven_always = false) {
  Fixture f;
  f.be = make_cuda_backend({});
  f.boot = make_single_comm();
  CommOptions o;
  o.timeout_s = 120;
  f.comm = make_nccl_comm(*f.boot, 0, o, nullptr, uneven_always);
  return f;
}

template <class T>
void check_all_reduce(Fixture& f, int64_t n, ReduceOp op, bool in_place) {
  DevArray<T> send(*f.be, n), recv(*f.be, n);
  const std::vector<T> in = values<T>(n, int(op) * 3 + 1);
  send.put(in);
  T* out = in_place ? send.p() : recv.p();
  f.comm->all_reduce(send.p(), out, n, type_of<T>(), op)->wait();
  EXPECT_EQ(in_place ? send.get() : recv.get(), in)
      << "all_reduce " << comm_type_name(type_of<T>()) << " op " << int(op) << (in_place ? " in place" : "");
}

template <class T>
void all_reduce_every_op(Fixture& f) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min})
    for (bool in_place : {false, true}) check_all_reduce<T>(f, 1001, op, in_place);
}

TEST(GpuComm, OneRankBasics) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  Fixture f = make();
  EXPECT_EQ(f.comm->name(), "nccl");
  EXPECT_EQ(f.comm->rank(), 0);
  EXPECT_EQ(f.comm->size(), 1);
  EXPECT_EQ(f.comm->local_rank(), 0);
  EXPECT_EQ(f.comm->local_size(), 1);
}

TEST(GpuComm, AllReduceEveryTypeAndOp) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  Fixture f = make();
  all_reduce_every_op<float>(f);
  all_reduce_every_op<double>(f);
  all_reduce_every_op<int32_t>(f);
  all_reduce_every_op<int64_t>(f);
  all_reduce_every_op<uint8_t>(f);
  // Zero elements, null buffers: completes.
  f.comm->all_reduce(nullptr, nullptr, 0, CommType::F32, ReduceOp::Sum)->wait();
}

// reduce_scatter and all_gather with counts {n}: out of place and in place, on the equal-count
// path (NCCL's collectives) and on the uneven-count paths (padded staging; grouped sends).
void reduce_scatter_all_gather(bool uneven_always) {
  Fixture f = make(uneven_always);
  const char* path = uneven_always ? " (uneven path)" : " (equal path)";
  const int64_t n = 777;
  {
    DevArray<float> send(*f.be, n), recv(*f.be, n + 1);
    const std::vector<float> in = values<float>(n, 5);
    send.put(in);
    f.comm->reduce_scatter(send.p(), recv.p(), {n}, CommType::F32, ReduceOp::Sum)->wait();
    std::vector<float> got = recv.get();
    const unsigned char poison[4] = {0xA5, 0xA5, 0xA5, 0xA5};
    EXPECT_EQ(std::memcmp(&got[size_t(n)], poison, 4), 0) << "reduce_scatter wrote past this rank's block" << path;
    got.resize(size_t(n));
    EXPECT_EQ(got, in) << "reduce_scatter f32" << path;
  }
  {
    DevArray<int64_t> buf(*f.be, n);
    const std::vector<int64_t> in = values<int64_t>(n, 9);
    buf.put(in);
    f.comm->reduce_scatter(buf.p(), buf.p(), {n}, CommType::I64, ReduceOp::Max)->wait();
    EXPECT_EQ(buf.get(), in) << "reduce_scatter i64 in place" << path;
  }
  {
    DevArray<double> send(*f.be, n), recv(*f.be, n);
    const std::vector<double> in = values<double>(n, 2);
    send.put(in);
    f.comm->all_gather(send.p(), recv.p(), {n}, CommType::F64)->wait();
    EXPECT_EQ(recv.get(), in) << "all_gather f64" << path;
  }
  {
    DevArray<int32_t> buf(*f.be, n);
    const std::vector<int32_t> in = values<int32_t>(n, 4);
    buf.put(in);
    f.comm->all_gather(buf.p(), buf.p(), {n}, CommType::I32)->wait();  // this rank's block is at offset 0
    EXPECT_EQ(buf.get(), in) << "all_gather i32 in place" << path;
  }
  f.comm->reduce_scatter(nullptr, nullptr, {0}, CommType::U8, ReduceOp::Min)->wait();
  f.comm->all_gather(nullptr, nullptr, {0}, CommType::U8)->wait();
}

TEST(GpuComm, ReduceScatterAllGatherEqualPath) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  reduce_scatter_all_gather(false);
}

TEST(GpuComm, ReduceScatterAllGatherUnevenPath) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  reduce_scatter_all_gather(true);
}

TEST(GpuComm, BroadcastBarrierAndTest) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  Fixture f = make();
  DevArray<uint8_t> buf(*f.be, 4099);
  const std::vector<uint8_t> in = values<uint8_t>(4099, 7);
  buf.put(in);
  f.comm->broadcast(buf.p(), 4099, CommType::U8, 0)->wait();
  EXPECT_EQ(buf.get(), in);
  f.comm->broadcast(nullptr, 0, CommType::F32, 0)->wait();
  f.comm->barrier()->wait();
  CommHandle h = f.comm->barrier();
  while (!h->test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  EXPECT_TRUE(h->test());  // stays complete
}

// Forty operations issued before the first wait, on separate buffers and chained on one
// buffer, waited on in order and (for the chain) in reverse; a request dropped unwaited.
TEST(GpuComm, ManyInFlight) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  Fixture f = make();
  std::vector<std::unique_ptr<DevArray<float>>> bufs;
  std::vector<std::vector<float>> want;
  std::vector<CommHandle> handles;
  for (int k = 0; k < 40; ++k) {
    const int64_t n = k * 37 + 1;
    bufs.push_back(std::make_unique<DevArray<float>>(*f.be, n));
    want.push_back(values<float>(n, k));
    bufs.back()->put(want.back());
    if (k % 5 == 4)
      handles.push_back(f.comm->broadcast(bufs.back()->p(), n, CommType::F32, 0));
    else
      handles.push_back(f.comm->all_reduce(bufs.back()->p(), bufs.back()->p(), n, CommType::F32, ReduceOp::Sum));
  }
  for (int k = 0; k < 40; ++k) {
    handles[size_t(k)]->wait();
    EXPECT_EQ(bufs[size_t(k)]->get(), want[size_t(k)]) << "operation " << k;
  }
  DevArray<int64_t> chain(*f.be, 5000);
  const std::vector<int64_t> in = values<int64_t>(5000, 3);
  chain.put(in);
  std::vector<CommHandle> ops;
  for (int k = 0; k < 8; ++k) ops.push_back(f.comm->all_reduce(chain.p(), chain.p(), 5000, CommType::I64, ReduceOp::Max));
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) (*it)->wait();
  EXPECT_EQ(chain.get(), in);
  { CommHandle dropped = f.comm->barrier(); }  // destroying an unfinished request waits for it
}

// The communication stream waits for the backend's stream: a fill kernel and an upload enqueued
// just before the operation (no synchronisation) are what the operation reads.
TEST(GpuComm, ProducerFence) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  Fixture f = make();
  const int64_t n = int64_t(1) << 22;
  DevBuf src(*f.be, n), dst(*f.be, n);
  for (int round = 0; round < 3; ++round) {
    f.be->fill(src.f(), float(round + 2), n);
    f.comm->all_reduce(src.f(), dst.f(), n, CommType::F32, ReduceOp::Sum)->wait();
    const std::vector<float> got = dst.get();
    int64_t bad = 0;
    for (float v : got) bad += v != float(round + 2);
    EXPECT_EQ(bad, 0) << "round " << round;
  }
}

TEST(GpuComm, ArgumentErrors) {
  if (!gpu_present()) GTEST_SKIP() << "skipped: no GPU";
  Fixture f = make();
  DevArray<float> d(*f.be, 16);
  float host[16] = {};
  auto comm_error = [](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.component(), "comm") << what;
    }
  };
  comm_error([&] { f.comm->all_reduce(d.p(), d.p(), -1, CommType::F32, ReduceOp::Sum); }, "negative count");
  comm_error([&] { f.comm->reduce_scatter(d.p(), d.p(), {8, 8}, CommType::F32, ReduceOp::Sum); }, "two counts");
  comm_error([&] { f.comm->all_gather(d.p(), d.p(), {-1}, CommType::F32); }, "negative per-rank count");
  comm_error([&] { f.comm->broadcast(d.p(), 16, CommType::F32, 1); }, "root 1 of 1");
  comm_error([&] { f.comm->send(d.p(), 16, CommType::F32, 0, 0); }, "send to self");
  comm_error([&] { f.comm->recv(d.p(), 16, CommType::F32, 1, 0); }, "recv from a rank past the end");
  comm_error([&] { f.comm->all_reduce(nullptr, d.p(), 4, CommType::F32, ReduceOp::Sum); }, "null send");
  try {
    f.comm->all_reduce(host, host, 16, CommType::F32, ReduceOp::Sum);
    ADD_FAILURE() << "host memory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("not device memory"), std::string::npos) << e.message();
  }
  // The communicator still works after rejected calls.
  f.comm->barrier()->wait();
}

#if defined(ZAYA_SIMT)
// An asynchronous NCCL error (NCCL's word for a peer or the network failing): the watchdog
// aborts the communicator, and from then on every call throws zaya::Error("comm") with NCCL's
// error text. Only the emulated NCCL makes one on demand (simt::nccl_fail_async_after: from the
// communicator's second data call on). The watchdog polls, so the first call to fail may be the
// second or a later one.
TEST(GpuComm, AsyncErrorFailsTheCommunicator) {
  simt::nccl_fail_async_after(2);
  Fixture f = make();
  simt::nccl_fail_async_after(0);
  DevArray<float> d(*f.be, 16);
  d.put(values<float>(16, 1));
  f.comm->all_reduce(d.p(), d.p(), 16, CommType::F32, ReduceOp::Sum)->wait();  // the first call is fine
  std::string failure;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (failure.empty() && std::chrono::steady_clock::now() < deadline) {
    try {
      f.comm->all_reduce(d.p(), d.p(), 16, CommType::F32, ReduceOp::Sum)->wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } catch (const Error& e) {
      EXPECT_EQ(e.component(), "comm");
      failure = e.message();
    }
  }
  ASSERT_FALSE(failure.empty()) << "no call failed within 10 s of the asynchronous error";
  EXPECT_NE(failure.find("asynchronous error"), std::string::npos) << failure;
  EXPECT_NE(failure.find("remote process exited"), std::string::npos) << failure;
  try {
    f.comm->barrier()->wait();
    ADD_FAILURE() << "a call on the failed communicator succeeded";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("has failed"), std::string::npos) << e.message();
  }
}
#endif

#endif  // ZAYA_HAVE_NCCL

TEST(GpuComm, NoDeviceGivesAClearError) {
#ifdef ZAYA_HAVE_NCCL
  if (gpu_present()) GTEST_SKIP() << "a GPU is present";
  std::unique_ptr<Comm> boot = make_single_comm();
  try {
    make_nccl_comm(*boot, 0, {});
    FAIL() << "make_nccl_comm succeeded without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.component(), "comm");
    EXPECT_NE(e.message().find("no GPU"), std::string::npos) << e.message();
  }
#else
  GTEST_SKIP() << "skipped: built without NCCL";
#endif
}

TEST(GpuComm, BadTimeoutEnvironment) {
#ifdef ZAYA_HAVE_NCCL
  const char* old = std::getenv("ZAYA_COMM_TIMEOUT");
  const std::string saved = old ? old : "";
  setenv("ZAYA_COMM_TIMEOUT", "soon", 1);
  std::unique_ptr<Comm> boot = make_single_comm();
  try {
    make_nccl_comm(*boot, 0, {});
    ADD_FAILURE() << "ZAYA_COMM_TIMEOUT=soon was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("ZAYA_COMM_TIMEOUT"), std::string::npos) << e.message();
  }
  if (old)
    setenv("ZAYA_COMM_TIMEOUT", saved.c_str(), 1);
  else
    unsetenv("ZAYA_COMM_TIMEOUT");
#else
  GTEST_SKIP() << "skipped: built without NCCL";
#endif
}

}  // namespace
}  // namespace zaya
