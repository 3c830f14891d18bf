// register_emulated_gpu (simt_register.h): the emulated backend and communicator behind
// zaya_lib's register_gpu_backend and register_device_comm hooks.
#include "simt_register.h"

#include "backend/backend.h"
#include "backend/cuda/comm_nccl.h"
#include "backend/cuda/cuda_factory.h"
#include "dist/comm.h"

namespace zaya::simt {

void register_emulated_gpu() {
  register_gpu_backend([](const std::string& name, int device) {
    return make_cuda_backend(cuda_backend_options_for(name, device, cuda_device_count()));
  });
  register_device_comm([](Comm& bootstrap, int device, const CommOptions& options) {
    return make_nccl_comm(bootstrap, device, options);  // which applies ZAYA_COMM_TIMEOUT
  });
}

}  // namespace zaya::simt
