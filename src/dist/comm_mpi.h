// Internal: the MPI communicator (comm_mpi.cpp). Programs call make_comm (dist/comm.h); this
// header is for make_comm and for tests that need a small chunk size.
#pragma once
#include <cstdint>
#include <memory>

#include "dist/comm.h"

namespace zaya {

// Initialises MPI on first use (MPI_THREAD_SERIALIZED) and returns a communicator over
// MPI_COMM_WORLD. Collective over all ranks: every rank must call it, in the same order as its
// other communicator constructions. max_chunk_elements > 0 caps the element count of a single MPI
// call (all_reduce, broadcast, send and recv are split into chunks of at most that many
// elements); 0 means INT_MAX, the most MPI can take.
std::unique_ptr<Comm> make_mpi_comm(const CommOptions& options, int64_t max_chunk_elements = 0);

}  // namespace zaya
