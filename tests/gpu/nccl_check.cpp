// nccl_check: the NCCL communicator (src/backend/cuda/comm_nccl.h) across processes, run under
// `mpirun -np N` (N >= 1; without mpirun it runs as one rank over the single-process
// communicator). Rank r uses GPU `local rank` of its node; the communicator is bootstrapped over
// the MPI communicator. Checks, on device buffers and with exact expected results (as
// tests/mpi/comm_check.cpp): all_reduce of every type and reduction, in place and not;
// reduce_scatter and all_gather with uneven counts including a zero, in place and not, and with
// equal counts; broadcast from the last rank; barrier and test(); a ring of sends and receives
// posted before any wait; a relay through one buffer (receive, then forward); many operations in
// flight; the same checks again on a communicator that takes the uneven-count paths for every
// count. Rank 0 prints "nccl_check: N ranks OK"; every rank exits 0, or 1 on any mismatch.
//
// Skips (rank 0 prints "nccl_check: skipped: ..." and every rank exits 0) when a rank has no GPU
// or ranks would share one (nccl_shared_gpus: NCCL refuses two ranks on one GPU). A launcher that
// shows each rank one GPU runs the checks (each rank uses nccl_device_for(local rank)).
//
// nccl_check --watchdog-test (N >= 2): rank 1 sleeps 40 s before an all_reduce; rank 0's
// watchdog (10 s: its deadline also covers ncclCommInitRank, which may take seconds) must print
// its line naming peer 1 and exit with kCommTimeoutExitCode. Getting past the all_reduce is a
// failure. Run with one rank on an H100; never with two or more (no machine with two GPUs).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/comm_nccl.h"
#include "backend/cuda/cuda_factory.h"
#include "core/error.h"
#include "dist/comm.h"

#include "../common/comm_expect.h"
#include "rank_checks.h"

using namespace zaya;

namespace {

using rank_checks::expect;
using rank_checks::g_failures;
using rank_checks::g_rank;

using comm_expect::Gen;
using comm_expect::offsets;
using comm_expect::reduced;
using comm_expect::type_of;
using comm_expect::uneven_counts;

Backend* g_be = nullptr;  // device memory and host copies

// n elements of T in device memory (through the CUDA backend).
template <class T>
class Dev {
 public:
  explicit Dev(int64_t n) : n_(n), p_(g_be->alloc(std::max<int64_t>(1, (n * int64_t(sizeof(T)) + 3) / 4))) {}
  explicit Dev(const std::vector<T>& h) : Dev(int64_t(h.size())) { put(h); }
  ~Dev() { g_be->free(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* p() const { return reinterpret_cast<T*>(p_); }
  void put(const std::vector<T>& h) {
    if (!h.empty()) g_be->from_host(p_, h.data(), int64_t(h.size() * sizeof(T)));
  }
  std::vector<T> get() const {
    std::vector<T> h(static_cast<size_t>(n_));
    if (n_ > 0) g_be->to_host(h.data(), p_, n_ * int64_t(sizeof(T)));
    return h;
  }

 private:
  int64_t n_;
  float* p_;
};

template <class T>
void check_all_reduce(Comm& comm, const std::string& name, int64_t n, ReduceOp op, bool in_place, const Gen<T>& gen) {
  std::vector<T> h(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) h[size_t(i)] = gen(comm.rank(), i);
  Dev<T> send(h), recv(n);
  comm.all_reduce(send.p(), in_place ? send.p() : recv.p(), n, type_of<T>(), op)->wait();
  const std::vector<T> got = in_place ? send.get() : recv.get();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += got[size_t(i)] != reduced(gen, comm.size(), i, op);
  expect(bad == 0, name + ": " + std::to_string(bad) + " of " + std::to_string(n) + " wrong");
}

void test_all_reduce(Comm& comm, const std::string& tag) {
  comm_expect::for_each_all_reduce_case([&](const char* name, int64_t n, ReduceOp op, bool in_place, const auto& gen) {
    check_all_reduce(comm, tag + name, n, op, in_place, gen);
  });
}

// counts: rank r holds counts[r] elements (uneven with a zero, or all equal).
void check_reduce_scatter(Comm& comm, const std::string& name, const std::vector<int64_t>& counts) {
  const int me = comm.rank(), size = comm.size();
  const std::vector<int64_t> off = offsets(counts);
  const int64_t total = off.back(), mine = counts[size_t(me)];
  // f32 sum, out of place: rank r contributes r*100 + j at global index j; one element past the
  // block must stay untouched.
  std::vector<float> h(static_cast<size_t>(total));
  for (int64_t j = 0; j < total; ++j) h[size_t(j)] = static_cast<float>(me * 100 + j);
  Dev<float> send(h), recv(std::vector<float>(size_t(mine) + 1, -1.0f));
  comm.reduce_scatter(send.p(), recv.p(), counts, CommType::F32, ReduceOp::Sum)->wait();
  std::vector<float> got = recv.get();
  int64_t bad = 0;
  for (int64_t k = 0; k < mine; ++k)
    bad += got[size_t(k)] != static_cast<float>(100 * size * (size - 1) / 2 + size * (off[size_t(me)] + k));
  expect(bad == 0, name + " f32 sum: " + std::to_string(bad) + " wrong");
  expect(got[size_t(mine)] == -1.0f, name + " wrote past this rank's block");
  // i64 max, in place: the result lands at the start of the buffer.
  std::vector<int64_t> hb(static_cast<size_t>(total));
  for (int64_t j = 0; j < total; ++j) hb[size_t(j)] = ((j + me) % size) * 1000 + j;
  Dev<int64_t> buf(hb);
  comm.reduce_scatter(buf.p(), buf.p(), counts, CommType::I64, ReduceOp::Max)->wait();
  const std::vector<int64_t> gb = buf.get();
  bad = 0;
  for (int64_t k = 0; k < mine; ++k) bad += gb[size_t(k)] != (size - 1) * 1000 + off[size_t(me)] + k;
  expect(bad == 0, name + " i64 max in place: " + std::to_string(bad) + " wrong");
}

void check_all_gather(Comm& comm, const std::string& name, const std::vector<int64_t>& counts) {
  const int me = comm.rank(), size = comm.size();
  const std::vector<int64_t> off = offsets(counts);
  const int64_t total = off.back(), mine = counts[size_t(me)];
  std::vector<float> h(static_cast<size_t>(mine));
  for (int64_t k = 0; k < mine; ++k) h[size_t(k)] = static_cast<float>(me * 1000 + k);
  Dev<float> send(h), recv(std::vector<float>(size_t(total), -1.0f));
  comm.all_gather(send.p(), recv.p(), counts, CommType::F32)->wait();
  std::vector<float> got = recv.get();
  int64_t bad = 0;
  for (int r = 0; r < size; ++r)
    for (int64_t k = 0; k < counts[size_t(r)]; ++k) bad += got[size_t(off[size_t(r)] + k)] != static_cast<float>(r * 1000 + k);
  expect(bad == 0, name + " f32: " + std::to_string(bad) + " wrong");
  // i32 in place: this rank's block already sits at its offset.
  std::vector<int32_t> hb(size_t(total), -7);
  for (int64_t k = 0; k < mine; ++k) hb[size_t(off[size_t(me)] + k)] = me * 10000 + static_cast<int32_t>(k);
  Dev<int32_t> buf(hb);
  comm.all_gather(buf.p() + off[size_t(me)], buf.p(), counts, CommType::I32)->wait();
  const std::vector<int32_t> gb = buf.get();
  bad = 0;
  for (int r = 0; r < size; ++r)
    for (int64_t k = 0; k < counts[size_t(r)]; ++k) bad += gb[size_t(off[size_t(r)] + k)] != r * 10000 + k;
  expect(bad == 0, name + " i32 in place: " + std::to_string(bad) + " wrong");
}

void test_scatter_gather(Comm& comm, const std::string& tag) {
  const int size = comm.size();
  check_reduce_scatter(comm, tag + "reduce_scatter uneven", uneven_counts(size, 1 % size));
  check_reduce_scatter(comm, tag + "reduce_scatter equal", std::vector<int64_t>(size_t(size), 1234));
  check_all_gather(comm, tag + "all_gather uneven", uneven_counts(size, 0));
  check_all_gather(comm, tag + "all_gather equal", std::vector<int64_t>(size_t(size), 1234));
}

void test_broadcast_barrier(Comm& comm) {
  const int root = comm.size() - 1;
  std::vector<double> h(4099);
  for (size_t i = 0; i < h.size(); ++i) h[i] = comm.rank() == root ? static_cast<double>(i * 3 + 1) : -1.0;
  Dev<double> buf(h);
  comm.broadcast(buf.p(), int64_t(h.size()), CommType::F64, root)->wait();
  const std::vector<double> got = buf.get();
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != static_cast<double>(i * 3 + 1);
  expect(bad == 0, "broadcast f64 from root " + std::to_string(root) + ": " + std::to_string(bad) + " wrong");
  comm.barrier()->wait();
  CommHandle h2 = comm.barrier();
  while (!h2->test()) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

// Each rank sends to the next and receives from the previous, everything posted before any wait.
void test_ring(Comm& comm, int64_t n) {
  const int me = comm.rank(), size = comm.size();
  if (size < 2) return;
  const int right = (me + 1) % size, left = (me + size - 1) % size;
  auto value = [](int r, int tag, int64_t i) { return static_cast<float>(r * 10 + tag + i % 100); };
  std::vector<float> o1(static_cast<size_t>(n)), o2(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) o1[size_t(i)] = value(me, 1, i), o2[size_t(i)] = value(me, 2, i);
  Dev<float> out1(o1), out2(o2), in1(n), in2(n);
  // NCCL matches messages between two ranks in issue order: receives are issued in send order.
  CommHandle s1 = comm.send(out1.p(), n, CommType::F32, right, 1);
  CommHandle s2 = comm.send(out2.p(), n, CommType::F32, right, 2);
  CommHandle r1 = comm.recv(in1.p(), n, CommType::F32, left, 1);
  CommHandle r2 = comm.recv(in2.p(), n, CommType::F32, left, 2);
  s1->wait(), s2->wait(), r1->wait(), r2->wait();
  const std::vector<float> g1 = in1.get(), g2 = in2.get();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += g1[size_t(i)] != value(left, 1, i) || g2[size_t(i)] != value(left, 2, i);
  expect(bad == 0, "ring send/recv: " + std::to_string(bad) + " wrong");
}

// Receive into a buffer from the previous rank and forward it to the next, both issued before
// waiting: the send must wait for the receive into the same buffer.
void test_relay(Comm& comm) {
  const int me = comm.rank(), size = comm.size();
  if (size < 2) return;
  Dev<float> relay(std::vector<float>(70000, me == 0 ? 42.0f : -1.0f));
  CommHandle in, out;
  if (me > 0) in = comm.recv(relay.p(), 70000, CommType::F32, me - 1, 5);
  if (me < size - 1) out = comm.send(relay.p(), 70000, CommType::F32, me + 1, 5);
  if (in) in->wait();
  if (out) out->wait();
  const std::vector<float> got = relay.get();
  int64_t bad = 0;
  for (float v : got) bad += v != 42.0f;
  expect(bad == 0, "relay through the same buffer: " + std::to_string(bad) + " wrong");
}

void test_in_flight(Comm& comm) {
  const int me = comm.rank(), size = comm.size();
  const int ops = 40;
  std::vector<std::unique_ptr<Dev<float>>> bufs;
  std::vector<CommHandle> handles;
  for (int k = 0; k < ops; ++k) {
    const int64_t n = k * 37 + 1;
    bufs.push_back(std::make_unique<Dev<float>>(std::vector<float>(size_t(n), static_cast<float>(me + k))));
    if (k % 5 == 4)
      handles.push_back(comm.broadcast(bufs.back()->p(), n, CommType::F32, k % size));
    else
      handles.push_back(comm.all_reduce(bufs.back()->p(), bufs.back()->p(), n, CommType::F32, ReduceOp::Sum));
  }
  for (int k = 0; k < ops; ++k) {
    handles[size_t(k)]->wait();
    const float want = k % 5 == 4 ? static_cast<float>(k % size + k) : static_cast<float>(size * (size - 1) / 2 + size * k);
    int64_t bad = 0;
    for (float v : bufs[size_t(k)]->get()) bad += v != want;
    expect(bad == 0, "in-flight op " + std::to_string(k) + ": " + std::to_string(bad) + " wrong");
  }
}

void run_all(Comm& comm, const std::string& tag) {
  test_all_reduce(comm, tag);
  test_scatter_gather(comm, tag);
  test_broadcast_barrier(comm);
  test_ring(comm, 1 << 20);
  test_relay(comm);
  test_in_flight(comm);
}

int run(bool watchdog_test) {
  if (watchdog_test) unsetenv("ZAYA_COMM_TIMEOUT");
  CommOptions boot_options;
  boot_options.timeout_s = 120;
  std::unique_ptr<Comm> boot = make_comm(boot_options);
  g_rank = boot->rank();
  // Every rank needs a GPU of its own (the ranks' GPUs compared by host and PCI bus id, so a
  // launcher that shows each rank one GPU counts as well as one that shows them all).
  const std::string shared = nccl_shared_gpus(*boot, boot->local_rank());
  if (!shared.empty()) {
    if (boot->rank() == 0) std::printf("nccl_check: skipped: %s (NCCL needs one GPU per rank)\n", shared.c_str());
    return 0;
  }
  if (watchdog_test && boot->size() < 2) {
    std::fprintf(stderr, "nccl_check --watchdog-test needs at least 2 ranks\n");
    return 1;
  }
  const int device = nccl_device_for(boot->local_rank());
  CudaBackendOptions bo;
  bo.device = device;
  std::unique_ptr<Backend> be = make_cuda_backend(bo);
  g_be = be.get();
  CommOptions options;
  options.timeout_s = watchdog_test ? (boot->rank() == 0 ? 10 : 120) : 120;
  std::unique_ptr<Comm> comm = make_nccl_comm(*boot, device, options);

  if (watchdog_test) {
    Dev<float> buf(std::vector<float>(1024, 1.0f));
    comm->all_reduce(buf.p(), buf.p(), 1024, CommType::F32, ReduceOp::Sum)->wait();
    comm->barrier()->wait();
    if (comm->rank() == 1) {
      std::fprintf(stderr, "nccl_check: rank 1 sleeps 40 s before the next all_reduce\n");
      std::this_thread::sleep_for(std::chrono::seconds(40));
    }
    comm->all_reduce(buf.p(), buf.p(), 1024, CommType::F32, ReduceOp::Sum)->wait();
    std::fprintf(stderr, "nccl_check: rank %d got past the all_reduce that rank 1 joined 40 s late\n", comm->rank());
    return 1;
  }

  expect(comm->name() == "nccl", "the communicator's name is " + comm->name());
  expect(comm->rank() == boot->rank() && comm->size() == boot->size(), "rank and size are the bootstrap's");
  run_all(*comm, "");
  {
    std::unique_ptr<Comm> uneven = make_nccl_comm(*boot, device, options, nullptr, true);
    run_all(*uneven, "[uneven paths] ");
  }
  int64_t failures = g_failures, total = 0;
  boot->all_reduce(&failures, &total, 1, CommType::I64, ReduceOp::Sum)->wait();
  if (total != 0) {
    if (boot->rank() == 0) std::fprintf(stderr, "nccl_check: %lld failures over %d ranks\n", (long long)total, boot->size());
    return 1;
  }
  if (boot->rank() == 0) std::printf("nccl_check: %d ranks OK\n", boot->size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  rank_checks::g_program = "nccl_check";
  const bool watchdog_test = argc > 1 && std::strcmp(argv[1], "--watchdog-test") == 0;
  if (argc > 1 && !watchdog_test) {
    std::fprintf(stderr, "usage: mpirun -np N nccl_check [--watchdog-test]\n");
    return 2;
  }
  try {
    return run(watchdog_test);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_check: rank %d: %s\n", g_rank, e.what());
    return 1;
  }
}
