// BlockPath: one member's data path, the seam between the client's call logic and the ways block bytes
// move (docs/architecture.md "A Get, step by step"): GrpcBlockPath (grpc_block_path.h), UcxBlockPath
// (ucx_block_path.h) and, for device buffers, NcclBlockPath (nccl_block_path.h). DataPath (data_path.h)
// picks one per member and per batch; the UCX-to-gRPC fallback of transport "auto" is that choice.
#ifndef KVTIER_CLIENT_SRC_CLIENT_BLOCK_PATH_H_
#define KVTIER_CLIENT_SRC_CLIENT_BLOCK_PATH_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/refusal.h"
#include "kvtier/client/client.h"
#include "kvtier/client/device_buffer.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/namespace.h"
#include "kvtier/v1/cache.pb.h"

namespace kvtier::client {

// A batch of one member's blocks to read. Everything is borrowed for the call.
struct ReadBatchRequest {
  const v1::Namespace* pns = nullptr;             // the call's namespace, never null
  std::span<const BlockKey> keys;                 // keys[k] is block idx[k] of the call
  std::span<const uint32_t> idx;                  // positions in the call, as long as keys
  uint64_t block_bytes = 0;                       // bytes of each block
  std::span<const std::span<std::byte>> buffers;  // the call's buffers (indexed by idx[k]), block_bytes each
  std::span<GetResult> results;                   // the call's results (indexed by idx[k]); kMissFromError on entry
  absl::Time deadline = absl::InfiniteFuture();   // this attempt's deadline
  // A batch into device memory (Client::GetIntoDevice): the call's device buffers (indexed by idx[k],
  // block_bytes each), `buffers` then empty; only a path with capabilities().device_buffers takes it.
  // Empty for host buffers.
  std::span<const DeviceBuffer> device_buffers;
  const Namespace* ns = nullptr;  // the call's namespace; set with device_buffers
  void* stream = nullptr;         // the caller's cudaStream_t for device_buffers; nullptr = default stream
};

// A batch of one member's blocks to put. Everything is borrowed for the call.
struct PutBatchRequest {
  const v1::Namespace* pns = nullptr;                  // never null
  std::span<const BlockKey> keys;                      // the batch's keys
  std::span<const uint32_t> depths;                    // prefix depth of each key
  std::span<const std::span<const std::byte>> blocks;  // block_bytes each, as long as keys
  uint64_t block_bytes = 0;
  std::span<PutResult> results;                  // as long as keys; kError on entry
  std::span<const BlockMeta* const> block_meta;  // empty, or one per key
};

// What a path can do.
struct BlockPathCapabilities {
  bool takes_leases = false;    // a read's lease goes over the path itself (no gRPC round trip)
  bool takes_puts = false;      // a put's reservation and commit go over the path itself
  bool device_buffers = false;  // moves bytes straight from and into device memory
};

// One member's data path for one batch. Thread-safety: one call at a time per object; objects are made
// per batch (DataPath) and are cheap.
class BlockPath {
 public:
  virtual ~BlockPath() = default;

  // "grpc", "ucx" (MemberInfo::transport's values) or "nccl".
  virtual absl::string_view name() const = 0;
  virtual BlockPathCapabilities capabilities() const = 0;

  // Reads batch.keys into batch.buffers[batch.idx[k]] (batch.device_buffers[batch.idx[k]] for a device
  // batch) and sets batch.results[batch.idx[k]] (a block left kMissFromError when the member fails or
  // misses batch.deadline). A refusal of the request
  // (IsRefusal) is recorded in `refusal`. Returns false, with nothing done to the results, when this
  // path did not move the bytes and another path may (the lease was answered only over gRPC).
  virtual bool Read(const ReadBatchRequest& batch, CallRefusal& refusal) = 0;

  // Two-phase put of the batch: sets batch.results[k] (kError when the member fails); each RPC gets
  // rpc_timeout. Returns OK, the member's refusal of the request (IsRefusal; results then say nothing),
  // or nullopt, with nothing done to the results, when another path may take the batch (always, for a
  // path that does not take puts, as NCCL).
  virtual std::optional<absl::Status> Put(const PutBatchRequest& batch) = 0;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_BLOCK_PATH_H_
