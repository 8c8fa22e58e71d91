// gRPC implementations of kvtier.v1.CacheService and kvtier.v1.AdminService over one BlockStore.
#ifndef KVTIER_SERVER_SRC_CACHE_SERVICE_H_
#define KVTIER_SERVER_SRC_CACHE_SERVICE_H_

#include <atomic>
#include <functional>

#include "absl/time/time.h"
#include "auth.h"
#include "kvtier/server/block_store.h"
#include "kvtier/server/server_options.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "namespace_registry.h"
#include "server_metrics.h"
#include "transport/ucx_sessions.h"

namespace kvtier::server {

// Validates every request (namespace, key counts, shards, sizes) before touching the store.
// Thread-safety: gRPC calls the handlers concurrently; all state is in the thread-safe store.
class CacheServiceImpl final : public v1::CacheService::Service {
 public:
  // Every handler first checks the caller's token with `auth` (docs/architecture.md "Security").
  // All references must outlive the service.
  CacheServiceImpl(const ServerOptions& options, BlockStore& store, ServerMetrics& metrics,
                   NamespaceRegistry& namespaces, const Authenticator& auth);

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

  // Lease for the UCX data plane (kvtier/wire/ucx_messages.h kLease): what the Lease RPC does, for a
  // caller authenticated as `who` by its UCX session (an admin when the server requires no ticket); a
  // get then needs no gRPC round trip. Counted as the "Lease" method in kvtier_rpc_duration_seconds.
  // Thread-safe. Errors: InvalidArgument (bad namespace or keys), PermissionDenied (a namespace of
  // another tenant than a worker's).
  absl::Status LeaseAs(const Principal& who, const v1::ReadRequest& req, v1::ReadResponse* resp);
  // Allocate and Commit for the UCX data plane (kAllocate, kCommit), as LeaseAs is for Lease: what the
  // RPCs do, for a caller authenticated as `who`, counted as their methods. Thread-safe. Errors: as
  // the RPCs' (InvalidArgument, PermissionDenied, ResourceExhausted, FailedPrecondition for an unknown
  // or expired reservation).
  absl::Status AllocateAs(const Principal& who, const v1::AllocateRequest& req, v1::AllocateResponse* resp);
  absl::Status CommitAs(const Principal& who, const v1::CommitRequest& req, v1::CommitResponse* resp);

 private:
  struct Parsed;
  // Namespace and keys of a request, validated, and the caller allowed on the namespace's tenant.
  // Errors: InvalidArgument (counted as a rejection), Unauthenticated, PermissionDenied.
  absl::StatusOr<Parsed> Parse(const grpc::ServerContext& ctx, const v1::Namespace& ns, const v1::BlockKeys& keys);
  // The same for a caller already authenticated as `who`.
  absl::StatusOr<Parsed> ParseFor(const Principal& who, const v1::Namespace& ns, const v1::BlockKeys& keys);
  // Leases the present blocks of `p` for lease_ms (0: the default) and fills `resp` (block status,
  // checksums, lease id).
  void LeaseParsed(const Parsed& p, uint32_t lease_ms, v1::ReadResponse* resp);
  // Reserves the keys of `p` (req's depths) and fills `resp`; `cancelled` says whether the caller gave up
  // (checked before and after the store call: a reservation nobody will use is aborted).
  absl::Status AllocateParsed(const Parsed& p, const v1::AllocateRequest& req, const std::function<bool()>& cancelled,
                              v1::AllocateResponse* resp);
  // Commits req's reservation as `holder` and fills `resp`.
  absl::Status CommitFor(IdHolder holder, const v1::CommitRequest& req, v1::CommitResponse* resp);
  // Authenticates the caller of `ctx` and sets *holder to whose lease and reservation ids it may use: its
  // tenant for a worker, kAnyTenant for an admin (or any caller of a server without tokens). Errors:
  // UNAUTHENTICATED.
  grpc::Status AuthenticateHolder(const grpc::ServerContext& ctx, IdHolder* holder) const;
  grpc::Status Finish(const char* method, absl::Time start, const grpc::Status& status);
  // Counts (by tenant) and logs, rate limited, the present blocks a lease refused because their tenant
  // is at its pinned bound.
  void NotePinnedRefusals(const Parsed& p, uint32_t refused);

  const ServerOptions& options_;
  BlockStore& store_;
  ServerMetrics& metrics_;
  NamespaceRegistry& namespaces_;
  const Authenticator& auth_;
  UcxSessions* ucx_sessions_ = nullptr;
};

// GetInfo answers any authenticated caller (clients ask it for node ids); every other RPC needs an
// admin token when authentication is on.
class AdminServiceImpl final : public v1::AdminService::Service {
 public:
  AdminServiceImpl(const ServerOptions& options, BlockStore& store, const ServerMetrics& metrics,
                   const NamespaceRegistry& namespaces, const Authenticator& auth);

  grpc::Status GetInfo(grpc::ServerContext* ctx, const v1::GetInfoRequest* req, v1::GetInfoResponse* resp) override;
  grpc::Status GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest* req, v1::GetStatsResponse* resp) override;

  // The bound UCX port that GetInfo reports (0: no UCX). Set before the gRPC server starts.
  void set_ucx_port(int port) { ucx_port_.store(port, std::memory_order_release); }
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
  const ServerMetrics& metrics_;
  const NamespaceRegistry& namespaces_;
  const Authenticator& auth_;
  absl::Time start_ = absl::Now();
  std::atomic<int> ucx_port_{0};
  std::atomic<int> http_port_{0};
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_CACHE_SERVICE_H_
