// The gRPC implementation of kvtier.v1.CacheService over one BlockStore.
#ifndef KVTIER_SERVER_SRC_CACHE_SERVICE_H_
#define KVTIER_SERVER_SRC_CACHE_SERVICE_H_

#include "absl/status/status.h"
#include "auth.h"
#include "block_requests.h"
#include "kvtier/server/block_store.h"
#include "kvtier/server/server_options.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "server_metrics.h"
#include "transport/ucx_sessions.h"

namespace kvtier::server {

// Each handler authenticates its caller's token (docs/architecture.md "Security"), hands the request
// to BlockRequests (the rules every transport shares: validation, tenants, shadow mode), moves the
// bytes of Read and WriteBlocks itself, and is timed by an RpcScope under its method's name.
// Thread-safety: gRPC calls the handlers concurrently; all state is in the thread-safe store.
class CacheServiceImpl final : public v1::CacheService::Service {
 public:
  // All references must outlive the service.
  CacheServiceImpl(const ServerOptions& options, BlockStore& store, ServerMetrics& metrics, BlockRequests& requests,
                   const Authenticator& auth);

  grpc::Status Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req, v1::LookupResponse* resp) override;
  grpc::Status Allocate(grpc::ServerContext* ctx, const v1::AllocateRequest* req, v1::AllocateResponse* resp) override;
  grpc::Status WriteBlocks(grpc::ServerContext* ctx, grpc::ServerReader<v1::WriteBlocksRequest>* reader,
                           v1::WriteBlocksResponse* resp) override;
  grpc::Status Commit(grpc::ServerContext* ctx, const v1::CommitRequest* req, v1::CommitResponse* resp) override;
  grpc::Status Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req, v1::AbortResponse* resp) override;
  grpc::Status Read(grpc::ServerContext* ctx, const v1::ReadRequest* req,
                    grpc::ServerWriter<v1::ReadResponse>* writer) override;
  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req, v1::ReleaseResponse* resp) override;
  grpc::Status Lease(grpc::ServerContext* ctx, const v1::ReadRequest* req, v1::ReadResponse* resp) override;

  grpc::Status OpenUcxSession(grpc::ServerContext* ctx, const v1::OpenUcxSessionRequest* req,
                              v1::OpenUcxSessionResponse* resp) override;

  // The UCX listener's tickets (null: no listener; OpenUcxSession answers FAILED_PRECONDITION). Set
  // before the gRPC server starts; `sessions` must outlive the service.
  void set_ucx_sessions(UcxSessions* sessions) { ucx_sessions_ = sessions; }

 private:
  const ServerOptions& options_;
  BlockStore& store_;
  ServerMetrics& metrics_;
  BlockRequests& requests_;
  const Authenticator& auth_;
  UcxSessions* ucx_sessions_ = nullptr;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_CACHE_SERVICE_H_
