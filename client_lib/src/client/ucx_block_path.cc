#include "client/ucx_block_path.h"

#include <algorithm>
#include <string>
#include <vector>

#include "client/two_phase_put.h"
#include "kvtier/common/capability_id.h"
#include "kvtier/common/checksum.h"
#include "kvtier/wire/wire.h"

namespace kvtier::client {

namespace {

// Returns a lease now rather than at its expiry; best effort within the call's `deadline`: a lease not
// released expires by itself (its TTL), so a member that stopped answering must not hold the caller
// past its deadline here.
// `lease_id`: as the server sent it (empty: no lease).
void ReleaseLease(Member& member, const std::string& lease_id, absl::Time deadline) {
  if (lease_id.empty() || absl::Now() >= deadline) return;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::ReleaseRequest req;
  req.add_lease_ids(lease_id);
  v1::ReleaseResponse resp;
  (void)member.cache->Release(&ctx, req, &resp);
}

}  // namespace

BlockPathCapabilities UcxBlockPath::capabilities() const {
  std::lock_guard<std::mutex> lock(member_.ucx->mu);
  const bool current = member_.ucx->endpoint == endpoint_;
  return {.takes_leases = current && member_.ucx->takes_leases, .takes_puts = current && member_.ucx->takes_puts};
}

// Get of one owner's batch over UCX: a kLease message (an endpoint whose hello offered leases) or the unary Lease
// RPC takes the lease, then the server sends the present blocks straight into `buffers` and releases
// the lease.
// Returns false, with nothing done to `results`, when the member answered the lease only over gRPC (a
// kLease unanswered in time, its endpoint dropped): the caller may move these bytes over gRPC instead.
// A lease the member refused (IsRefusal) is recorded in `refusal`.
bool UcxBlockPath::Read(const ReadBatchRequest& batch, CallRefusal& refusal) {
  Member& member = member_;
  const UcxClient::EndpointId endpoint = endpoint_;
  const std::span<const BlockKey> keys = batch.keys;
  const std::span<const uint32_t> idx = batch.idx;
  const uint64_t block_bytes = batch.block_bytes;
  const std::span<const std::span<std::byte>> buffers = batch.buffers;
  const std::span<GetResult> results = batch.results;
  const absl::Time deadline = batch.deadline;
  v1::ReadRequest req;
  *req.mutable_namespace_() = *batch.pns;
  wire::EncodeKeys(keys, req.mutable_keys());
  v1::ReadResponse head;
  bool got = false;
  bool over_ucx = false;
  {
    std::lock_guard<std::mutex> lock(member.ucx->mu);
    over_ucx = member.ucx->takes_leases && member.ucx->endpoint == endpoint;
  }
  // A server that went away shows first on its gRPC connection (closed by its kernel), while a UCX
  // message to it is only answered by the deadline: lease over gRPC then, which fails at once.
  over_ucx = over_ucx && member.channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
  if (over_ucx) {  // the endpoint's session may lease: no gRPC round trip
    // A lease is answered in well under a millisecond; one not answered within a quarter of the call's
    // time (at least 100 ms) is taken as a dead server and asked of gRPC, which fails at once then. A
    // server that answers there was only slow (a loaded machine): its bytes come over gRPC this time.
    const absl::Time ucx_deadline =
        std::min(deadline, absl::Now() + std::max(absl::Milliseconds(100), options_.rpc_timeout / 4));
    auto answer = ucx_.client()->Lease(endpoint, req.SerializeAsString(), ucx_deadline);
    got = answer.ok() && head.ParseFromString(*answer) && static_cast<size_t>(head.blocks_size()) == idx.size();
    stats_.ucx_leases.fetch_add(got ? 1 : 0, std::memory_order_relaxed);
    if (!answer.ok() && IsRefusal(answer.status().code())) {
      stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      refusal.Record(member.Refused("Lease", answer.status()));
      return true;  // the endpoint is fine: the member answered
    }
    if (!got && !answer.ok() && answer.status().code() == absl::StatusCode::kDeadlineExceeded) {
      head.Clear();
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      const grpc::Status st = member.cache->Lease(&ctx, req, &head);
      got = st.ok() && static_cast<size_t>(head.blocks_size()) == idx.size();
      if (got) {  // a slow server, not a dead one: its UCX endpoint was dropped, so gRPC bytes this time
        ReleaseLease(member, head.lease_id(), deadline);
        ucx_.Failed(member, endpoint);
        return false;
      }
      if (IsRefusal(wire::FromGrpc(st).code())) refusal.Record(member.Refused("Lease", wire::FromGrpc(st)));
    }
  } else {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    const grpc::Status st = member.cache->Lease(&ctx, req, &head);
    got = st.ok() && static_cast<size_t>(head.blocks_size()) == idx.size();
    if (IsRefusal(wire::FromGrpc(st).code())) {
      stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      refusal.Record(member.Refused("Lease", wire::FromGrpc(st)));
      return true;  // the endpoint is fine: the member answered
    }
  }
  if (!got) {
    stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
    ReleaseLease(member, head.lease_id(), deadline);
    // The control plane is how a dead server shows (UCX endpoints run without peer failure handling):
    // reconnect after the backoff, so that a restarted server gets a fresh endpoint.
    ucx_.Failed(member, endpoint);
    return true;  // all kMissFromError
  }
  std::vector<uint32_t> indices;  // lease indices to fetch
  std::vector<std::span<std::byte>> bufs;
  std::vector<size_t> positions;  // k of each fetched block
  bool protocol_ok = true;
  for (size_t k = 0; k < idx.size(); ++k) {
    const v1::BlockStatus& st = head.blocks(static_cast<int>(k));
    if (!st.present()) {
      results[idx[k]] = GetResult::kMiss;
    } else if (st.size_bytes() != block_bytes) {
      protocol_ok = false;  // stays kMissFromError
    } else {
      indices.push_back(static_cast<uint32_t>(k));
      bufs.push_back(buffers[idx[k]]);
      positions.push_back(k);
    }
  }
  if (!protocol_ok) stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
  if (indices.empty()) {
    ReleaseLease(member, head.lease_id(), deadline);
    return true;
  }
  // Each block's checksum is verified as soon as it lands, while the next ones are still moving (from a
  // member on this node, on the get lane that received it: several j at once).
  std::vector<uint8_t> verified(indices.size(), 0);
  auto verify = [&](size_t j) {
    const size_t k = positions[j];
    const uint32_t i = idx[k];
    results[i] = BlockChecksum(buffers[i].data(), block_bytes) == head.blocks(static_cast<int>(k)).checksum()
                     ? GetResult::kHit
                     : GetResult::kChecksumMismatch;
    verified[j] = 1;
  };
  const UcxClient::TransferResult r = ucx_.client()->Get(endpoint, CapabilityId::FromWire(head.lease_id()),
                                                         /*release=*/true, indices, bufs, deadline, verify);
  uint64_t arrived = 0;
  for (size_t j = 0; j < indices.size(); ++j) {
    if (r.items[j] != UcxClient::ItemStatus::kOk) {
      results[idx[positions[j]]] = GetResult::kMissFromError;  // whatever a verify saw, it did not finish in time
      continue;
    }
    ++arrived;
    if (verified[j] == 0) verify(j);
  }
  stats_.ucx_get_blocks.fetch_add(arrived, std::memory_order_relaxed);
  if (r.on_lanes) stats_.ucx_lane_get_blocks.fetch_add(arrived, std::memory_order_relaxed);
  if (r.endpoint_failed) {
    stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
    ucx_.Failed(member, endpoint);
    ReleaseLease(member, head.lease_id(), deadline);  // the server may never have seen the request
  }
  return true;
}

std::optional<absl::Status> UcxBlockPath::Put(const PutBatchRequest& batch) {
  return TwoPhasePut(
      PutPath{.member = &member_, .options = &options_, .stats = &stats_, .ucx = &ucx_, .endpoint = endpoint_}, batch);
}

}  // namespace kvtier::client
