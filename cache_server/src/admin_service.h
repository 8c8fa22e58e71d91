// The gRPC implementation of kvtier.v1.AdminService: node info and stats, block listing and
// inspection, eviction, verification, draining and lookup groups.
#ifndef KVTIER_SERVER_SRC_ADMIN_SERVICE_H_
#define KVTIER_SERVER_SRC_ADMIN_SERVICE_H_

#include <atomic>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "auth.h"
#include "kvtier/server/block_store.h"
#include "kvtier/server/server_options.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "namespace_registry.h"
#include "server_metrics.h"

namespace kvtier::server {

// GetInfo answers any authenticated caller (clients ask it for node ids); every other RPC needs an
// admin token when authentication is on.
class AdminServiceImpl final : public v1::AdminService::Service {
 public:
  AdminServiceImpl(const ServerOptions& options, BlockStore& store, ServerMetrics& metrics,
                   const NamespaceRegistry& namespaces, const Authenticator& auth);

  grpc::Status GetInfo(grpc::ServerContext* ctx, const v1::GetInfoRequest* req, v1::GetInfoResponse* resp) override;
  grpc::Status GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest* req, v1::GetStatsResponse* resp) override;

  // The bound UCX port that GetInfo reports (0: no UCX). Set before the gRPC server starts.
  void set_ucx_port(int port) { ucx_port_.store(port, std::memory_order_release); }
  // Whether this server serves kvtier.v1.NcclService (GetInfo's nccl). Set before the gRPC server starts.
  void set_nccl(bool served) { nccl_.store(served, std::memory_order_release); }
  // The /metrics and /query listener's port (GetInfo's http_port), once bound.
  void set_http_port(int port) { http_port_.store(port, std::memory_order_release); }
  grpc::Status ListBlocks(grpc::ServerContext* ctx, const v1::ListBlocksRequest* req,
                          v1::ListBlocksResponse* resp) override;
  grpc::Status InspectBlock(grpc::ServerContext* ctx, const v1::InspectBlockRequest* req,
                            v1::InspectBlockResponse* resp) override;
  grpc::Status Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req, v1::EvictResponse* resp) override;
  grpc::Status Verify(grpc::ServerContext* ctx, const v1::VerifyRequest* req,
                      grpc::ServerWriter<v1::VerifyProgress>* writer) override;
  grpc::Status SetDraining(grpc::ServerContext* ctx, const v1::SetDrainingRequest* req,
                           v1::SetDrainingResponse* resp) override;
  grpc::Status ListGroups(grpc::ServerContext* ctx, const v1::ListGroupsRequest* req,
                          v1::ListGroupsResponse* resp) override;

 private:
  absl::StatusOr<BlockStore::BlockFilter> ParseFilter(const v1::BlockFilter& f) const;
  void FillRecord(const BlockStore::BlockInfo& info, v1::BlockRecord* out) const;

  const ServerOptions& options_;
  BlockStore& store_;
  ServerMetrics& metrics_;
  const NamespaceRegistry& namespaces_;
  const Authenticator& auth_;
  absl::Time start_ = absl::Now();
  std::atomic<int> ucx_port_{0};
  std::atomic<int> http_port_{0};
  std::atomic<bool> nccl_{false};
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_ADMIN_SERVICE_H_
