// NcclBlockPath: a member's blocks received straight into the caller's device buffers over NCCL, from the
// member's HBM tier (NcclWorker, transport/nccl; docs/gpu.md). Reads of device batches only: it takes no
// puts, no host buffers, and no lease over gRPC (the member leases the blocks while it sends them).
#ifndef KVTIER_CLIENT_SRC_CLIENT_NCCL_BLOCK_PATH_H_
#define KVTIER_CLIENT_SRC_CLIENT_NCCL_BLOCK_PATH_H_

#include "client/block_path.h"
#include "kvtier/client/client.h"
#include "kvtier/nccl/nccl_worker.h"

namespace kvtier::client {

// Ownership: `worker` and `stats` are borrowed and must outlive this object.
class NcclBlockPath final : public BlockPath {
 public:
  NcclBlockPath(nccl::NcclWorker& worker, ClientStats& stats) : worker_(worker), stats_(stats) {}

  absl::string_view name() const override { return "nccl"; }
  BlockPathCapabilities capabilities() const override { return {.device_buffers = true}; }
  // A device batch (batch.device_buffers set): one NcclWorker::Fetch of the batch, returning once the
  // received bytes are in place on batch.stream. Blocks the member sent are kHit, blocks its device tier
  // does not hold kMiss, and blocks of a failed or timed-out transfer kMissFromError (each failed
  // batch counted in rpc_errors); the worker's own timeouts bound it, not batch.deadline. Returns false,
  // doing nothing, for a host batch.
  bool Read(const ReadBatchRequest& batch, CallRefusal& refusal) override;
  // Always nullopt: puts go over the host paths.
  std::optional<absl::Status> Put(const PutBatchRequest& batch) override;

 private:
  nccl::NcclWorker& worker_;
  ClientStats& stats_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_NCCL_BLOCK_PATH_H_
