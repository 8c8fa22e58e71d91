#include "client/two_phase_put.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "kvtier/common/capability_id.h"
#include "kvtier/common/checksum.h"
#include "kvtier/wire/wire.h"

namespace kvtier::client {

std::optional<absl::Status> TwoPhasePut(const PutPath& p, const PutBatchRequest& batch) {
  std::optional<UcxClient::EndpointId> ucx_endpoint = p.endpoint;
  Member& member = *p.member;
  const ClientOptions& options = *p.options;
  ClientStats& stats = *p.stats;
  const std::span<const BlockKey> keys = batch.keys;
  const std::span<const uint32_t> depths = batch.depths;
  const std::span<const std::span<const std::byte>> blocks = batch.blocks;
  const uint64_t block_bytes = batch.block_bytes;
  const std::span<PutResult> results = batch.results;
  const std::span<const BlockMeta* const> block_meta = batch.block_meta;
  v1::CacheService::Stub& stub = *member.cache;
  auto SetDeadline = [&](grpc::ClientContext& ctx) {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  };
  // Reserve and commit over the endpoint too when its session takes them (no gRPC round trip), as a
  // get takes its lease (GetOverUcx); gRPC is the fallback.
  bool control_over_ucx = false;
  bool commit_on_put = false;  // the commit rides on the batch's last message (PutAndCommit)
  if (ucx_endpoint.has_value()) {
    std::lock_guard<std::mutex> lock(member.ucx->mu);
    control_over_ucx = member.ucx->takes_puts && member.ucx->endpoint == *ucx_endpoint;
    commit_on_put = control_over_ucx && member.ucx->commits_puts;
  }
  control_over_ucx = control_over_ucx && member.channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
  // Phase 1: reserve.
  v1::AllocateRequest areq;
  *areq.mutable_namespace_() = *batch.pns;
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
    auto answer = p.ucx->client()->Allocate(*ucx_endpoint, areq.SerializeAsString(), absl::Now() + options.rpc_timeout);
    if (!answer.ok() && IsRefusal(answer.status().code())) {
      stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      return member.Refused("Allocate", answer.status());  // it answered: the endpoint is fine
    }
    reserved =
        answer.ok() && aresp.ParseFromString(*answer) && static_cast<size_t>(aresp.results_size()) == keys.size();
    stats.ucx_allocates.fetch_add(reserved ? 1 : 0, std::memory_order_relaxed);
    if (!reserved) {
      aresp.Clear();
      p.ucx->Failed(member, *ucx_endpoint);
      if (answer.status().code() == absl::StatusCode::kDeadlineExceeded) {
        stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();  // all kError
      }
      return std::nullopt;  // this batch's bytes go over gRPC: the caller's fallback path, from the start
    }
  }
  if (!reserved) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    const absl::Status st = wire::FromGrpc(stub.Allocate(&ctx, areq, &aresp));
    if (!st.ok() || static_cast<size_t>(aresp.results_size()) != keys.size()) {
      stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      if (IsRefusal(st.code())) return member.Refused("Allocate", st);     // it answered: the endpoint is fine
      if (ucx_endpoint.has_value()) p.ucx->Failed(member, *ucx_endpoint);  // see GetOverUcx
      return absl::OkStatus();                                             // all kError
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
  v1::CommitRequest creq;
  creq.set_reservation_id(aresp.reservation_id());
  // The commit's answer over the endpoint (kCommit, or the one kPutCommit's reply); nullopt: none asked.
  std::optional<absl::StatusOr<std::string>> ucx_commit;
  if (ucx_endpoint.has_value() && commit_on_put && control_over_ucx) {
    std::vector<uint32_t> indices(allocated.begin(), allocated.end());
    std::vector<std::span<const std::byte>> data;
    for (uint32_t k : allocated) data.push_back(blocks[k]);
    // The checksums are computed while the bytes move and go right behind the last send; the server
    // commits when every block landed and answers once: no kPutDone, no second round trip.
    UcxClient::PutCommitResult r =
        p.ucx->client()->PutAndCommit(*ucx_endpoint, CapabilityId::FromWire(aresp.reservation_id()), indices, data,
                                      absl::Now() + options.rpc_timeout, [&] {
                                        checksums = ComputeChecksums();
                                        creq.mutable_checksums()->Add(checksums.begin(), checksums.end());
                                        return creq.SerializeAsString();
                                      });
    uint64_t sent = 0;
    for (auto item : r.transfer.items) sent += item == UcxClient::ItemStatus::kOk;
    stats.ucx_put_blocks.fetch_add(sent, std::memory_order_relaxed);
    if (r.transfer.endpoint_failed) {
      // No answer in time, or a send failed: the endpoint is dropped and the reservation aborted below
      // (a commit that did happen meanwhile leaves its blocks stored, though they count as errors).
      p.ucx->Failed(member, *ucx_endpoint);
      ok = false;
    } else {
      ucx_commit = std::move(r.commit);
    }
  } else if (ucx_endpoint.has_value()) {
    std::vector<uint32_t> indices(allocated.begin(), allocated.end());
    std::vector<std::span<const std::byte>> data;
    for (uint32_t k : allocated) data.push_back(blocks[k]);
    // The commit's checksums are computed while the bytes move.
    const UcxClient::TransferResult r =
        p.ucx->client()->Put(*ucx_endpoint, CapabilityId::FromWire(aresp.reservation_id()), indices, data,
                             absl::Now() + options.rpc_timeout, [&] { checksums = ComputeChecksums(); });
    uint64_t taken = 0;
    for (auto item : r.items) taken += item == UcxClient::ItemStatus::kOk;
    stats.ucx_put_blocks.fetch_add(taken, std::memory_order_relaxed);
    if (r.endpoint_failed) {
      p.ucx->Failed(member, *ucx_endpoint);
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
      for (uint64_t off = 0; ok && off < b.size(); off += options.stream_chunk_bytes) {
        const uint64_t n = std::min<uint64_t>(options.stream_chunk_bytes, b.size() - off);
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
  if (checksums.empty()) checksums = ComputeChecksums();
  if (creq.checksums_size() == 0) creq.mutable_checksums()->Add(checksums.begin(), checksums.end());
  v1::CommitResponse cresp;
  bool committed = false;
  if (ok && control_over_ucx && ucx_endpoint.has_value() && (ucx_commit.has_value() || !commit_on_put)) {
    auto answer = ucx_commit.has_value() ? *std::move(ucx_commit)
                                         : p.ucx->client()->Commit(*ucx_endpoint, creq.SerializeAsString(),
                                                                   absl::Now() + options.rpc_timeout);
    if (!answer.ok() && IsRefusal(answer.status().code())) {
      refused = member.Refused("Commit", answer.status());
      ok = false;
    } else if (answer.ok()) {
      committed = cresp.ParseFromString(*answer) && static_cast<size_t>(cresp.results_size()) == keys.size();
      ok = committed;
    } else {
      // No answer: the endpoint is dropped and gRPC asked. A commit that did happen meanwhile makes
      // this one fail (an unknown reservation): its blocks then count as errors, though stored.
      p.ucx->Failed(member, *ucx_endpoint);
      cresp.Clear();
    }
    stats.ucx_commits.fetch_add(committed ? 1 : 0, std::memory_order_relaxed);
  }
  if (ok && !committed) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    const absl::Status st = wire::FromGrpc(stub.Commit(&ctx, creq, &cresp));
    if (IsRefusal(st.code())) refused = member.Refused("Commit", st);
    ok = st.ok() && static_cast<size_t>(cresp.results_size()) == keys.size();
  }
  if (!ok) {
    stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
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
  stats.checksum_failures.fetch_add(mismatched, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace kvtier::client
