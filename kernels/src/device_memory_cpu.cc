// The CPU build: no device memory exists, so every call reports kKernelNoCuda.
#include "kvtier/kernels/device_memory.h"

namespace kvtier::kernels {
namespace {
KernelStatus NoCuda(const char* what) { return {kKernelNoCuda, std::string(what) + ": built without CUDA"}; }
}  // namespace

KernelStatus DeviceMemoryInfo(int, uint64_t*, uint64_t*) { return NoCuda("DeviceMemoryInfo"); }
KernelStatus DeviceRegion::Create(int, uint64_t, std::unique_ptr<DeviceRegion>*) { return NoCuda("DeviceRegion"); }
DeviceRegion::~DeviceRegion() = default;
KernelStatus DeviceRegion::CopyIn(uint64_t, const void*, uint64_t) { return NoCuda("CopyIn"); }
KernelStatus DeviceRegion::CopyOut(uint64_t, void*, uint64_t) const { return NoCuda("CopyOut"); }
KernelStatus DeviceRegion::CopyWithin(uint64_t, uint64_t, uint64_t) { return NoCuda("CopyWithin"); }
KernelStatus PinHostMemory(void*, uint64_t) { return NoCuda("PinHostMemory"); }
KernelStatus UnpinHostMemory(void*) { return NoCuda("UnpinHostMemory"); }

}  // namespace kvtier::kernels
