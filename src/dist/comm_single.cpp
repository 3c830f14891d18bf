// The single-process communicator (rank 0 of 1) and the CommType helpers.
// Every collective over one rank is a copy of send to recv (nothing when in place); operations
// complete before the call returns. Point-to-point messages have no peer and are errors.
#include <cstring>

#include "core/error.h"
#include "dist/comm.h"

namespace zaya {

int64_t comm_type_size(CommType t) {
  switch (t) {
    case CommType::F32: return 4;
    case CommType::F64: return 8;
    case CommType::I32: return 4;
    case CommType::I64: return 8;
    case CommType::U8: return 1;
  }
  fail("comm", "unknown CommType " + std::to_string(static_cast<int>(t)));
}

const char* comm_type_name(CommType t) {
  switch (t) {
    case CommType::F32: return "f32";
    case CommType::F64: return "f64";
    case CommType::I32: return "i32";
    case CommType::I64: return "i64";
    case CommType::U8: return "u8";
  }
  return "unknown";
}

namespace {

class DoneRequest : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

CommHandle done() { return std::make_unique<DoneRequest>(); }

void check_count(const char* op, int64_t count) {
  if (count < 0) fail("comm", std::string(op) + ": negative count " + std::to_string(count));
}

void copy(const void* send, void* recv, int64_t count, CommType type) {
  int64_t bytes = count * comm_type_size(type);
  if (bytes > 0 && send != recv) std::memmove(recv, send, static_cast<size_t>(bytes));
}

class SingleComm : public Comm {
 public:
  std::string name() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }

  CommHandle all_reduce(const void* send, void* recv, int64_t count, CommType type, ReduceOp) override {
    check_count("all_reduce", count);
    copy(send, recv, count, type);
    return done();
  }
  CommHandle reduce_scatter(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type,
                            ReduceOp) override {
    check_counts("reduce_scatter", counts);
    copy(send, recv, counts[0], type);
    return done();
  }
  CommHandle all_gather(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type) override {
    check_counts("all_gather", counts);
    copy(send, recv, counts[0], type);
    return done();
  }
  CommHandle broadcast(void*, int64_t count, CommType, int root) override {
    check_count("broadcast", count);
    if (root != 0)
      fail("comm", "broadcast: root " + std::to_string(root) + " is not a rank (the single-process communicator has rank 0 only)");
    return done();
  }
  CommHandle barrier() override { return done(); }
  CommHandle send(const void*, int64_t, CommType, int peer, int) override { no_peer("send", peer); }
  CommHandle recv(void*, int64_t, CommType, int peer, int) override { no_peer("recv", peer); }

 private:
  static void check_counts(const char* op, const std::vector<int64_t>& counts) {
    if (counts.size() != 1)
      fail("comm", std::string(op) + ": counts has " + std::to_string(counts.size()) + " entries, expected 1 (one per rank)");
    check_count(op, counts[0]);
  }
  [[noreturn]] static void no_peer(const char* op, int peer) {
    fail("comm", std::string(op) + " to/from rank " + std::to_string(peer) +
                     ": the single-process communicator has no peers",
         "launch with mpirun for multi-process training");
  }
};

}  // namespace

std::unique_ptr<Comm> make_single_comm() { return std::make_unique<SingleComm>(); }

}  // namespace zaya
