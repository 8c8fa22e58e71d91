// DataPath: picks one member's BlockPath (block_path.h) for each batch a call reads or puts, by the
// client's transport and where the call's buffers are (docs/architecture.md "A Get, step by step"):
// host buffers take UCX where the member's endpoint is up (transport "auto" or "ucx"), gRPC otherwise
// (transport "auto" or "grpc"); device buffers take NCCL where the member offers it (transport "auto"),
// else nothing, and the caller stages them through host memory (DeviceTransfer). The UCX-to-gRPC
// fallback of transport "auto" is this choice: a batch the UCX path did not move goes over gRPC.
#ifndef KVTIER_CLIENT_SRC_CLIENT_DATA_PATH_H_
#define KVTIER_CLIENT_SRC_CLIENT_DATA_PATH_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/block_path.h"
#include "client/membership.h"
#include "client/refusal.h"
#include "client/transport_mode.h"
#include "client/ucx_endpoints.h"
#include "kvtier/client/client.h"
#include "kvtier/common/block_key.h"
#include "kvtier/v1/cache.pb.h"

namespace kvtier::client {

class NcclEndpoints;  // nccl_endpoints.h: kept out of this header, so that its users need no NCCL headers

// Makes a member's paths for one batch. Thread-safety: all methods may be called concurrently.
class BlockPathFactory {
 public:
  virtual ~BlockPathFactory() = default;
  // The member's UCX path, or null when it has no ready endpoint now (none offered, connecting,
  // backing off); may connect, by `deadline`.
  virtual std::unique_ptr<BlockPath> Ucx(Member& member, absl::Time deadline) = 0;
  // The member's gRPC path; never null.
  virtual std::unique_ptr<BlockPath> Grpc(Member& member) = 0;
  // The member's path into device memory of CUDA device `device` (capabilities().device_buffers), or
  // null when it has none (the member offers no NCCL, or this client uses none); may ask the member, by
  // `deadline`. Default: null (a factory of host paths only).
  virtual std::unique_ptr<BlockPath> Nccl(Member& member, int32_t device, absl::Time deadline) {
    (void)member, (void)device, (void)deadline;
    return nullptr;
  }
};

// The factory of the real paths: UcxBlockPath over `ucx`'s endpoints, GrpcBlockPath over the member's
// channel, NcclBlockPath over `nccl`'s workers. `options`, `stats`, `ucx` and `nccl` are borrowed and
// must outlive it.
std::unique_ptr<BlockPathFactory> MakeBlockPathFactory(const ClientOptions& options, ClientStats& stats,
                                                       UcxEndpoints& ucx, NcclEndpoints& nccl);

// Test seam (tests/unit/client): while set (non-empty), Client::Connect makes its paths with `make`
// instead of MakeBlockPathFactory. Set it before Connect and clear it after the client is destroyed;
// not safe against a concurrent Connect.
using BlockPathFactoryMaker = std::function<std::unique_ptr<BlockPathFactory>()>;
void SetBlockPathFactoryForTest(BlockPathFactoryMaker make);
// The maker set by SetBlockPathFactoryForTest; empty when none is.
BlockPathFactoryMaker BlockPathFactoryForTest();

// Thread-safety: all methods may be called concurrently.
// Ownership: `options` and `stats` are borrowed and must outlive this object.
class DataPath {
 public:
  DataPath(const ClientOptions& options, TransportMode mode, ClientStats& stats,
           std::unique_ptr<BlockPathFactory> paths)
      : options_(options), mode_(mode), stats_(stats), paths_(std::move(paths)) {}

  // Opens member's UCX path ahead of its first batch (Connect, transport "auto" or "ucx"), by
  // `deadline`; a member that fails here is retried by the first batch that needs it.
  void WarmUp(Member& member, absl::Time deadline) { (void)paths_->Ucx(member, deadline); }

  // Reads `keys` (block idx[k] of the call) from `member` into buffers[idx[k]] (each block_bytes long,
  // borrowed for the call) and sets results[idx[k]] (left kMissFromError when the owner fails or misses
  // `deadline`; also with transport "ucx" and no UCX endpoint). A refusal of the request (IsRefusal) is
  // recorded in `refusal`.
  void ReadBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                 std::span<const uint32_t> idx, uint64_t block_bytes, std::span<const std::span<std::byte>> buffers,
                 std::span<GetResult> results, absl::Time deadline, CallRefusal& refusal);

  // Reads `keys` (block idx[k] of the call, of namespace `ns`, `pns` as a message) from `member` straight
  // into device_buffers[idx[k]] (device memory of one CUDA device, each block_bytes long, borrowed for
  // the call) over the member's device path, on `stream`, and sets results[idx[k]]. With no device path
  // (transport not "auto", or the member offers none), nothing is read and the blocks stay as they
  // are (kMissFromError on entry): the caller fetches them through host memory.
  void ReadDeviceBatch(Member& member, const Namespace& ns, const v1::Namespace& pns, std::span<const BlockKey> keys,
                       std::span<const uint32_t> idx, uint64_t block_bytes,
                       std::span<const DeviceBuffer> device_buffers, void* stream, std::span<GetResult> results,
                       absl::Time deadline, CallRefusal& refusal);

  // Two-phase put of one batch to `member`: keys[k] from blocks[k] (each block_bytes long, borrowed for
  // the call) at prefix depth depths[k], with block_meta[k] when block_meta is not empty. Sets
  // results[k]; they stay kError when the owner fails (also with transport "ucx" and no UCX endpoint).
  // Each RPC gets rpc_timeout. Returns OK, or the member's refusal of the request (IsRefusal; results
  // then say nothing).
  absl::Status PutBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                        std::span<const uint32_t> depths, std::span<const std::span<const std::byte>> blocks,
                        uint64_t block_bytes, std::span<PutResult> results,
                        std::span<const BlockMeta* const> block_meta = {});

 private:
  const ClientOptions& options_;
  const TransportMode mode_;
  ClientStats& stats_;
  const std::unique_ptr<BlockPathFactory> paths_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_DATA_PATH_H_
