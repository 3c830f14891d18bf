// Process-wide MPI state: initialise once, serialise calls, finalise at exit (see mpi_runtime.h).
#include "dist/mpi_runtime.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace zaya {
namespace {

struct Runtime {
  std::mutex mpi;                    // around every MPI call
  std::mutex registry;               // guards live
  std::vector<MpiService*> live;
  bool initialized_by_us = false;
};

// Never destroyed: the exit handler and late destructors may still use it.
Runtime& runtime() {
  static Runtime* r = new Runtime;
  return *r;
}

const char* thread_level_name(int level) {
  if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
  if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
  if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
  if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
  return "an unknown thread level";
}

void finalize_at_exit() {
  Runtime& r = runtime();
  std::vector<MpiService*> live;
  {
    std::lock_guard<std::mutex> g(r.registry);
    live.swap(r.live);
  }
  for (MpiService* s : live) s->stop();
  std::lock_guard<std::mutex> g(r.mpi);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (r.initialized_by_us && !finalized) MPI_Finalize();
}

void check_thread_level(int provided) {
  if (provided < MPI_THREAD_SERIALIZED)
    fail("comm",
         std::string("MPI provides ") + thread_level_name(provided) +
             ", but zaya needs MPI_THREAD_SERIALIZED (a communication thread makes the MPI calls)",
         "use an MPI library built with thread support (Debian's OpenMPI is)");
}

}  // namespace

std::mutex& mpi_mutex() { return runtime().mpi; }

void mpi_init_once() {
  Runtime& r = runtime();
  std::lock_guard<std::mutex> g(r.mpi);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    fail("comm", "MPI has already been finalised; no MPI communicator can be made now",
         "make the communicator before the program starts to exit");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) fail("comm", "MPI_Init_thread failed: " + mpi_error_text(rc));
    r.initialized_by_us = true;
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  check_thread_level(provided);
}

void mpi_register(MpiService* service) {
  std::lock_guard<std::mutex> g(runtime().registry);
  runtime().live.push_back(service);
}

void mpi_unregister(MpiService* service) {
  std::lock_guard<std::mutex> g(runtime().registry);
  auto& live = runtime().live;
  live.erase(std::remove(live.begin(), live.end(), service), live.end());
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length)) + " (MPI error " + std::to_string(code) + ")";
}

}  // namespace zaya
