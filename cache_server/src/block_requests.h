// The data plane's requests, whatever carried them: what the gRPC CacheService and the UCX control
// messages (kLease, kAllocate, kCommit) both call once they know who is asking.
#ifndef KVTIER_SERVER_SRC_BLOCK_REQUESTS_H_
#define KVTIER_SERVER_SRC_BLOCK_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "auth.h"
#include "kvtier/server/block_store.h"
#include "kvtier/server/server_options.h"
#include "kvtier/v1/cache.pb.h"
#include "namespace_registry.h"
#include "server_metrics.h"

namespace kvtier::server {

// One server's rules for data-plane requests, in one place for every transport: a caller's namespace
// and keys are validated (layout, block size against limits.max_block_bytes, key counts and shards
// against limits.max_blocks_per_request), a worker is kept to its own tenant's namespaces and lease and
// reservation ids, a shadow namespace is never served (every key answered absent, the would-be hits
// counted), and leases refused at a tenant's pinned bound are counted and logged.
//
// Every method takes the caller's Principal, already authenticated by its transport (a gRPC token, a
// UCX session ticket; an admin on a server without tokens), and neither authenticates nor times:
// transports do both (Authenticator, RpcScope). Errors are absl statuses with gRPC's codes:
// InvalidArgument (bad namespace, keys, depths or metadata), PermissionDenied (another tenant's
// namespace), and those of the BlockStore call named per method.
// Thread-safety: every method may be called concurrently; the state is the thread-safe store's.
// All references must outlive the object.
class BlockRequests {
 public:
  BlockRequests(const ServerOptions& options, BlockStore& store, ServerMetrics& metrics, NamespaceRegistry& namespaces,
                const Authenticator& auth);

  // A request's namespace and keys, admitted (Admit).
  struct Admitted {
    NamespaceRef ns;
    std::string tenant;  // the namespace's tenant, for what the server logs and counts by name
    std::vector<BlockKey> keys;
    bool shadow = false;  // the namespace is in shadow mode (ServerOptions::namespaces)
  };
  // Validates `ns` and `keys` for `who` and remembers the namespace's names (ListBlocks, events).
  // Errors: InvalidArgument, PermissionDenied.
  absl::StatusOr<Admitted> Admit(const Principal& who, const v1::Namespace& ns, const v1::BlockKeys& keys);

  // Which blocks are present, with a lease on them when req.lease_ms() > 0 (BlockStore::Lookup).
  absl::Status Lookup(const Principal& who, const v1::LookupRequest& req, v1::LookupResponse* resp);

  // Leases the present blocks of `a` for lease_ms (0: the store's default) and writes their status
  // (present, size, checksum) and the lease id into `head`; the lease, for a caller that streams the
  // bytes itself (gRPC Read). A shadow namespace: every block absent, no lease (lease_id null).
  BlockStore::ReadLease LeaseAdmitted(const Admitted& a, uint32_t lease_ms, v1::ReadResponse* head);
  // Lease (gRPC Lease, UCX kLease): Admit, then LeaseAdmitted. The bytes then go by PinForSend (UCX) or
  // CopyOut; the lease stays until Release or expiry.
  absl::Status Lease(const Principal& who, const v1::ReadRequest& req, v1::ReadResponse* resp);

  // Reserves req's keys (with its depths and block metadata) for a put and fills `resp`. `cancelled`
  // says whether the caller gave up; it is asked before and after the store call, and a reservation
  // nobody will use is aborted (Cancelled). Errors: also those of BlockStore::Allocate
  // (ResourceExhausted, FailedPrecondition while draining).
  absl::Status Allocate(const Principal& who, const v1::AllocateRequest& req, const std::function<bool()>& cancelled,
                        v1::AllocateResponse* resp);
  // Payload bytes of reserved block `index` at `offset` (BlockStore::Write, as `who`'s holder).
  absl::Status Write(const Principal& who, const CapabilityId& reservation, uint32_t index, uint64_t offset,
                     std::span<const std::byte> data);
  // Commits req's reservation (BlockStore::Commit) and fills `resp` with one result per block.
  // Errors: FailedPrecondition (unknown, expired or another tenant's reservation), InvalidArgument.
  absl::Status Commit(const Principal& who, const v1::CommitRequest& req, v1::CommitResponse* resp);
  // Aborts a reservation; unknown and other tenants' ids are ignored alike.
  void Abort(const Principal& who, const CapabilityId& reservation);
  // Releases leases; returns how many were live and `who`'s (the others are skipped, uncounted).
  uint32_t Release(const Principal& who, std::span<const CapabilityId> leases);

  // Whose lease and reservation ids `who` may use: its tenant for a worker, kAnyTenant for an admin.
  static IdHolder HolderOf(const Principal& who) { return who.admin() ? kAnyTenant : IdHolder(who.tenant_id); }

 private:
  // Counts (by tenant) and logs, rate limited, the present blocks a lease refused because their tenant
  // is at its pinned bound.
  void NotePinnedRefusals(const Admitted& a, uint32_t refused);

  const ServerOptions& options_;
  BlockStore& store_;
  ServerMetrics& metrics_;
  NamespaceRegistry& namespaces_;
  const Authenticator& auth_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_BLOCK_REQUESTS_H_
