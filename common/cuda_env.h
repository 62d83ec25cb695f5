// Thin, always-compiled wrappers over the few CUDA runtime calls the CPU-side tiers need
// (device count, host-memory registration). In a build without CUDA they report "no
// device" / Unsupported, so the host pool and the TierManager compile and run unchanged.
#pragma once

#include <cstddef>
#include <string>

#include "formats/status.h"

namespace kvtier::cuda {

// True when this library was compiled with the CUDA runtime (KVTIER_HAVE_CUDA).
bool Compiled();
// Number of usable CUDA devices; 0 without CUDA, without a driver or without a GPU.
// `why` (optional) receives the reason when 0.
int DeviceCount(std::string* why = nullptr);
// Name of device `dev` ("NVIDIA H200"), or "" when there is none.
std::string DeviceName(int dev);
// cudaHostRegister(ptr, bytes, portable) so that DMA from/to it runs at PCIe speed.
Status HostRegister(void* ptr, size_t bytes);
Status HostUnregister(void* ptr);

}  // namespace kvtier::cuda
