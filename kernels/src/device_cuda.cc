#include <cuda_runtime_api.h>

#include "kvtier/kernels/device.h"

namespace kvtier::kernels {

int DeviceCount(KernelStatus* why_none) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // cudaErrorInsufficientDriver / cudaErrorNoDevice: no usable GPU here.
    if (why_none != nullptr) *why_none = {static_cast<int>(err), cudaGetErrorString(err)};
    return 0;
  }
  if (n == 0 && why_none != nullptr) *why_none = {-1, "no CUDA device"};
  return n;
}

bool CudaAvailable() {
  static const bool available = DeviceCount() > 0;
  return available;
}

const char* BuildFlavor() { return "cuda"; }

}  // namespace kvtier::kernels
