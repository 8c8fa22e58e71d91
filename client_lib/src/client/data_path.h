// One member's data path (docs/architecture.md "A Get, step by step"): a batch of blocks read from,
// or put to, one member, over UCX when its endpoint is up (transport "auto" or "ucx") and gRPC
// otherwise (transport "auto" or "grpc"); the UCX-to-gRPC fallback of transport "auto" happens here.
#ifndef KVTIER_CLIENT_SRC_CLIENT_DATA_PATH_H_
#define KVTIER_CLIENT_SRC_CLIENT_DATA_PATH_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/membership.h"
#include "client/refusal.h"
#include "client/transport_mode.h"
#include "client/ucx_endpoints.h"
#include "kvtier/client/client.h"
#include "kvtier/common/block_key.h"
#include "kvtier/v1/cache.grpc.pb.h"

namespace kvtier::client {

// Thread-safety: all methods may be called concurrently.
// Ownership: `options`, `stats` and `ucx` are borrowed and must outlive this object.
class DataPath {
 public:
  DataPath(const ClientOptions& options, TransportMode mode, ClientStats& stats, UcxEndpoints& ucx)
      : options_(options), mode_(mode), stats_(stats), ucx_(ucx) {}

  // Reads `keys` (block idx[k] of the call) from `member` into buffers[idx[k]] (each block_bytes long,
  // borrowed for the call) and sets results[idx[k]] (left kMissFromError when the owner fails or misses
  // `deadline`). A refusal of the request (IsRefusal) is recorded in `refusal`.
  void ReadBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                 std::span<const uint32_t> idx, uint64_t block_bytes, std::span<const std::span<std::byte>> buffers,
                 std::span<GetResult> results, absl::Time deadline, CallRefusal& refusal);

  // Two-phase put of one batch to `member`: keys[k] from blocks[k] (each block_bytes long, borrowed for
  // the call) at prefix depth depths[k], with block_meta[k] when block_meta is not empty. Sets
  // results[k]; they stay kError when the owner fails. Each RPC gets rpc_timeout.
  // Returns OK, or the member's refusal of the request (IsRefusal; results then say nothing).
  absl::Status PutBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                        std::span<const uint32_t> depths, std::span<const std::span<const std::byte>> blocks,
                        uint64_t block_bytes, std::span<PutResult> results,
                        std::span<const BlockMeta* const> block_meta = {});

 private:
  void ReleaseLease(Member& member, const std::string& lease_id, absl::Time deadline);
  bool GetOverUcx(Member& member, UcxClient::EndpointId endpoint, const v1::Namespace& pns,
                  std::span<const BlockKey> keys, std::span<const uint32_t> idx, uint64_t block_bytes,
                  std::span<const std::span<std::byte>> buffers, std::span<GetResult> results, absl::Time deadline,
                  CallRefusal& refusal);
  void SetDeadline(grpc::ClientContext& ctx) const;

  const ClientOptions& options_;
  const TransportMode mode_;
  ClientStats& stats_;
  UcxEndpoints& ucx_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_DATA_PATH_H_
