// DeviceBlockSource: what the NCCL transport needs from a cache server's device (HBM) tier, and all it
// needs: resolve block keys to device pointers and lengths, pinned by a lease until the transfer that
// reads them has ended. The device tier implements it; tests implement it over host memory.
#ifndef KVTIER_NCCL_DEVICE_BLOCK_SOURCE_H_
#define KVTIER_NCCL_DEVICE_BLOCK_SOURCE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/namespace.h"
#include "kvtier/nccl/nccl_api.h"

namespace kvtier::nccl {

// Blocks resolved by DeviceBlockSource::Resolve, pinned until Release() (or destruction): the tier
// neither evicts, moves nor reuses them meanwhile. Move-only.
class DeviceBlockLease {
 public:
  DeviceBlockLease() = default;
  // `blocks[i]`: key i's block in device memory, or nullopt when the tier does not hold it.
  // `release` is called exactly once, by Release() or the destructor.
  DeviceBlockLease(std::vector<std::optional<DeviceSpan>> blocks, std::function<void()> release)
      : blocks_(std::move(blocks)), release_(std::move(release)) {}
  DeviceBlockLease(DeviceBlockLease&& other) noexcept
      : blocks_(std::move(other.blocks_)), release_(std::exchange(other.release_, nullptr)) {}
  DeviceBlockLease& operator=(DeviceBlockLease&& other) noexcept {
    if (this != &other) {
      Release();
      blocks_ = std::move(other.blocks_);
      release_ = std::exchange(other.release_, nullptr);
    }
    return *this;
  }
  ~DeviceBlockLease() { Release(); }

  std::span<const std::optional<DeviceSpan>> blocks() const { return blocks_; }
  // Ends the lease; the pointers must not be used afterwards. Idempotent.
  void Release() {
    if (release_) std::exchange(release_, nullptr)();
  }

 private:
  std::vector<std::optional<DeviceSpan>> blocks_;
  std::function<void()> release_;
};

// Thread-safety: Resolve may be called concurrently.
class DeviceBlockSource {
 public:
  virtual ~DeviceBlockSource() = default;
  // CUDA device ordinal that holds the tier's memory (the server's NCCL rank runs there).
  virtual int32_t device() const = 0;
  // Leases every present block of `keys` (in namespace `ns`) for at most `ttl`; absent blocks are
  // nullopt, never an error. A lease the caller neither releases nor destroys within `ttl` may be
  // expired by the tier, but only once no transfer can still read it (the NCCL service aborts the
  // communicator first). Errors: InvalidArgument (namespace), Unavailable (tier draining).
  virtual absl::StatusOr<DeviceBlockLease> Resolve(const Namespace& ns, std::span<const BlockKey> keys,
                                                   absl::Duration ttl) = 0;
};

}  // namespace kvtier::nccl

#endif  // KVTIER_NCCL_DEVICE_BLOCK_SOURCE_H_
