// StoreBlockSource: the cache server's host tier as the UCX transport's HostBlockSource.
#ifndef KVTIER_SERVER_SRC_TRANSPORT_STORE_BLOCK_SOURCE_H_
#define KVTIER_SERVER_SRC_TRANSPORT_STORE_BLOCK_SOURCE_H_

#include <cstdint>
#include <optional>
#include <span>

#include "kvtier/server/block_store.h"
#include "kvtier/ucx/host_block_source.h"

namespace kvtier::server {

class BlockRequests;
class ServerMetrics;

// Pins and unpins through BlockStore (a worker principal holds only its tenant's ids: IdHolder), answers
// the control calls through BlockRequests (the rules the gRPC service applies too, as the endpoint's
// principal), each timed by an RpcScope as the RPC of the same name, and counts into ServerMetrics
// (transport="ucx"). All three are borrowed and must outlive it. Thread-safety: as HostBlockSource.
class StoreBlockSource final : public ucx::HostBlockSource {
 public:
  StoreBlockSource(BlockStore& store, ServerMetrics& metrics, BlockRequests& requests)
      : store_(store), metrics_(metrics), requests_(requests) {}

  std::span<std::byte> HostRegion() const override { return store_.HostRegion(); }
  absl::StatusOr<ucx::PinnedHostBlock> PinForSend(const Principal& who, const CapabilityId& lease_id,
                                                  uint32_t index) override;
  void UnpinSend(const CapabilityId& lease_id, uint32_t index) override { store_.Unpin(lease_id, index); }
  absl::StatusOr<ucx::PinnedHostBlock> PinForReceive(const Principal& who, const CapabilityId& reservation_id,
                                                     uint32_t index) override;
  void FinishReceive(const CapabilityId& reservation_id, uint32_t index, uint64_t bytes, bool ok,
                     std::optional<uint64_t> checksum) override {
    store_.FinishReceive(reservation_id, index, bytes, ok, checksum);
  }
  bool PutTagFreeFor(const CapabilityId& reservation_id) const override { return store_.PutTagFreeFor(reservation_id); }
  void Release(const Principal& who, const CapabilityId& lease_id) override;

  absl::StatusOr<v1::ReadResponse> Lease(const Principal& who, const v1::ReadRequest& request) override;
  absl::StatusOr<v1::AllocateResponse> Allocate(const Principal& who, const v1::AllocateRequest& request) override;
  absl::StatusOr<v1::CommitResponse> Commit(const Principal& who, const v1::CommitRequest& request) override;

  void CountTransfer(ucx::TransferDirection direction, uint64_t bytes) override;
  void CountTransferError(ucx::TransferDirection direction) override;
  void CountAuthRejection() override;
  void SetPendingConnections(uint64_t pending) override;
  void CountPendingConnectionResets(uint64_t timed_out, uint64_t over_limit) override;

 private:
  BlockStore& store_;
  ServerMetrics& metrics_;
  BlockRequests& requests_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_TRANSPORT_STORE_BLOCK_SOURCE_H_
