// Device memory for the cache server's HBM tier: one region of device memory per server, copies between
// it and host memory, and page-locking of the host tier. Builds with or without CUDA and without absl,
// so the device-memory pieces build and test on a machine that has only the CUDA toolkit.
#ifndef KVTIER_KERNELS_DEVICE_MEMORY_H_
#define KVTIER_KERNELS_DEVICE_MEMORY_H_

#include <cstdint>
#include <memory>

#include "kvtier/kernels/kernel_status.h"

namespace kvtier::kernels {

// Free and total bytes of device `device` now (cudaMemGetInfo).
// Errors: kKernelNoCuda (no CUDA or no usable device), kKernelInvalidArgument (no such device, null
// outputs), a CUDA error code.
KernelStatus DeviceMemoryInfo(int device, uint64_t* free_bytes, uint64_t* total_bytes);

// One contiguous region of device memory (cudaMalloc) on one device, owned by this object and freed by
// its destructor. The HBM tier carves slots from it by offset (cache_server's SlabAllocator); the bytes
// are never touched from the host except through CopyIn/CopyOut.
// Copies are synchronous (cudaMemcpy on the calling thread, which is first bound to the region's device)
// and stage through the driver when the host memory is pageable; page-locked host memory (PinHostMemory)
// makes them DMA transfers.
// Thread-safety: all methods may be called concurrently (the CUDA runtime serialises them per device);
// copies to overlapping ranges are the caller's business.
class DeviceRegion {
 public:
  // Allocates `bytes` (> 0) on `device`. Errors: kKernelNoCuda, kKernelInvalidArgument (bytes == 0, bad
  // device, null out), cudaErrorMemoryAllocation (the device has less free memory).
  static KernelStatus Create(int device, uint64_t bytes, std::unique_ptr<DeviceRegion>* out);
  ~DeviceRegion();
  DeviceRegion(const DeviceRegion&) = delete;
  DeviceRegion& operator=(const DeviceRegion&) = delete;

  int device() const { return device_; }
  uint64_t size_bytes() const { return size_bytes_; }
  // The region's device address (for device-side consumers: kernels, NCCL). Never dereference on host.
  void* device_data() const { return data_; }

  // Copies `bytes` from host `src` to [offset, offset + bytes) of the region (host to device).
  // Errors: kKernelInvalidArgument (range past the region, null src with bytes > 0), a CUDA error code.
  KernelStatus CopyIn(uint64_t offset, const void* src, uint64_t bytes);
  // Copies [offset, offset + bytes) of the region to host `dst` (device to host). Errors: as CopyIn.
  KernelStatus CopyOut(uint64_t offset, void* dst, uint64_t bytes) const;
  // Copies `bytes` from `src_offset` to `dst_offset` inside the region (device to device); the ranges
  // must not overlap. Errors: kKernelInvalidArgument (range past the region, overlap), a CUDA error code.
  KernelStatus CopyWithin(uint64_t dst_offset, uint64_t src_offset, uint64_t bytes);

 private:
  DeviceRegion(int device, void* data, uint64_t size_bytes) : device_(device), data_(data), size_bytes_(size_bytes) {}
  int device_;
  void* data_;
  uint64_t size_bytes_;
};

// Page-locks `bytes` of existing host memory at `p` for DMA (cudaHostRegister; the host tier, when a
// device is usable), until UnpinHostMemory(p). The memory stays owned by the caller and must outlive
// the registration. Errors: kKernelNoCuda, kKernelInvalidArgument (null or empty), a CUDA error code
// (e.g. the OS refused to lock that much memory: see ulimit -l).
KernelStatus PinHostMemory(void* p, uint64_t bytes);
// Ends a PinHostMemory(p). Errors: kKernelNoCuda, a CUDA error code (p was not registered).
KernelStatus UnpinHostMemory(void* p);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_DEVICE_MEMORY_H_
