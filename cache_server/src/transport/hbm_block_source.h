// HbmBlockSource: the cache server's HBM tier as the NCCL transport's DeviceBlockSource.
#ifndef KVTIER_SERVER_TRANSPORT_HBM_BLOCK_SOURCE_H_
#define KVTIER_SERVER_TRANSPORT_HBM_BLOCK_SOURCE_H_

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/nccl/device_block_source.h"
#include "kvtier/server/block_store.h"

namespace kvtier::server {

// Resolves keys through BlockStore::AcquireHbmRead (blocks in host memory or on disk move up to HBM
// first) and releases the store's lease when the transport's lease ends. `store` is borrowed and must
// have an HBM tier on CUDA device `device`. Thread-safety: Resolve may be called concurrently.
class HbmBlockSource final : public nccl::DeviceBlockSource {
 public:
  HbmBlockSource(BlockStore& store, int32_t device) : store_(store), device_(device) {}
  int32_t device() const override { return device_; }
  // Errors: InvalidArgument (invalid namespace, or its shard size is 0), FailedPrecondition (no HBM tier).
  absl::StatusOr<nccl::DeviceBlockLease> Resolve(const Namespace& ns, std::span<const BlockKey> keys,
                                                 absl::Duration ttl) override;

 private:
  BlockStore& store_;
  int32_t device_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_TRANSPORT_HBM_BLOCK_SOURCE_H_
