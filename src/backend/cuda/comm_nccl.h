// The NCCL communicator (RCCL on HIP): the Comm interface (dist/comm.h) on device buffers. Plain
// C++ (no vendor header). Defined in comm_nccl.cu (with its watchdog in comm_nccl_watchdog.cu and
// its arrival channel in comm_nccl_arrival.cu); the comm_nccl*.cu files are compiled and linked
// only in a -DZAYA_CUDA=ON build that found NCCL (compile definition ZAYA_HAVE_NCCL), and compiled
// (objects only) for -DZAYA_HIP=ON where RCCL is installed (ZAYA_HAVE_RCCL), and into the host
// emulation of the GPU over its emulated NCCL (tests/simt/simt_nccl.h). Run with one rank on an
// H100, and with 1 to 3 ranks on the emulated NCCL: see docs/gpu.md, "NCCL / RCCL".
//
// Devices: `device` is the rank's local rank (as for make_backend), and the rank uses GPU
// nccl_device_for(device) = device mod the GPUs it can see, so a launcher that shows each rank
// one GPU (CUDA_VISIBLE_DEVICES per rank) works as well as one that shows them all. NCCL needs a
// GPU per rank: ranks that would share one (same host, same PCI bus id) get a clear error from
// make_nccl_comm, on every rank, before NCCL is initialised.
//
// Bootstrap: make_nccl_comm is collective over `bootstrap` (the MPI or single-process
// communicator, host memory). Rank 0 calls ncclGetUniqueId and broadcasts the id through
// bootstrap; every rank then calls ncclCommInitRank with bootstrap's rank and size. Failures
// found before the NCCL initialisation (no such device, no unique id) are agreed over bootstrap,
// so every rank throws the same zaya::Error("comm", ...) instead of leaving the others waiting.
// bootstrap is only used during the call; rank(), size(), local_rank() and local_size() are its.
//
// Memory and order: every buffer must be device memory of `device` (checked on each call). All
// operations run on one communication stream of this communicator, in issue order, so operations
// on the same memory take effect in the order they were issued. Before each operation the
// communication stream waits for all work already enqueued on the producer stream:
// `producer_stream` (a gpuStream_t passed as void*), or, when null, the legacy default stream,
// which orders after every blocking stream of the device (the CUDA backend's stream is one), so
// buffers written by kernels enqueued before the call are complete when the operation reads them.
// A request completes when an event recorded after its operation has; after wait() returns (or
// test() returned true), work enqueued afterwards on any stream sees the results.
//
// Uneven counts (reduce_scatter / all_gather, per-rank counts): NCCL's collectives take one count
// for every rank. Equal counts use ncclReduceScatter / ncclAllGather directly. Uneven ones run as
// one group (ncclGroupStart/End) of rooted collectives, one per rank with a non-empty block:
// ncclReduce rooted at the block's owner (reduce_scatter) and ncclBroadcast from it landing at
// the block's offset (all_gather), so memory and traffic follow the blocks themselves, not the
// largest one times the ranks (whole-tensor buckets are rarely even). An in-place reduce_scatter
// whose block overlaps its destination moves it through a device staging buffer of one block,
// which grows geometrically and is kept; buffers it outgrew are freed when the communicator is
// destroyed (an operation still queued on the stream may use them).
//
// Messages: NCCL has no tags. Messages between two ranks match in the order they were issued;
// the tag (>= 0) is only compared by the watchdog's arrival messages (see below), where a receive
// whose matching send has another tag, type or size is reported as a mismatch. Sends and
// receives are queued and launched together in one ncclGroupStart/End at the next collective, or
// wait() / test() on any request of this communicator, so a ring of sends and receives issued
// before waiting cannot deadlock. A message touching memory that an earlier queued one writes
// (or reads, when it writes) starts a new group, so the two take effect in issue order (a rank
// may receive into a buffer and forward it, both issued before waiting).
//
// Watchdog: as the MPI communicator's. Every operation has a deadline of timeout_s (after
// apply_comm_env: ZAYA_COMM_TIMEOUT overrides it; <= 0 disables it) from the call that issued it;
// ncclCommInitRank has one too. A watchdog thread polls the pending operations' events; on expiry
// it prints one line (the operation, its bytes, the rank, local rank and device, the peers not
// heard from), calls ncclCommAbort and exits with kCommTimeoutExitCode. Peers heard from: when
// the bootstrap is the MPI communicator and every rank runs the watchdog, each rank sends every
// peer a small arrival message per collective (and the receiver of a message one per send) on a
// private MPI communicator; a peer whose message has not arrived is named, and a message
// describing a different operation is a mismatch (kCommMismatchExitCode). Otherwise the peers
// are reported as unknown, with the reason. An asynchronous NCCL error (ncclCommGetAsyncError,
// polled by the same thread) aborts the communicator; pending and later requests then throw
// zaya::Error("comm", ...) from wait() / test() / the call.
//
// Threads: a communicator may be called from several threads; calls are serialised. A request
// must not outlive its communicator while it is still queued (every queued message is launched
// when the communicator is destroyed, which also waits for every operation to complete).
#pragma once
#include <memory>
#include <string>

#include "dist/comm.h"

namespace zaya {

// name() is "nccl" (also for RCCL, which implements NCCL's API). Throws zaya::Error("comm", ...)
// when the device does not exist or NCCL cannot be initialised. options go through
// apply_comm_env (ZAYA_COMM_TIMEOUT). uneven_paths_always is for tests: reduce_scatter and
// all_gather take their uneven-count paths (staging, grouped sends) even when the counts are
// equal, which is the only way to run them on one GPU (one GPU holds one rank, and the counts of
// a communicator of one rank are always equal).
std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device, const CommOptions& options,
                                     void* producer_stream = nullptr, bool uneven_paths_always = false);

// The GPU a rank with this local rank uses: device mod the visible GPUs (device itself when none
// is visible or it is negative). make_backend maps ranks to GPUs the same way. comm_nccl_gpus.cu.
int nccl_device_for(int device);

// Collective over bootstrap: "" when every rank's GPU (nccl_device_for(device); identified by
// host name and PCI bus id) is its own, else which ranks share which GPU. Every rank returns the
// same text. A rank without a usable GPU is reported too. comm_nccl_gpus.cu.
std::string nccl_shared_gpus(Comm& bootstrap, int device);

}  // namespace zaya
