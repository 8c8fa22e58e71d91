// The kernels' own small status. kernels/ builds with only the CUDA toolkit, so it has no absl;
// client_lib converts a KernelStatus to absl::Status at its edge (DESIGN.md §6, HOUSE_STYLE §3).
// A plain value type; copy freely.
#ifndef KVTIER_KERNELS_KERNEL_STATUS_H_
#define KVTIER_KERNELS_KERNEL_STATUS_H_

#include <string>

namespace kvtier::kernels {

// Codes below 0 are kvtier's own; codes above 0 are CUDA runtime errors (a cudaError_t number).
inline constexpr int kKernelOk = 0;
// The call needs CUDA and this build has none, or no device is usable (client_lib: Unavailable /
// FailedPrecondition).
inline constexpr int kKernelNoCuda = -1;
// A shape, size, pointer or table entry is wrong; nothing was read or written (client_lib:
// InvalidArgument). The message names the bad field and its value.
inline constexpr int kKernelInvalidArgument = -2;

struct KernelStatus {
  int code = kKernelOk;  // kKernelOk; kKernelNoCuda; kKernelInvalidArgument; or a cudaError_t (> 0)
  std::string message;   // human-readable cause (cudaGetErrorString for CUDA errors); empty when ok
  bool ok() const { return code == kKernelOk; }
};

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_KERNEL_STATUS_H_
