#include "client/data_path.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "kvtier/common/capability_id.h"
#include "kvtier/common/checksum.h"
#include "kvtier/wire/wire.h"

namespace kvtier::client {

// Returns a lease now rather than at its expiry; best effort within the call's `deadline`: a lease not
// released expires by itself (its TTL), so a member that stopped answering must not hold the caller
// past its deadline here.
// `lease_id`: as the server sent it (empty: no lease).
void DataPath::ReleaseLease(Member& member, const std::string& lease_id, absl::Time deadline) {
  if (lease_id.empty() || absl::Now() >= deadline) return;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::ReleaseRequest req;
  req.add_lease_ids(lease_id);
  v1::ReleaseResponse resp;
  (void)member.cache->Release(&ctx, req, &resp);
}

// Get of one owner's batch over UCX: a kLease message (an endpoint whose hello offered leases) or the unary Lease
// RPC takes the lease, then the server sends the present blocks straight into `buffers` and releases
// the lease.
// Returns false, with nothing done to `results`, when the member answered the lease only over gRPC (a
// kLease unanswered in time, its endpoint dropped): the caller may move these bytes over gRPC instead.
// A lease the member refused (IsRefusal) is recorded in `refusal`.
bool DataPath::GetOverUcx(Member& member, UcxClient::EndpointId endpoint, const v1::Namespace& pns,
                          std::span<const BlockKey> keys, std::span<const uint32_t> idx, uint64_t block_bytes,
                          std::span<const std::span<std::byte>> buffers, std::span<GetResult> results,
                          absl::Time deadline, CallRefusal& refusal) {
  v1::ReadRequest req;
  *req.mutable_namespace_() = pns;
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

// Reads `keys` (block idx[k] of the call) from `member` into buffers[idx[k]] and sets results[idx[k]]
// (left kMissFromError when the owner fails or misses `deadline`). A refusal of the request
// (IsRefusal) is recorded in `refusal`.
void DataPath::ReadBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                         std::span<const uint32_t> idx, uint64_t block_bytes,
                         std::span<const std::span<std::byte>> buffers, std::span<GetResult> results,
                         absl::Time deadline, CallRefusal& refusal) {
  v1::ReadRequest req;
  *req.mutable_namespace_() = pns;
  if (mode_ != TransportMode::kGrpc) {
    if (auto endpoint = ucx_.Endpoint(member, deadline);
        endpoint.has_value() &&
        GetOverUcx(member, *endpoint, pns, keys, idx, block_bytes, buffers, results, deadline, refusal)) {
      return;
    }
    if (mode_ == TransportMode::kUcx) {  // no fallback: these blocks are misses from error
      stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  wire::EncodeKeys(keys, req.mutable_keys());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  auto reader = member.cache->Read(&ctx, req);
  v1::ReadResponse msg;
  std::vector<uint64_t> received(idx.size(), 0);
  std::vector<v1::BlockStatus> status;
  bool protocol_ok = true;
  const bool have_head = reader->Read(&msg);  // false: the stream ended, with an error (Finish says which)
  if (have_head && static_cast<size_t>(msg.blocks_size()) == idx.size()) {
    status.assign(msg.blocks().begin(), msg.blocks().end());
    while (reader->Read(&msg)) {
      const uint32_t k = msg.index();
      if (k >= idx.size() || !status[k].present() || msg.offset() != received[k] ||
          msg.data().size() > block_bytes - received[k]) {
        protocol_ok = false;  // keep draining; these blocks stay errors
        continue;
      }
      std::memcpy(buffers[idx[k]].data() + received[k], msg.data().data(), msg.data().size());
      received[k] += msg.data().size();
    }
  } else {
    protocol_ok = false;
    if (have_head) ctx.TryCancel();  // don't wait for the rest of a stream we cannot use
  }
  const grpc::Status st = reader->Finish();
  if (!st.ok() || !protocol_ok) stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
  if (const absl::Status s = wire::FromGrpc(st); IsRefusal(s.code())) refusal.Record(member.Refused("Read", s));
  for (size_t k = 0; k < idx.size(); ++k) {
    const uint32_t i = idx[k];
    if (k < status.size() && !status[k].present()) {
      results[i] = GetResult::kMiss;
    } else if (k < status.size() && received[k] == block_bytes && status[k].size_bytes() == block_bytes) {
      if (BlockChecksum(buffers[i].data(), block_bytes) == status[k].checksum()) {
        results[i] = GetResult::kHit;
      } else {
        results[i] = GetResult::kChecksumMismatch;
      }
    } else {
      results[i] = GetResult::kMissFromError;
    }
  }
}

// Two-phase put of one batch to `member`: keys[k] from blocks[k] (each block_bytes long, borrowed for
// the call) at prefix depth depths[k]. Sets results[k]; they stay kError when the owner fails.
// Returns OK, or the member's refusal of the request (IsRefusal; results then say nothing).
absl::Status DataPath::PutBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                                std::span<const uint32_t> depths, std::span<const std::span<const std::byte>> blocks,
                                uint64_t block_bytes, std::span<PutResult> results,
                                std::span<const BlockMeta* const> block_meta) {
  v1::CacheService::Stub& stub = *member.cache;
  std::optional<UcxClient::EndpointId> ucx_endpoint;
  if (mode_ != TransportMode::kGrpc) {
    ucx_endpoint = ucx_.Endpoint(member, absl::Now() + options_.rpc_timeout);
    if (!ucx_endpoint.has_value() && mode_ == TransportMode::kUcx) {
      stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();  // no fallback: all kError
    }
  }
  // Reserve and commit over the endpoint too when its session takes them (no gRPC round trip), as a
  // get takes its lease (GetOverUcx); gRPC is the fallback.
  bool control_over_ucx = false;
  if (ucx_endpoint.has_value()) {
    std::lock_guard<std::mutex> lock(member.ucx->mu);
    control_over_ucx = member.ucx->takes_puts && member.ucx->endpoint == *ucx_endpoint;
  }
  control_over_ucx = control_over_ucx && member.channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
  // Phase 1: reserve.
  v1::AllocateRequest areq;
  *areq.mutable_namespace_() = pns;
  wire::EncodeKeys(keys, areq.mutable_keys());
  areq.mutable_depths()->Add(depths.begin(), depths.end());
  for (const BlockMeta* m : block_meta) wire::ToProto(*m, areq.add_block_meta());
  v1::AllocateResponse aresp;
  bool reserved = false;
  if (control_over_ucx) {
    // The call's whole deadline, as the Allocate RPC gets: reserving may evict (and spill) first. A
    // reservation the server made for an answer that came too late holds the keys until its
    // reservation_ttl, so a late answer is not retried over gRPC (it would find them in progress):
    // this batch's blocks are errors. An endpoint that failed before answering is retried over gRPC.
    auto answer = ucx_.client()->Allocate(*ucx_endpoint, areq.SerializeAsString(), absl::Now() + options_.rpc_timeout);
    if (!answer.ok() && IsRefusal(answer.status().code())) {
      stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      return member.Refused("Allocate", answer.status());  // it answered: the endpoint is fine
    }
    reserved =
        answer.ok() && aresp.ParseFromString(*answer) && static_cast<size_t>(aresp.results_size()) == keys.size();
    stats_.ucx_allocates.fetch_add(reserved ? 1 : 0, std::memory_order_relaxed);
    if (!reserved) {
      aresp.Clear();
      ucx_.Failed(member, *ucx_endpoint);
      ucx_endpoint.reset();  // this batch's bytes go over gRPC
      control_over_ucx = false;
      if (mode_ == TransportMode::kUcx || answer.status().code() == absl::StatusCode::kDeadlineExceeded) {
        stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();  // all kError
      }
    }
  }
  if (!reserved) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    const absl::Status st = wire::FromGrpc(stub.Allocate(&ctx, areq, &aresp));
    if (!st.ok() || static_cast<size_t>(aresp.results_size()) != keys.size()) {
      stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      if (IsRefusal(st.code())) return member.Refused("Allocate", st);   // it answered: the endpoint is fine
      if (ucx_endpoint.has_value()) ucx_.Failed(member, *ucx_endpoint);  // see GetOverUcx
      return absl::OkStatus();                                           // all kError
    }
  }
  std::vector<uint32_t> allocated;  // positions k within keys
  for (size_t k = 0; k < keys.size(); ++k) {
    switch (aresp.results(static_cast<int>(k))) {
      case v1::ALLOCATE_RESULT_ALLOCATED:
        allocated.push_back(static_cast<uint32_t>(k));
        break;
      case v1::ALLOCATE_RESULT_ALREADY_PRESENT:
        results[k] = PutResult::kAlreadyPresent;
        break;
      case v1::ALLOCATE_RESULT_IN_PROGRESS:
        results[k] = PutResult::kInProgress;
        break;
      case v1::ALLOCATE_RESULT_NO_SPACE:
        results[k] = PutResult::kNoSpace;
        break;
      default:
        results[k] = PutResult::kError;
        break;
    }
  }
  if (allocated.empty()) return absl::OkStatus();
  // Phase 1b: the bytes into the reserved slots: over UCX straight into them, or streamed over gRPC.
  auto ComputeChecksums = [&] {
    std::vector<uint64_t> sums(keys.size(), 0);
    for (uint32_t k : allocated) sums[k] = BlockChecksum(blocks[k].data(), block_bytes);
    return sums;
  };
  std::vector<uint64_t> checksums;
  bool ok = true;
  absl::Status refused;  // a refusal of WriteBlocks or Commit (IsRefusal)
  if (ucx_endpoint.has_value()) {
    std::vector<uint32_t> indices(allocated.begin(), allocated.end());
    std::vector<std::span<const std::byte>> data;
    for (uint32_t k : allocated) data.push_back(blocks[k]);
    // The commit's checksums are computed while the bytes move.
    const UcxClient::TransferResult r =
        ucx_.client()->Put(*ucx_endpoint, CapabilityId::FromWire(aresp.reservation_id()), indices, data,
                           absl::Now() + options_.rpc_timeout, [&] { checksums = ComputeChecksums(); });
    uint64_t taken = 0;
    for (auto item : r.items) taken += item == UcxClient::ItemStatus::kOk;
    stats_.ucx_put_blocks.fetch_add(taken, std::memory_order_relaxed);
    if (r.endpoint_failed) {
      ucx_.Failed(member, *ucx_endpoint);
      ok = false;  // abort below; blocks the server did not take come back INCOMPLETE otherwise
    }
  } else {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::WriteBlocksResponse wresp;
    auto writer = stub.WriteBlocks(&ctx, &wresp);
    v1::WriteBlocksRequest chunk;
    chunk.set_reservation_id(aresp.reservation_id());
    for (uint32_t k : allocated) {
      const std::span<const std::byte> b = blocks[k];
      for (uint64_t off = 0; ok && off < b.size(); off += options_.stream_chunk_bytes) {
        const uint64_t n = std::min<uint64_t>(options_.stream_chunk_bytes, b.size() - off);
        chunk.set_index(k);
        chunk.set_offset(off);
        chunk.set_data(reinterpret_cast<const char*>(b.data() + off), n);
        ok = writer->Write(chunk);
      }
      if (!ok) break;
    }
    writer->WritesDone();
    const absl::Status st = wire::FromGrpc(writer->Finish());
    if (IsRefusal(st.code())) refused = member.Refused("WriteBlocks", st);
    ok = st.ok() && ok;
  }
  // Phase 2: commit with checksums (entries for keys not allocated are ignored by the server).
  v1::CommitRequest creq;
  creq.set_reservation_id(aresp.reservation_id());
  if (checksums.empty()) checksums = ComputeChecksums();
  creq.mutable_checksums()->Add(checksums.begin(), checksums.end());
  v1::CommitResponse cresp;
  bool committed = false;
  if (ok && control_over_ucx && ucx_endpoint.has_value()) {
    auto answer = ucx_.client()->Commit(*ucx_endpoint, creq.SerializeAsString(), absl::Now() + options_.rpc_timeout);
    if (!answer.ok() && IsRefusal(answer.status().code())) {
      refused = member.Refused("Commit", answer.status());
      ok = false;
    } else if (answer.ok()) {
      committed = cresp.ParseFromString(*answer) && static_cast<size_t>(cresp.results_size()) == keys.size();
      ok = committed;
    } else {
      // No answer: the endpoint is dropped and gRPC asked. A commit that did happen meanwhile makes
      // this one fail (an unknown reservation): its blocks then count as errors, though stored.
      ucx_.Failed(member, *ucx_endpoint);
      cresp.Clear();
    }
    stats_.ucx_commits.fetch_add(committed ? 1 : 0, std::memory_order_relaxed);
  }
  if (ok && !committed) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    const absl::Status st = wire::FromGrpc(stub.Commit(&ctx, creq, &cresp));
    if (IsRefusal(st.code())) refused = member.Refused("Commit", st);
    ok = st.ok() && static_cast<size_t>(cresp.results_size()) == keys.size();
  }
  if (!ok) {
    stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
    // Best effort: return the slots now rather than at reservation expiry.
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::AbortRequest abreq;
    abreq.set_reservation_id(aresp.reservation_id());
    v1::AbortResponse abresp;
    (void)stub.Abort(&ctx, abreq, &abresp);
    return refused;  // the allocated blocks stay kError
  }
  uint64_t mismatched = 0;
  for (uint32_t k : allocated) {
    const auto r = cresp.results(static_cast<int>(k));
    results[k] = r == v1::COMMIT_RESULT_COMMITTED ? PutResult::kStored : PutResult::kError;
    mismatched += r == v1::COMMIT_RESULT_CHECKSUM_MISMATCH;
  }
  // The server saw other bytes than we sent: count it like a corrupt read.
  stats_.checksum_failures.fetch_add(mismatched, std::memory_order_relaxed);
  return absl::OkStatus();
}

void DataPath::SetDeadline(grpc::ClientContext& ctx) const {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
}

}  // namespace kvtier::client
