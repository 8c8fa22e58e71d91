// The memory behind the HBM tier: one region of device memory, addressed by offset, with copies to and
// from host memory. BlockStore carves slots from it (SlabAllocator without a host mapping) and never
// touches its bytes except through these copies.
#ifndef KVTIER_SERVER_DEVICE_TIER_MEMORY_H_
#define KVTIER_SERVER_DEVICE_TIER_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::server {

// Thread-safety: implementations allow concurrent calls; BlockStore calls them under its lock.
class DeviceTierMemory {
 public:
  virtual ~DeviceTierMemory() = default;
  // Bytes of the region (the HBM tier's budget).
  virtual uint64_t size_bytes() const = 0;
  // Host -> device: `src` to [offset, offset + src.size()). Errors: InvalidArgument (past the region),
  // Internal (the copy failed; the bytes there are undefined).
  virtual absl::Status CopyIn(uint64_t offset, std::span<const std::byte> src) = 0;
  // Device -> host: [offset, offset + dst.size()) to `dst`. Errors: as CopyIn.
  virtual absl::Status CopyOut(uint64_t offset, std::span<std::byte> dst) const = 0;
  // The device address of byte `offset` (for device-side consumers such as an NCCL transport), or
  // nullptr when the memory is not device memory.
  virtual void* DeviceAddress(uint64_t offset) const = 0;
  // For logs and `kvtierctl status`, e.g. "cuda:0 22.0 GiB".
  virtual std::string Describe() const = 0;
};

// The HBM tier on CUDA device `device`: memory_ratio (in (0, 1]) x the device's free memory at the
// call, at most max_bytes when max_bytes > 0, rounded down to 1 MiB. Needs a CUDA build and a usable
// device. Errors: FailedPrecondition (built without CUDA, or no usable device: the caller runs without
// an HBM tier), InvalidArgument (ratio out of range, no such device), ResourceExhausted (cudaMalloc
// failed or the result would be under 1 MiB).
absl::StatusOr<std::unique_ptr<DeviceTierMemory>> NewCudaDeviceTierMemory(int device, double memory_ratio,
                                                                          uint64_t max_bytes);

// Page-locks the host tier's region for DMA to and from the device (cudaHostRegister) when a CUDA device
// is usable, for as long as the returned object lives; the region must outlive it.
// Errors: FailedPrecondition (no usable device), Internal (the OS refused; e.g. RLIMIT_MEMLOCK).
class PinnedHostRegion;
absl::StatusOr<std::unique_ptr<PinnedHostRegion>> PinHostRegion(std::span<std::byte> region);
class PinnedHostRegion {
 public:
  virtual ~PinnedHostRegion() = default;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_DEVICE_TIER_MEMORY_H_
