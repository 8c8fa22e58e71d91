// GrpcBlockPath: a member's blocks over its gRPC channel (the streamed Read RPC; Allocate, WriteBlocks
// and Commit), the path that always works.
#ifndef KVTIER_CLIENT_SRC_CLIENT_GRPC_BLOCK_PATH_H_
#define KVTIER_CLIENT_SRC_CLIENT_GRPC_BLOCK_PATH_H_

#include "client/block_path.h"
#include "client/membership.h"
#include "kvtier/client/client.h"

namespace kvtier::client {

// Ownership: `member`, `options` and `stats` are borrowed and must outlive this object.
class GrpcBlockPath final : public BlockPath {
 public:
  GrpcBlockPath(Member& member, const ClientOptions& options, ClientStats& stats)
      : member_(member), options_(options), stats_(stats) {}

  absl::string_view name() const override { return "grpc"; }
  BlockPathCapabilities capabilities() const override { return {}; }
  // Always moves the bytes (true): a failure leaves the blocks kMissFromError.
  bool Read(const ReadBatchRequest& batch, CallRefusal& refusal) override;
  // Never nullopt.
  std::optional<absl::Status> Put(const PutBatchRequest& batch) override;

 private:
  Member& member_;
  const ClientOptions& options_;
  ClientStats& stats_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_GRPC_BLOCK_PATH_H_
