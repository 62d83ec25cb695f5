#include "common/cuda_env.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::cuda {

#if KVTIER_HAVE_CUDA
bool Compiled() { return true; }

int DeviceCount(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

std::string DeviceName(int dev) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return "";
  return p.name;
}

Status HostRegister(void* ptr, size_t bytes) {
  // Mapped: the HBM pool's gather kernel reads host slots directly (hbm/gather.cu).
  cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::IoError(std::string("cudaHostRegister: ") + cudaGetErrorString(e));
  }
  return Status::Ok();
}

Status HostUnregister(void* ptr) {
  cudaError_t e = cudaHostUnregister(ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::IoError(std::string("cudaHostUnregister: ") + cudaGetErrorString(e));
  }
  return Status::Ok();
}
#else
bool Compiled() { return false; }
int DeviceCount(std::string* why) {
  if (why) *why = "built without CUDA";
  return 0;
}
std::string DeviceName(int) { return ""; }
Status HostRegister(void*, size_t) { return Status::Unsupported("built without CUDA"); }
Status HostUnregister(void*) { return Status::Unsupported("built without CUDA"); }
#endif

}  // namespace kvtier::cuda
