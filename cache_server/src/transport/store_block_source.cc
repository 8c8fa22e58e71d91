#include "transport/store_block_source.h"

#include "cache_service.h"
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

// Runs a CacheServiceImpl call (LeaseAs, AllocateAs, CommitAs) and returns its response or its error.
template <typename Resp, typename Fn>
absl::StatusOr<Resp> Answer(Fn&& fn) {
  Resp resp;
  if (absl::Status s = fn(&resp); !s.ok()) return s;
  return resp;
}

}  // namespace

absl::StatusOr<ucx::PinnedHostBlock> StoreBlockSource::PinForSend(const Principal& who, const CapabilityId& lease_id,
                                                                  uint32_t index) {
  return FromPinned(store_.PinForSend(lease_id, index, HolderOf(who)));
}

absl::StatusOr<ucx::PinnedHostBlock> StoreBlockSource::PinForReceive(const Principal& who,
                                                                     const CapabilityId& reservation_id,
                                                                     uint32_t index) {
  return FromPinned(store_.PinForReceive(reservation_id, index, HolderOf(who)));
}

void StoreBlockSource::Release(const Principal& who, const CapabilityId& lease_id) {
  store_.Release(std::span<const CapabilityId>(&lease_id, 1), HolderOf(who));
}

absl::StatusOr<v1::ReadResponse> StoreBlockSource::Lease(const Principal& who, const v1::ReadRequest& request) {
  return Answer<v1::ReadResponse>([&](v1::ReadResponse* resp) { return cache_.LeaseAs(who, request, resp); });
}

absl::StatusOr<v1::AllocateResponse> StoreBlockSource::Allocate(const Principal& who,
                                                                const v1::AllocateRequest& request) {
  return Answer<v1::AllocateResponse>(
      [&](v1::AllocateResponse* resp) { return cache_.AllocateAs(who, request, resp); });
}

absl::StatusOr<v1::CommitResponse> StoreBlockSource::Commit(const Principal& who, const v1::CommitRequest& request) {
  return Answer<v1::CommitResponse>([&](v1::CommitResponse* resp) { return cache_.CommitAs(who, request, resp); });
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
