// Internal: process-wide MPI state for the MPI communicator. MPI is initialised once
// (MPI_THREAD_SERIALIZED) and finalised at exit; one mutex serialises every MPI call in the
// process (each communicator's thread and the constructing/destroying threads take it), which is
// what the SERIALIZED level asks of us. Communicators still alive at exit are stopped (their
// queued operations drained, their threads joined) before MPI_Finalize.
#pragma once
// The C API only: skip the deprecated MPI C++ bindings (and their warnings).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <mutex>
#include <string>

namespace zaya {

// Something holding MPI resources that must be released before MPI_Finalize.
class MpiService {
 public:
  virtual ~MpiService() = default;
  // Drains, stops its thread and frees its MPI objects. Idempotent; takes mpi_mutex() itself.
  virtual void stop() = 0;
};

// Initialises MPI if nobody has (and registers MPI_Finalize at exit); fails if MPI was finalised
// or cannot give MPI_THREAD_SERIALIZED.
void mpi_init_once();
// Held around every MPI call.
std::mutex& mpi_mutex();
// Services alive at exit are stopped before MPI_Finalize; a service unregisters in its destructor.
void mpi_register(MpiService* service);
void mpi_unregister(MpiService* service);
// MPI_Error_string of an MPI error code.
std::string mpi_error_text(int code);

}  // namespace zaya
