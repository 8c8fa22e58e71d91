#include "auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kvtier/server/block_store.h"
#include "server_metrics.h"

namespace kvtier::server {

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const ServerOptions& options,
                                                                     ServerMetrics& metrics) {
  std::vector<AuthTokenOptions> entries = options.auth_tokens;
  if (!options.auth_tokens_file.empty()) {
    std::ifstream in(options.auth_tokens_file);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("auth.tokens_file: ", options.auth_tokens_file, " cannot be read"));
    }
    std::stringstream text;
    text << in.rdbuf();
    auto loaded = ParseAuthTokens("auth.tokens_file", text.str());
    if (!loaded.ok()) return loaded.status();
    if (loaded->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth.tokens_file: ", options.auth_tokens_file, " lists no token"));
    }
    entries.insert(entries.end(), loaded->begin(), loaded->end());
  }
  auto auth = std::unique_ptr<Authenticator>(new Authenticator(metrics));
  for (const AuthTokenOptions& t : entries) {
    Principal p{.role = t.role == "admin" ? Principal::Role::kAdmin : Principal::Role::kWorker,
                .tenant = t.role == "admin" ? std::string() : t.tenant,
                .tenant_id = t.role == "admin" ? 0 : TenantId(t.tenant)};
    if (!p.admin()) metrics.DeclareTenant(p.tenant);
    if (!auth->tokens_.emplace(t.token_sha256, std::move(p)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth: token with sha256 ", t.token_sha256.substr(0, 12), "... is listed twice"));
    }
  }
  return auth;
}

grpc::Status Authenticator::Authenticate(const grpc::ServerContext& ctx, Principal* out) const {
  if (tokens_.empty()) {
    *out = Principal{};
    return grpc::Status::OK;
  }
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return AuthenticateValue(nullptr, out);
  const std::string value(it->second.data(), it->second.size());
  return AuthenticateValue(&value, out);
}

grpc::Status Authenticator::AuthenticateValue(const std::string* authorization, Principal* out) const {
  if (tokens_.empty()) {
    *out = Principal{};
    return grpc::Status::OK;
  }
  if (authorization == nullptr) {
    metrics_.CountAuthRejection();
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no authorization metadata: send \"Bearer <token>\"");
  }
  absl::string_view value(*authorization);
  if (!absl::ConsumePrefix(&value, "Bearer ")) {
    metrics_.CountAuthRejection();
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization metadata is not \"Bearer <token>\"");
  }
  auto found = tokens_.find(Sha256Hex(std::string(value)));
  if (found == tokens_.end()) {
    metrics_.CountAuthRejection();
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown token");
  }
  *out = found->second;
  return grpc::Status::OK;
}

grpc::Status Authenticator::AuthorizeAdminHeader(const std::string* authorization) const {
  Principal who;
  if (grpc::Status s = AuthenticateValue(authorization, &who); !s.ok()) return s;
  if (who.admin()) return grpc::Status::OK;
  metrics_.CountPermissionRejection();
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      "this endpoint needs an admin token; the token is a worker's");
}

grpc::Status Authenticator::CheckTenant(const Principal& who, uint64_t tenant_id, const std::string& what) const {
  if (who.admin() || who.tenant_id == tenant_id) return grpc::Status::OK;
  metrics_.CountPermissionRejection();
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat(what, " belongs to another tenant than the token's (\"", who.tenant, "\")"));
}

grpc::Status Authenticator::AuthorizeTenant(const grpc::ServerContext& ctx, uint64_t tenant_id,
                                            const std::string& what) const {
  Principal who;
  if (grpc::Status s = Authenticate(ctx, &who); !s.ok()) return s;
  return CheckTenant(who, tenant_id, what);
}

grpc::Status Authenticator::AuthorizeAdmin(const grpc::ServerContext& ctx) const {
  Principal who;
  if (grpc::Status s = Authenticate(ctx, &who); !s.ok()) return s;
  if (who.admin()) return grpc::Status::OK;
  metrics_.CountPermissionRejection();
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "this RPC needs an admin token; the token is a worker's");
}

grpc::Status Authenticator::AuthorizeAny(const grpc::ServerContext& ctx) const {
  Principal who;
  return Authenticate(ctx, &who);
}

}  // namespace kvtier::server
