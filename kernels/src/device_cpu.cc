#include "kvtier/kernels/device.h"

namespace kvtier::kernels {

int DeviceCount(KernelStatus* why_none) {
  if (why_none != nullptr) *why_none = {-1, "built without CUDA"};
  return 0;
}

bool CudaAvailable() { return false; }

const char* BuildFlavor() { return "cpu"; }

}  // namespace kvtier::kernels
