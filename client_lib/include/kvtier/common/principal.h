// Principal: who a credential names (a bearer token over gRPC, a session ticket over UCX). The server's
// authorization (cache_server/src/auth.h) produces it and the transports (transport/ucx) carry it to
// the store, which lets a worker act only on its own tenant's namespaces, leases and reservations.
#ifndef KVTIER_COMMON_PRINCIPAL_H_
#define KVTIER_COMMON_PRINCIPAL_H_

#include <cstdint>
#include <string>

namespace kvtier {

// A plain value; copy freely. The default is an admin: what every caller is on a server without tokens.
struct Principal {
  enum class Role : uint8_t { kWorker, kAdmin };
  Role role = Role::kAdmin;
  std::string tenant;      // a worker's tenant; "" for an admin
  uint64_t tenant_id = 0;  // TenantId(tenant) (kvtier/common/namespace.h)
  bool admin() const { return role == Role::kAdmin; }
};

}  // namespace kvtier

#endif  // KVTIER_COMMON_PRINCIPAL_H_
