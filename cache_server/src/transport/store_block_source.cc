#include "transport/store_block_source.h"

#include "block_requests.h"
#include "rpc_scope.h"
#include "server_metrics.h"

namespace kvtier::server {
namespace {

ServerMetrics::Direction DirectionOf(ucx::TransferDirection d) {
  return d == ucx::TransferDirection::kRead ? ServerMetrics::Direction::kRead : ServerMetrics::Direction::kWrite;
}

absl::StatusOr<ucx::PinnedHostBlock> FromPinned(absl::StatusOr<BlockStore::PinnedBlock> pinned) {
  if (!pinned.ok()) return pinned.status();
  return ucx::PinnedHostBlock{.data = pinned->data, .size_bytes = pinned->size_bytes, .expires_in = pinned->expires_in};
}

// Runs a BlockRequests call timed as RPC `method` and returns its response or its error.
template <typename Resp, typename Fn>
absl::StatusOr<Resp> Answer(ServerMetrics& metrics, const char* method, Fn&& fn) {
  RpcScope rpc(metrics, method);
  Resp resp;
  if (absl::Status s = rpc.Return(fn(&resp)); !s.ok()) return s;
  return resp;
}

}  // namespace

absl::StatusOr<ucx::PinnedHostBlock> StoreBlockSource::PinForSend(const Principal& who, const CapabilityId& lease_id,
                                                                  uint32_t index) {
  return FromPinned(store_.PinForSend(lease_id, index, BlockRequests::HolderOf(who)));
}

absl::StatusOr<ucx::PinnedHostBlock> StoreBlockSource::PinForReceive(const Principal& who,
                                                                     const CapabilityId& reservation_id,
                                                                     uint32_t index) {
  return FromPinned(store_.PinForReceive(reservation_id, index, BlockRequests::HolderOf(who)));
}

void StoreBlockSource::Release(const Principal& who, const CapabilityId& lease_id) {
  requests_.Release(who, std::span<const CapabilityId>(&lease_id, 1));
}

absl::StatusOr<v1::ReadResponse> StoreBlockSource::Lease(const Principal& who, const v1::ReadRequest& request) {
  return Answer<v1::ReadResponse>(metrics_, "Lease",
                                  [&](v1::ReadResponse* resp) { return requests_.Lease(who, request, resp); });
}

absl::StatusOr<v1::AllocateResponse> StoreBlockSource::Allocate(const Principal& who,
                                                                const v1::AllocateRequest& request) {
  // A UCX caller cannot be seen to give up mid-call: its reservation ends with reservation_ttl.
  return Answer<v1::AllocateResponse>(metrics_, "Allocate", [&](v1::AllocateResponse* resp) {
    return requests_.Allocate(
        who, request, [] { return false; }, resp);
  });
}

absl::StatusOr<v1::CommitResponse> StoreBlockSource::Commit(const Principal& who, const v1::CommitRequest& request) {
  return Answer<v1::CommitResponse>(metrics_, "Commit",
                                    [&](v1::CommitResponse* resp) { return requests_.Commit(who, request, resp); });
}

void StoreBlockSource::CountTransfer(ucx::TransferDirection direction, uint64_t bytes) {
  metrics_.CountTransfer(DirectionOf(direction), ServerMetrics::Transport::kUcx, bytes);
}

void StoreBlockSource::CountTransferError(ucx::TransferDirection direction) {
  metrics_.CountTransferError(DirectionOf(direction));
}

void StoreBlockSource::CountAuthRejection() { metrics_.CountAuthRejection(); }

void StoreBlockSource::SetPendingConnections(uint64_t pending) { metrics_.SetPendingConnections(pending); }

void StoreBlockSource::CountPendingConnectionResets(uint64_t timed_out, uint64_t over_limit) {
  metrics_.CountPendingConnectionResets(timed_out, over_limit);
}

}  // namespace kvtier::server
