// make_comm: picks the MPI or the single-process communicator from the environment, and applies
// ZAYA_COMM_TIMEOUT to the options; make_device_comm: NCCL where built, else a registered one.
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/comm_mpi.h"
#if defined(ZAYA_HAVE_NCCL) || defined(ZAYA_HAVE_RCCL)
#include "backend/cuda/comm_nccl.h"
#endif

namespace zaya {

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

CommOptions apply_comm_env(CommOptions options) {
  const char* text = std::getenv("ZAYA_COMM_TIMEOUT");
  if (text == nullptr) return options;
  char* end = nullptr;
  errno = 0;
  double seconds = std::strtod(text, &end);
  while (end != nullptr && *end == ' ') ++end;
  if (end == text || *end != '\0' || errno != 0 || !std::isfinite(seconds))
    fail("comm", std::string("ZAYA_COMM_TIMEOUT='") + text + "' is not a number of seconds",
         "set it to the watchdog deadline in seconds, e.g. ZAYA_COMM_TIMEOUT=300 (0 disables the watchdog)");
  options.timeout_s = seconds;
  return options;
}

std::unique_ptr<Comm> make_comm(const CommOptions& options, bool force_mpi) {
  CommOptions resolved = apply_comm_env(options);
  if (force_mpi || launched_by_mpi()) return make_mpi_comm(resolved);
  return make_single_comm();
}

namespace {
DeviceCommMaker& registered_device_comm() {
  static DeviceCommMaker maker;
  return maker;
}
}  // namespace

void register_device_comm(DeviceCommMaker maker) { registered_device_comm() = std::move(maker); }

std::unique_ptr<Comm> make_device_comm(Comm& bootstrap, int device, const CommOptions& options) {
#if defined(ZAYA_HAVE_NCCL) || defined(ZAYA_HAVE_RCCL)
  return make_nccl_comm(bootstrap, device, apply_comm_env(options));
#else
  if (registered_device_comm()) return registered_device_comm()(bootstrap, device, options);
  fail("comm", "this zaya was built without NCCL", "configure with -DZAYA_CUDA=ON where NCCL is installed");
#endif
}

}  // namespace zaya
