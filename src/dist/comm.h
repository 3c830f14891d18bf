// The communication interface data parallelism runs on: rank/size, collectives and
// point-to-point messages, all asynchronous (each call returns a request to wait on).
// Implementations: single-process (comm_single.cpp), MPI (comm_mpi.cpp), and NCCL/RCCL on GPUs.
// The trainer only ever talks to this interface.
//
// Buffers live in the memory space the communicator was made for: host memory for the
// single-process and MPI communicators, device memory for NCCL. A buffer must stay valid, and
// must not be written by the caller (nor read, for a receiving buffer), until its request has
// completed. Requests must be waited on in the order they were issued when they use the same
// buffers; the MPI communicator runs operations that touch the same memory (one of them writing
// it) in the order they were issued, and others concurrently. Every rank must issue the same
// collectives in the same order (as with MPI). The NCCL communicator runs everything on one
// ordered stream, so there point-to-point messages must also sit at the same place among the
// collectives on the two ranks involved: a send issued before a collective on one rank and
// received after it on the other deadlocks there (it completes under MPI). The trainer sends no
// messages on its device communicator.
//
// In place: all_reduce with send == recv; reduce_scatter with send == recv (the result is written
// at the start of the buffer); all_gather with send == recv + offset of this rank's block (the
// block is already in place). Other overlaps of send and recv are not allowed.
//
// Watchdog: every collective and message runs under CommOptions::timeout_s, counted from the
// call that issued it. When an operation passes its deadline the process prints one line naming
// the operation, the byte count, the local rank and the peers not heard from for that operation,
// and exits with kCommTimeoutExitCode (it never aborts the other ranks itself: each reports its
// own view). The environment variable ZAYA_COMM_TIMEOUT (seconds; <= 0 disables) overrides
// CommOptions::timeout_s in make_comm. While the watchdog is on, every rank also tells every peer
// which collective it has reached, so ranks that issue different collectives (a program bug) are
// reported as a mismatch and exit with kCommMismatchExitCode.
//
// Errors in arguments (a count that does not fit, a bad peer or root) throw zaya::Error("comm")
// from the call itself; a failure inside MPI is thrown by wait() or test().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace zaya {

enum class CommType { F32, F64, I32, I64, U8 };
int64_t comm_type_size(CommType t);
const char* comm_type_name(CommType t);

enum class ReduceOp { Sum, Max, Min };

// Exit status of a process whose collective timed out (the fault-tolerant launcher acts on it).
constexpr int kCommTimeoutExitCode = 86;
// Exit status of a process whose ranks issued different collectives at the same position (a bug:
// restarting will not help).
constexpr int kCommMismatchExitCode = 87;

struct CommOptions {
  double timeout_s = 600;  // watchdog deadline for each operation; <= 0 disables it
};

// options with the environment applied: ZAYA_COMM_TIMEOUT (seconds), when set, replaces
// timeout_s. An unparsable value is an error. make_comm calls this.
CommOptions apply_comm_env(CommOptions options);

// One in-flight operation. wait() blocks until it has completed (or the watchdog fires);
// test() polls. Destroying an unfinished request waits for it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};
using CommHandle = std::unique_ptr<CommRequest>;

class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::string name() const = 0;  // "single", "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks on this node and this process's index among them (for device selection).
  virtual int local_rank() const { return rank(); }
  virtual int local_size() const { return size(); }

  // recv = op over ranks of send (count elements). send == recv is allowed (in place).
  virtual CommHandle all_reduce(const void* send, void* recv, int64_t count, CommType type, ReduceOp op) = 0;
  // send holds sum(counts) elements, rank r's block at offset sum(counts[0..r)); recv
  // (counts[rank()] elements) = op over ranks of this rank's block. counts may hold zeros.
  virtual CommHandle reduce_scatter(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type,
                                    ReduceOp op) = 0;
  // recv (sum(counts) elements) = concatenation over ranks r of their send (counts[r] elements).
  virtual CommHandle all_gather(const void* send, void* recv, const std::vector<int64_t>& counts, CommType type) = 0;
  virtual CommHandle broadcast(void* buf, int64_t count, CommType type, int root) = 0;
  virtual CommHandle barrier() = 0;
  virtual CommHandle send(const void* buf, int64_t count, CommType type, int peer, int tag) = 0;
  virtual CommHandle recv(void* buf, int64_t count, CommType type, int peer, int tag) = 0;
};

// Always available: rank 0 of 1; collectives copy send to recv.
std::unique_ptr<Comm> make_single_comm();
// MPI when the process was started by an MPI launcher (mpirun/mpiexec/srun, even with one rank)
// or force_mpi, else the single-process communicator. Initialises MPI once (thread level
// MPI_THREAD_SERIALIZED: each MPI communicator runs its operations on its own communication
// thread, and all MPI calls in the process are serialised); finalises it at exit, after the
// communication threads of communicators still alive have drained and stopped. A Comm may be
// called from several threads; operations are issued in the order the calls are made.
std::unique_ptr<Comm> make_comm(const CommOptions& options, bool force_mpi = false);
// The device communicator (NCCL, RCCL on HIP) over GPU `device`'s buffers, bootstrapped over
// `bootstrap` (collective). Throws zaya::Error("comm") in a build without NCCL.
std::unique_ptr<Comm> make_device_comm(Comm& bootstrap, int device, const CommOptions& options);
// The device communicator of a GPU backend linked from outside zaya_lib (the host emulation's
// NCCL, tests/simt), used by make_device_comm in a build without NCCL (see register_gpu_backend).
using DeviceCommMaker = std::function<std::unique_ptr<Comm>(Comm& bootstrap, int device, const CommOptions& options)>;
void register_device_comm(DeviceCommMaker maker);
// True when the environment says this process was launched by an MPI launcher.
bool launched_by_mpi();

}  // namespace zaya
