// Device discovery for kvtier's kernels and GPU tiers. Builds with or without CUDA; no absl here, so
// kernels/ builds on a machine that has only the CUDA toolkit.
#ifndef KVTIER_KERNELS_DEVICE_H_
#define KVTIER_KERNELS_DEVICE_H_

#include "kvtier/kernels/kernel_status.h"

namespace kvtier::kernels {

// True when this build has CUDA and at least one device is usable now (a driver is loaded and
// cudaGetDeviceCount reports > 0). Cheap after the first call. Thread-safe.
bool CudaAvailable();

// Number of usable devices (0 without CUDA or without a driver), and why there are none.
int DeviceCount(KernelStatus* why_none = nullptr);

// "cuda" when built with CUDA, else "cpu".
const char* BuildFlavor();

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_DEVICE_H_
