#include "transport/hbm_block_source.h"

#include <optional>
#include <utility>
#include <vector>

namespace kvtier::server {

absl::StatusOr<nccl::DeviceBlockLease> HbmBlockSource::Resolve(const Namespace& ns, std::span<const BlockKey> keys,
                                                               absl::Duration ttl) {
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  const uint64_t block_bytes = ns.layout.ShardBytes();
  if (block_bytes == 0) return absl::InvalidArgumentError("namespace layout: a shard of 0 bytes");
  const NamespaceRef ref{.id = ns.Id(), .tenant_id = TenantId(ns.tenant), .block_bytes = block_bytes};
  absl::StatusOr<BlockStore::HbmLease> lease = store_.AcquireHbmRead(ref, keys, ttl);
  if (!lease.ok()) return lease.status();
  std::vector<std::optional<nccl::DeviceSpan>> blocks(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (const auto& b = lease->blocks[i]; b.has_value()) {
      blocks[i] = nccl::DeviceSpan{.ptr = b->device_data, .size_bytes = b->size_bytes};
    }
  }
  const CapabilityId lease_id = lease->lease_id;
  BlockStore* store = &store_;
  return nccl::DeviceBlockLease(std::move(blocks), [store, lease_id] {
    if (!lease_id.null()) store->Release(std::span<const CapabilityId>(&lease_id, 1));
  });
}

}  // namespace kvtier::server
