// HostBlockSource: what the UCX block server (UcxServer) needs from a cache server's host tier, and all
// it needs: the host memory to register, slots pinned for one send or one receive, the control calls
// (lease, allocate, commit) as an endpoint's principal, and where to count what it did. The twin of
// transport/nccl's DeviceBlockSource. The cache server implements it over its BlockStore
// (cache_server/src/transport/store_block_source.h); tests may implement it over plain memory.
#ifndef KVTIER_UCX_HOST_BLOCK_SOURCE_H_
#define KVTIER_UCX_HOST_BLOCK_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/common/capability_id.h"
#include "kvtier/common/principal.h"
#include "kvtier/v1/cache.pb.h"

namespace kvtier::ucx {

// One block slot pinned for one transfer: `size_bytes` at `data`, valid until the matching unpin.
struct PinnedHostBlock {
  std::byte* data = nullptr;
  uint64_t size_bytes = 0;
  // Time left, at the pin, before the lease or reservation expires: the server cancels or force-closes
  // a transfer still holding the pin then.
  absl::Duration expires_in = absl::InfiniteDuration();
};

enum class TransferDirection : uint8_t { kRead, kWrite };  // read: server -> client

// Ids and principals: `who` is the endpoint's principal (its ticket's, or an admin on a server without
// tickets). A lease or reservation id of another tenant than a worker `who`'s must be answered exactly
// as an unknown one (an error from a pin, nothing released), so that no answer tells whether an id is
// live.
// Thread-safety: the pins, unpins, Release and the counters are called on the server's progress thread;
// Lease, Allocate and Commit on its call threads, concurrently with each other and with the rest.
class HostBlockSource {
 public:
  virtual ~HostBlockSource() = default;

  // The host memory that pinned slots lie in, registered once with UCX (ucp_mem_map) for the server's
  // life; empty: none (every transfer is registered by UCX itself).
  virtual std::span<std::byte> HostRegion() const = 0;

  // Pins block `index` of lease `lease_id` for one send; its bytes stay valid and unchanged until
  // UnpinSend. Errors: any (unknown, expired or another tenant's lease; index not held): the server then
  // sends an empty message in its place.
  virtual absl::StatusOr<PinnedHostBlock> PinForSend(const Principal& who, const CapabilityId& lease_id,
                                                     uint32_t index) = 0;
  // Ends one successful PinForSend.
  virtual void UnpinSend(const CapabilityId& lease_id, uint32_t index) = 0;
  // Pins the slot of block `index` of reservation `reservation_id` for one receive of the whole block.
  // Errors: any (unknown, expired or another tenant's reservation; the block already being received or
  // written; index not allocated).
  virtual absl::StatusOr<PinnedHostBlock> PinForReceive(const Principal& who, const CapabilityId& reservation_id,
                                                        uint32_t index) = 0;
  // Ends one successful PinForReceive: `bytes` arrived, `ok` when the receive completed with the whole
  // block; `checksum`: the XXH3-64 of the slot, computed as the bytes landed (absent: not computed).
  virtual void FinishReceive(const CapabilityId& reservation_id, uint32_t index, uint64_t bytes, bool ok,
                             std::optional<uint64_t> checksum) = 0;
  // Whether the put tags of `reservation_id` (its tag_prefix()) are free of every other live
  // reservation: only then may the server drain a sender's message for a block it cannot pin.
  virtual bool PutTagFreeFor(const CapabilityId& reservation_id) const = 0;
  // Releases lease `lease_id` as `who` (another tenant's: nothing happens).
  virtual void Release(const Principal& who, const CapabilityId& lease_id) = 0;

  // The control calls of the UCX plane (kLease, kAllocate, kCommit), as `who`: what the Lease, Allocate
  // and Commit RPCs do for that principal. Errors: the RPC's own (e.g. PERMISSION_DENIED for a
  // namespace of another tenant), sent back to the client with their code.
  virtual absl::StatusOr<v1::ReadResponse> Lease(const Principal& who, const v1::ReadRequest& request) = 0;
  virtual absl::StatusOr<v1::AllocateResponse> Allocate(const Principal& who, const v1::AllocateRequest& request) = 0;
  virtual absl::StatusOr<v1::CommitResponse> Commit(const Principal& who, const v1::CommitRequest& request) = 0;

  // What the server counts (the cache server's metrics): payload bytes moved, transfers that failed,
  // endpoints refused for want of a valid ticket, and the listener's pending connections
  // (PendingConnectionReaper) and those it reset.
  virtual void CountTransfer(TransferDirection direction, uint64_t bytes) = 0;
  virtual void CountTransferError(TransferDirection direction) = 0;
  virtual void CountAuthRejection() = 0;
  virtual void SetPendingConnections(uint64_t pending) = 0;
  virtual void CountPendingConnectionResets(uint64_t timed_out, uint64_t over_limit) = 0;
};

}  // namespace kvtier::ucx

#endif  // KVTIER_UCX_HOST_BLOCK_SOURCE_H_
