// UcxBlockPath: a member's block bytes over its ready UCX endpoint (UcxClient, kvtier/ucx/ucx_client.h): the
// server sends a read's blocks straight into the caller's buffers and takes a put's bytes straight into
// its reserved slots; leases, reservations and commits go over the endpoint when its session takes
// them, else over gRPC.
#ifndef KVTIER_CLIENT_SRC_CLIENT_UCX_BLOCK_PATH_H_
#define KVTIER_CLIENT_SRC_CLIENT_UCX_BLOCK_PATH_H_

#include <mutex>

#include "client/block_path.h"
#include "client/membership.h"
#include "client/ucx_endpoints.h"
#include "kvtier/client/client.h"
#include "kvtier/ucx/ucx_client.h"

namespace kvtier::client {

// Ownership: `member`, `options`, `stats` and `ucx` are borrowed and must outlive this object.
class UcxBlockPath final : public BlockPath {
 public:
  // `endpoint`: the member's ready endpoint (UcxEndpoints::Endpoint).
  UcxBlockPath(Member& member, UcxClient::EndpointId endpoint, const ClientOptions& options, ClientStats& stats,
               UcxEndpoints& ucx)
      : member_(member), endpoint_(endpoint), options_(options), stats_(stats), ucx_(ucx) {}

  absl::string_view name() const override { return "ucx"; }
  BlockPathCapabilities capabilities() const override;
  // False when the member answered the lease only over gRPC (a kLease unanswered in time, its endpoint
  // dropped): the caller may move these bytes over gRPC instead.
  bool Read(const ReadBatchRequest& batch, CallRefusal& refusal) override;
  // Nullopt when the reservation over the endpoint failed before the member answered (the endpoint is
  // dropped): the caller may put the batch over gRPC instead.
  std::optional<absl::Status> Put(const PutBatchRequest& batch) override;

 private:
  Member& member_;
  const UcxClient::EndpointId endpoint_;
  const ClientOptions& options_;
  ClientStats& stats_;
  UcxEndpoints& ucx_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_UCX_BLOCK_PATH_H_
