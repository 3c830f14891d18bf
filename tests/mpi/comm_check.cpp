// comm_check: run under `mpirun -np N` (N >= 2), checks every operation of the MPI communicator
// (src/dist/) with rank-dependent data and exact expected results (integer-valued floats, so sums
// are exact): all_reduce of every type and reduction, in place and not; reduce_scatter and
// all_gather with uneven counts including a zero; broadcast from a non-zero root; a ring of
// sends and receives; many operations in flight at once; operations on the same buffer in issue
// order; operations split into chunks; argument errors. Rank 0 prints "comm_check: N ranks OK" and every rank exits 0, or 1 on any mismatch.
//
// comm_check --watchdog-test (N >= 2): rank 1 stops itself with SIGSTOP before an all_reduce; the
// other ranks must hit the watchdog (3 s on rank 0, 6 s elsewhere, so rank 0 reports first),
// print its line naming peer 1 and exit with kCommTimeoutExitCode. Getting past the all_reduce is
// a failure. tests/mpi/watchdog_test.sh drives this mode.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/comm_mpi.h"

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

template <class T>
void check_all_reduce(Comm& comm, const char* name, int64_t n, ReduceOp op, bool in_place, const Gen<T>& gen) {
  std::vector<T> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n), T(0));
  for (int64_t i = 0; i < n; ++i) send[static_cast<size_t>(i)] = gen(comm.rank(), i);
  void* out = in_place ? static_cast<void*>(send.data()) : static_cast<void*>(recv.data());
  comm.all_reduce(send.data(), out, n, type_of<T>(), op)->wait();
  const std::vector<T>& got = in_place ? send : recv;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i)
    if (got[static_cast<size_t>(i)] != reduced(gen, comm.size(), i, op)) ++bad;
  expect(bad == 0, std::string(name) + ": " + std::to_string(bad) + " of " + std::to_string(n) + " wrong");
}

void test_all_reduce(Comm& comm) {
  comm_expect::for_each_all_reduce_case([&](const char* name, int64_t n, ReduceOp op, bool in_place, const auto& gen) {
    check_all_reduce(comm, name, n, op, in_place, gen);
  });
}

void test_reduce_scatter(Comm& comm) {
  const int me = comm.rank(), size = comm.size();
  const std::vector<int64_t> counts = uneven_counts(size, 1 % size);
  const std::vector<int64_t> off = offsets(counts);
  const int64_t total = off.back(), mine = counts[static_cast<size_t>(me)];
  // f32 sum, out of place: rank r contributes r*100 + j at global index j.
  std::vector<float> send(static_cast<size_t>(total)), recv(static_cast<size_t>(mine) + 1, -1.0f);
  for (int64_t j = 0; j < total; ++j) send[static_cast<size_t>(j)] = static_cast<float>(me * 100 + j);
  comm.reduce_scatter(send.data(), recv.data(), counts, CommType::F32, ReduceOp::Sum)->wait();
  for (int64_t k = 0; k < mine; ++k) {
    int64_t j = off[static_cast<size_t>(me)] + k;
    float want = static_cast<float>(100 * size * (size - 1) / 2 + size * j);
    expect(recv[static_cast<size_t>(k)] == want, "reduce_scatter f32 sum at " + std::to_string(k));
  }
  expect(recv[static_cast<size_t>(mine)] == -1.0f, "reduce_scatter wrote past this rank's block");
  // i64 max, in place: the result lands at the start of the buffer.
  std::vector<int64_t> buf(static_cast<size_t>(total));
  for (int64_t j = 0; j < total; ++j) buf[static_cast<size_t>(j)] = ((j + me) % size) * 1000 + j;
  comm.reduce_scatter(buf.data(), buf.data(), counts, CommType::I64, ReduceOp::Max)->wait();
  for (int64_t k = 0; k < mine; ++k) {
    int64_t j = off[static_cast<size_t>(me)] + k;
    expect(buf[static_cast<size_t>(k)] == (size - 1) * 1000 + j, "reduce_scatter i64 max in place at " + std::to_string(k));
  }
}

void test_all_gather(Comm& comm) {
  const int me = comm.rank(), size = comm.size();
  const std::vector<int64_t> counts = uneven_counts(size, 0);
  const std::vector<int64_t> off = offsets(counts);
  const int64_t total = off.back(), mine = counts[static_cast<size_t>(me)];
  // f32, out of place.
  std::vector<float> send(static_cast<size_t>(mine)), recv(static_cast<size_t>(total), -1.0f);
  for (int64_t k = 0; k < mine; ++k) send[static_cast<size_t>(k)] = static_cast<float>(me * 1000 + k);
  comm.all_gather(send.data(), recv.data(), counts, CommType::F32)->wait();
  for (int r = 0; r < size; ++r)
    for (int64_t k = 0; k < counts[static_cast<size_t>(r)]; ++k)
      expect(recv[static_cast<size_t>(off[static_cast<size_t>(r)] + k)] == static_cast<float>(r * 1000 + k),
             "all_gather f32 rank " + std::to_string(r) + " element " + std::to_string(k));
  // i32, in place: this rank's block already sits at its offset.
  const std::vector<int64_t> counts2 = uneven_counts(size, size - 1);
  const std::vector<int64_t> off2 = offsets(counts2);
  std::vector<int32_t> buf(static_cast<size_t>(off2.back()), -7);
  for (int64_t k = 0; k < counts2[static_cast<size_t>(me)]; ++k)
    buf[static_cast<size_t>(off2[static_cast<size_t>(me)] + k)] = me * 10000 + static_cast<int32_t>(k);
  comm.all_gather(buf.data() + off2[static_cast<size_t>(me)], buf.data(), counts2, CommType::I32)->wait();
  for (int r = 0; r < size; ++r)
    for (int64_t k = 0; k < counts2[static_cast<size_t>(r)]; ++k)
      expect(buf[static_cast<size_t>(off2[static_cast<size_t>(r)] + k)] == r * 10000 + k,
             "all_gather i32 in place rank " + std::to_string(r) + " element " + std::to_string(k));
}

void test_broadcast_barrier(Comm& comm) {
  const int root = comm.size() - 1;
  std::vector<double> buf(4099);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = comm.rank() == root ? static_cast<double>(i * 3 + 1) : -1.0;
  comm.broadcast(buf.data(), static_cast<int64_t>(buf.size()), CommType::F64, root)->wait();
  int64_t bad = 0;
  for (size_t i = 0; i < buf.size(); ++i) bad += buf[i] != static_cast<double>(i * 3 + 1);
  expect(bad == 0, "broadcast f64 from root " + std::to_string(root) + ": " + std::to_string(bad) + " wrong");
  comm.broadcast(nullptr, 0, CommType::U8, 0)->wait();
  comm.barrier()->wait();
  // test() polls without blocking until the operation is done.
  CommHandle h = comm.barrier();
  while (!h->test()) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

// Each rank sends to the next and receives from the previous, all posted before any wait: a
// message large enough for the rendezvous protocol would deadlock if sends ran one at a time.
void test_ring(Comm& comm, int64_t n, const char* name) {
  const int me = comm.rank(), size = comm.size();
  const int right = (me + 1) % size, left = (me + size - 1) % size;
  auto value = [](int r, int tag, int64_t i) { return static_cast<float>(r * 10 + tag + i % 100); };
  std::vector<float> out1(static_cast<size_t>(n)), out2(static_cast<size_t>(n)), in1(static_cast<size_t>(n)),
      in2(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out1[static_cast<size_t>(i)] = value(me, 1, i);
    out2[static_cast<size_t>(i)] = value(me, 2, i);
  }
  // Tags 1 then 2 are sent; they are received in the other order.
  CommHandle s1 = comm.send(out1.data(), n, CommType::F32, right, 1);
  CommHandle s2 = comm.send(out2.data(), n, CommType::F32, right, 2);
  CommHandle r2 = comm.recv(in2.data(), n, CommType::F32, left, 2);
  CommHandle r1 = comm.recv(in1.data(), n, CommType::F32, left, 1);
  s1->wait();
  s2->wait();
  r2->wait();
  r1->wait();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i)
    bad += in1[static_cast<size_t>(i)] != value(left, 1, i) || in2[static_cast<size_t>(i)] != value(left, 2, i);
  expect(bad == 0, std::string(name) + ": " + std::to_string(bad) + " wrong");
}

// Forty operations (all_reduces of different sizes and broadcasts from rotating roots) issued
// before the first wait, then waited on in order.
void test_in_flight(Comm& comm) {
  const int me = comm.rank(), size = comm.size();
  const int ops = 40;
  std::vector<std::vector<float>> bufs(ops);
  std::vector<CommHandle> handles;
  for (int k = 0; k < ops; ++k) {
    bufs[static_cast<size_t>(k)].assign(static_cast<size_t>(k * 37 + 1), static_cast<float>(me + k));
    if (k % 5 == 4)
      handles.push_back(comm.broadcast(bufs[static_cast<size_t>(k)].data(), k * 37 + 1, CommType::F32, k % size));
    else
      handles.push_back(comm.all_reduce(bufs[static_cast<size_t>(k)].data(), bufs[static_cast<size_t>(k)].data(),
                                        k * 37 + 1, CommType::F32, ReduceOp::Sum));
  }
  for (int k = 0; k < ops; ++k) {
    handles[static_cast<size_t>(k)]->wait();
    float want = k % 5 == 4 ? static_cast<float>(k % size + k) : static_cast<float>(size * (size - 1) / 2 + size * k);
    int64_t bad = 0;
    for (float v : bufs[static_cast<size_t>(k)]) bad += v != want;
    expect(bad == 0, "in-flight op " + std::to_string(k) + ": " + std::to_string(bad) + " wrong");
  }
}

// Operations on the same memory, issued without waiting in between, take effect in issue order.
void test_same_buffer_order(Comm& comm) {
  const int me = comm.rank(), size = comm.size();
  const int64_t n = 5000;
  std::vector<int64_t> buf(static_cast<size_t>(n), me + 1);
  CommHandle a = comm.all_reduce(buf.data(), buf.data(), n, CommType::I64, ReduceOp::Sum);
  CommHandle b = comm.all_reduce(buf.data(), buf.data(), n, CommType::I64, ReduceOp::Sum);
  CommHandle c = comm.broadcast(buf.data(), n, CommType::I64, 1);
  CommHandle d = comm.all_reduce(buf.data(), buf.data(), n, CommType::I64, ReduceOp::Max);
  a->wait(), b->wait(), c->wait(), d->wait();
  const int64_t want = int64_t(size) * size * (size + 1) / 2;
  int64_t bad = 0;
  for (int64_t v : buf) bad += v != want;
  expect(bad == 0, "same-buffer chain of all_reduce/broadcast: " + std::to_string(bad) + " wrong");
  // A relay: each rank receives into relay from the previous rank and forwards relay to the next,
  // both issued before waiting: the send must wait for the receive into the same buffer.
  std::vector<float> relay(70000, me == 0 ? 42.0f : -1.0f);
  CommHandle in, out;
  if (me > 0) in = comm.recv(relay.data(), 70000, CommType::F32, me - 1, 5);
  if (me < size - 1) out = comm.send(relay.data(), 70000, CommType::F32, me + 1, 5);
  if (in) in->wait();
  if (out) out->wait();
  bad = 0;
  for (float v : relay) bad += v != 42.0f;
  expect(bad == 0, "relay through the same buffer: " + std::to_string(bad) + " wrong");
}

// A communicator with 1000-element chunks: large operations are split into several MPI calls.
void test_chunks(const CommOptions& options) {
  std::unique_ptr<Comm> small = make_mpi_comm(options, 1000);
  const int me = small->rank(), size = small->size();
  check_all_reduce<float>(*small, "chunked all_reduce f32 sum in place", 2500, ReduceOp::Sum, true,
                          [](int r, int64_t i) { return static_cast<float>(r + i % 1000); });
  check_all_reduce<int64_t>(*small, "chunked all_reduce i64 sum", 3000, ReduceOp::Sum, false,
                            [](int r, int64_t i) { return (int64_t(r) << 33) + i; });
  std::vector<int64_t> buf(2345);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = me == 0 ? static_cast<int64_t>(i) << 34 : -1;
  small->broadcast(buf.data(), static_cast<int64_t>(buf.size()), CommType::I64, 0)->wait();
  int64_t bad = 0;
  for (size_t i = 0; i < buf.size(); ++i) bad += buf[i] != static_cast<int64_t>(i) << 34;
  expect(bad == 0, "chunked broadcast i64: " + std::to_string(bad) + " wrong");
  test_ring(*small, 3001, "chunked ring send/recv");
  // A receive expecting more than was sent completes with an error from wait().
  const int right = (me + 1) % size, left = (me + size - 1) % size;
  std::vector<uint8_t> out(10, 5), in(20, 0);
  CommHandle s = small->send(out.data(), 10, CommType::U8, right, 9);
  CommHandle r = small->recv(in.data(), 20, CommType::U8, left, 9);
  s->wait();
  bool threw = false;
  try {
    r->wait();
  } catch (const Error& e) {
    threw = std::string(e.what()).find("received 10 elements where 20 were expected") != std::string::npos;
    if (!threw) std::fprintf(stderr, "comm_check: unexpected error text: %s\n", e.what());
  }
  expect(threw, "recv of fewer elements than expected reports an error");
}

template <class F>
void expect_error(const char* what, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    if (e.component() == "comm") return;
  }
  expect(false, std::string(what) + " should throw a comm error");
}

void test_argument_errors(Comm& comm) {
  float x[4] = {0, 0, 0, 0};
  const int me = comm.rank(), size = comm.size();
  expect_error("send to self", [&] { comm.send(x, 4, CommType::F32, me, 0); });
  expect_error("recv from a rank past the end", [&] { comm.recv(x, 4, CommType::F32, size, 0); });
  expect_error("send with a negative tag", [&] { comm.send(x, 4, CommType::F32, (me + 1) % size, -1); });
  expect_error("broadcast from a bad root", [&] { comm.broadcast(x, 4, CommType::F32, size); });
  expect_error("all_reduce of a negative count", [&] { comm.all_reduce(x, x, -1, CommType::F32, ReduceOp::Sum); });
  expect_error("reduce_scatter with too few counts",
               [&] { comm.reduce_scatter(x, x, std::vector<int64_t>(static_cast<size_t>(size) - 1, 1), CommType::F32, ReduceOp::Sum); });
  expect_error("all_gather past INT_MAX", [&] {
    std::vector<int64_t> counts(static_cast<size_t>(size), int64_t(1) << 31);
    comm.all_gather(x, x, counts, CommType::U8);
  });
}

int run_checks() {
  CommOptions options;
  options.timeout_s = 60;
  std::unique_ptr<Comm> comm = make_comm(options);
  g_rank = comm->rank();
  expect(comm->name() == "mpi", "make_comm under mpirun gives the MPI communicator, not " + comm->name());
  expect(comm->size() >= 2, "comm_check needs at least 2 ranks");
  if (comm->size() < 2) return 1;
  expect(comm->local_rank() >= 0 && comm->local_rank() < comm->local_size() && comm->local_size() <= comm->size(),
         "local rank/size");
  test_argument_errors(*comm);
  test_all_reduce(*comm);
  test_reduce_scatter(*comm);
  test_all_gather(*comm);
  test_broadcast_barrier(*comm);
  test_ring(*comm, 1 << 20, "ring send/recv");
  test_in_flight(*comm);
  test_same_buffer_order(*comm);
  test_chunks(options);
  int64_t failures = g_failures, total = 0;
  comm->all_reduce(&failures, &total, 1, CommType::I64, ReduceOp::Sum)->wait();
  if (total != 0) {
    if (comm->rank() == 0) std::fprintf(stderr, "comm_check: %lld failures over %d ranks\n", (long long)total, comm->size());
    return 1;
  }
  if (comm->rank() == 0) std::printf("comm_check: %d ranks OK\n", comm->size());
  return 0;
}

int env_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

int run_watchdog_test() {
  CommOptions options;
  options.timeout_s = env_rank() == 0 ? 3 : 6;  // rank 0 reports first
  std::unique_ptr<Comm> comm = make_comm(options);
  g_rank = comm->rank();
  if (comm->size() < 2) {
    std::fprintf(stderr, "comm_check --watchdog-test needs at least 2 ranks\n");
    return 1;
  }
  std::vector<float> buf(1024, 1.0f);
  comm->all_reduce(buf.data(), buf.data(), 1024, CommType::F32, ReduceOp::Sum)->wait();
  comm->barrier()->wait();
  if (comm->rank() == 1) {
    std::fprintf(stderr, "comm_check: rank 1 (pid %d) stops itself with SIGSTOP\n", static_cast<int>(getpid()));
    std::raise(SIGSTOP);
  }
  comm->all_reduce(buf.data(), buf.data(), 1024, CommType::F32, ReduceOp::Sum)->wait();
  std::fprintf(stderr, "comm_check: rank %d got past the all_reduce that rank 1 never joined\n", comm->rank());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  rank_checks::g_program = "comm_check";
  try {
    if (argc > 1 && std::strcmp(argv[1], "--watchdog-test") == 0) return run_watchdog_test();
    if (argc > 1) {
      std::fprintf(stderr, "usage: mpirun -np N comm_check [--watchdog-test]\n");
      return 2;
    }
    return run_checks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_check: rank %d: %s\n", g_rank, e.what());
    return 1;
  }
}
