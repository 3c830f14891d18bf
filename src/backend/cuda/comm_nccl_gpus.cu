// Which GPU each rank of an NCCL communicator uses, and whether two ranks would share one
// (comm_nccl.h): the local rank modulo the visible GPUs, identified across the job by host name
// and PCI bus id, gathered over the bootstrap communicator (host memory). NCCL refuses two ranks
// on one GPU with an error that does not say so; this says which ranks and which GPU. Built with
// the other comm_nccl*.cu files. Not yet run with two or more GPUs.
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <map>

#include "backend/cuda/comm_nccl.h"
#include "backend/cuda/cuda_factory.h"
#include "backend/cuda/gpu_runtime.h"

namespace zaya {

namespace {

constexpr size_t kHostChars = 64, kBusChars = 32;
using GpuIdentity = std::array<char, kHostChars + kBusChars>;  // host name, then PCI bus id; zero-padded

// This rank's GPU, or a bus id of "none: <why>" when it has no usable one.
GpuIdentity identity_of(int device) {
  GpuIdentity id{};
  char host[kHostChars] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strncpy(host, "unknown-host", sizeof(host) - 1);
  std::memcpy(id.data(), host, kHostChars);
  char bus[kBusChars] = {};
  const int count = cuda_device_count();
  if (count == 0) {
    std::strncpy(bus, "none: no GPU visible", sizeof(bus) - 1);
  } else if (gpuDeviceGetPCIBusId(bus, int(sizeof(bus)) - 1, nccl_device_for(device)) != gpuSuccess) {
    (void)gpuGetLastError();
    std::snprintf(bus, sizeof(bus), "none: device %d unusable", nccl_device_for(device));
  }
  std::memcpy(id.data() + kHostChars, bus, kBusChars);
  return id;
}

std::string text_of(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

}  // namespace

int nccl_device_for(int device) {
  const int count = cuda_device_count();
  return count > 0 && device >= 0 ? device % count : device;
}

std::string nccl_shared_gpus(Comm& bootstrap, int device) {
  const int size = bootstrap.size();
  const GpuIdentity mine = identity_of(device);
  std::vector<GpuIdentity> all(static_cast<size_t>(size));
  bootstrap.all_gather(mine.data(), all.data(), std::vector<int64_t>(size_t(size), int64_t(sizeof(GpuIdentity))),
                       CommType::U8)
      ->wait();
  std::map<GpuIdentity, std::vector<int>> ranks_of;
  for (int r = 0; r < size; ++r) ranks_of[all[size_t(r)]].push_back(r);
  std::string report;
  for (const auto& [id, ranks] : ranks_of) {
    const std::string host = text_of(id.data(), kHostChars), bus = text_of(id.data() + kHostChars, kBusChars);
    const bool none = bus.rfind("none:", 0) == 0;
    if (ranks.size() < 2 && !none) continue;
    std::string who;
    for (int r : ranks) who += (who.empty() ? "" : ", ") + std::to_string(r);
    if (!report.empty()) report += "; ";
    report += none ? "rank(s) " + who + " on " + host + " have no GPU (" + bus.substr(6) + ")"
                   : "ranks " + who + " share the GPU at PCI " + bus + " on " + host;
  }
  return report;
}

}  // namespace zaya
