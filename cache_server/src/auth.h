// Bearer-token authentication and tenant authorization of kvtier-server's gRPC services
// (docs/architecture.md "Security", docs/config.md `auth`).
#ifndef KVTIER_SERVER_SRC_AUTH_H_
#define KVTIER_SERVER_SRC_AUTH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kvtier/common/principal.h"
#include "kvtier/server/server_options.h"

namespace kvtier::server {

class ServerMetrics;

// Who made an RPC, as its token says: kvtier::Principal (kvtier/common/principal.h), shared with the
// UCX transport.
using kvtier::Principal;

// Maps the `authorization: Bearer <token>` metadata of a call to a Principal by the SHA-256 of the
// token, and decides what it may do:
//   - no valid token: UNAUTHENTICATED;
//   - a worker token: cache RPCs on namespaces of its own tenant, and GetInfo (node id, capacity);
//     another tenant's namespace, or any other admin RPC: PERMISSION_DENIED. Another tenant's lease or
//     reservation id is not refused here: the store answers it exactly as an unknown id (IdHolder in
//     kvtier/server/block_store.h), so that a refusal never says that an id is live;
//   - an admin token: everything.
// With no token configured (the default) every call is allowed, as an admin.
// Every refusal is counted in `metrics` (kvtier_rejections_total{reason}).
// Thread-safety: immutable after Create; all methods may be called concurrently.
class Authenticator {
 public:
  // Takes options.auth_tokens and reads options.auth_tokens_file (when set). `metrics` must outlive it.
  // Errors: NotFound ("auth.tokens_file: ... cannot be read"), InvalidArgument (a bad entry, named by
  // its key).
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const ServerOptions& options, ServerMetrics& metrics);

  bool enabled() const { return !tokens_.empty(); }

  // The caller of `ctx`. Errors (as gRPC statuses): UNAUTHENTICATED (no or unknown token).
  grpc::Status Authenticate(const grpc::ServerContext& ctx, Principal* out) const;
  // Authenticates `ctx` and checks that it may act on blocks of `tenant_id`: an admin, or a worker of
  // that tenant. Errors: UNAUTHENTICATED, PERMISSION_DENIED (`what` names the object in the message).
  grpc::Status AuthorizeTenant(const grpc::ServerContext& ctx, uint64_t tenant_id, const std::string& what) const;
  // Checks an authenticated `who` against `tenant_id` as above. Errors: PERMISSION_DENIED.
  grpc::Status CheckTenant(const Principal& who, uint64_t tenant_id, const std::string& what) const;
  // Authenticates `ctx` and requires an admin token. Errors: UNAUTHENTICATED, PERMISSION_DENIED.
  grpc::Status AuthorizeAdmin(const grpc::ServerContext& ctx) const;
  // Authenticates `ctx`, any role. Errors: UNAUTHENTICATED.
  grpc::Status AuthorizeAny(const grpc::ServerContext& ctx) const;
  // As AuthorizeAdmin, for an HTTP request: `authorization` is its Authorization header, null when it
  // has none (the query endpoints, docs/query.md). Errors: UNAUTHENTICATED, PERMISSION_DENIED.
  grpc::Status AuthorizeAdminHeader(const std::string* authorization) const;

 private:
  explicit Authenticator(ServerMetrics& metrics) : metrics_(metrics) {}
  // The principal of an `authorization` value ("Bearer <token>"; null: none given).
  grpc::Status AuthenticateValue(const std::string* authorization, Principal* out) const;

  absl::flat_hash_map<std::string, Principal> tokens_;  // SHA-256 hex of the token -> who it is
  ServerMetrics& metrics_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_AUTH_H_
