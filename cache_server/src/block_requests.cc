#include "block_requests.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "kvtier/common/log.h"
#include "kvtier/wire/wire.h"

namespace kvtier::server {

BlockRequests::BlockRequests(const ServerOptions& options, BlockStore& store, ServerMetrics& metrics,
                             NamespaceRegistry& namespaces, const Authenticator& auth)
    : options_(options), store_(store), metrics_(metrics), namespaces_(namespaces), auth_(auth) {}

absl::StatusOr<BlockRequests::Admitted> BlockRequests::Admit(const Principal& who, const v1::Namespace& pns,
                                                             const v1::BlockKeys& pkeys) {
  auto ns = wire::FromProto(pns);
  if (!ns.ok()) return ns.status();
  // A worker touches only its own tenant's namespaces; checked before the namespace is remembered.
  if (grpc::Status s =
          auth_.CheckTenant(who, TenantId(ns->tenant), absl::StrCat("namespace.tenant \"", ns->tenant, "\""));
      !s.ok()) {
    return wire::FromGrpc(s);
  }
  const uint64_t block_bytes = ns->layout.ShardBytes();
  if (block_bytes > options_.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("namespace.layout: a block is ", block_bytes,
                                                   " bytes, this server accepts at most ", options_.max_block_bytes));
  }
  auto keys = wire::DecodeKeys(pkeys, ns->layout.tp_size, options_.max_blocks_per_request);
  if (!keys.ok()) return keys.status();
  Admitted a;
  a.ns = NamespaceRef{.id = ns->Id(), .tenant_id = TenantId(ns->tenant), .block_bytes = block_bytes};
  // A tenant's refusal counter is exported (at 0) from its first namespace on, not from its first refusal.
  if (namespaces_.Remember(a.ns.id, ns->tenant, ns->model)) metrics_.DeclareTenant(ns->tenant);
  a.tenant = ns->tenant;
  a.keys = std::move(keys).value();
  const NamespaceOptions* settings = options_.FindNamespace(ns->tenant, ns->model);
  a.shadow = settings != nullptr && settings->shadow;
  return a;
}

void BlockRequests::NotePinnedRefusals(const Admitted& a, uint32_t refused) {
  if (refused == 0) return;
  metrics_.CountPinnedRefusals(a.tenant, refused);
  KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                   "kvtier-server: tenant \"{}\" pins {} bytes of its {}-byte bound (leases.tenant_pinned_share); "
                   "{} present block(s) answered absent instead of leased",
                   a.tenant, store_.TenantPinnedBytes(a.ns.tenant_id), store_.TenantPinnedBound(a.ns.tenant_id),
                   refused);
}

absl::Status BlockRequests::Lookup(const Principal& who, const v1::LookupRequest& req, v1::LookupResponse* resp) {
  auto a = Admit(who, req.namespace_(), req.keys());
  if (!a.ok()) return a.status();
  // A shadow namespace is never served: no lease, every key answered absent, the would-be hits counted.
  auto r = store_.Lookup(a->ns, a->keys, a->shadow ? absl::ZeroDuration() : absl::Milliseconds(req.lease_ms()));
  NotePinnedRefusals(*a, r.refused_pinned);
  const uint64_t hits = static_cast<uint64_t>(std::count(r.present.begin(), r.present.end(), true));
  if (a->shadow) metrics_.CountShadowLookup(r.present.size(), hits);
  metrics_.groups().Record(req.group_key(), r.present.size(), hits, a->shadow);
  resp->mutable_present()->Reserve(static_cast<int>(r.present.size()));
  for (bool b : r.present) resp->add_present(b && !a->shadow);
  resp->set_lease_id(r.lease_id.ToWire());
  resp->set_lease_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(r.lease_ttl)));
  return absl::OkStatus();
}

BlockStore::ReadLease BlockRequests::LeaseAdmitted(const Admitted& a, uint32_t lease_ms, v1::ReadResponse* head) {
  if (a.shadow) {
    // Never served: every key absent, no lease taken, no access counted.
    metrics_.CountShadowRead(a.keys.size());
    for (size_t i = 0; i < a.keys.size(); ++i) head->add_blocks()->set_present(false);
    return {};
  }
  BlockStore::ReadLease lease = store_.AcquireRead(a.ns, a.keys, absl::Milliseconds(lease_ms));
  NotePinnedRefusals(a, lease.refused_pinned);
  head->set_lease_id(lease.lease_id.ToWire());
  for (const ReadBlockInfo& b : lease.blocks) {
    v1::BlockStatus* s = head->add_blocks();
    s->set_present(b.present);
    s->set_size_bytes(b.size_bytes);
    s->set_checksum(b.checksum);
  }
  return lease;
}

absl::Status BlockRequests::Lease(const Principal& who, const v1::ReadRequest& req, v1::ReadResponse* resp) {
  auto a = Admit(who, req.namespace_(), req.keys());
  if (!a.ok()) return a.status();
  LeaseAdmitted(*a, req.lease_ms(), resp);
  return absl::OkStatus();
}

absl::Status BlockRequests::Allocate(const Principal& who, const v1::AllocateRequest& req,
                                     const std::function<bool()>& cancelled, v1::AllocateResponse* resp) {
  auto a = Admit(who, req.namespace_(), req.keys());
  if (!a.ok()) return a.status();
  if (req.depths_size() != 0 && static_cast<size_t>(req.depths_size()) != a->keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat("depths: ", req.depths_size(), " for ", a->keys.size(), " keys"));
  }
  const std::vector<uint32_t> depths(req.depths().begin(), req.depths().end());
  if (req.block_meta_size() != 0 && static_cast<size_t>(req.block_meta_size()) != a->keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_meta: ", req.block_meta_size(), " for ", a->keys.size(), " keys"));
  }
  std::vector<BlockMeta> block_meta;
  block_meta.reserve(static_cast<size_t>(req.block_meta_size()));
  for (int i = 0; i < req.block_meta_size(); ++i) {
    auto m = wire::FromProto(req.block_meta(i), absl::StrCat("block_meta[", i, "]"));
    if (!m.ok()) return m.status();
    block_meta.push_back(*std::move(m));
  }
  if (cancelled()) return absl::CancelledError("caller gave up");
  auto r = store_.Allocate(a->ns, a->keys, depths, block_meta);
  if (!r.ok()) return r.status();
  if (cancelled() && !r->reservation_id.null()) {
    store_.Abort(r->reservation_id);
    return absl::CancelledError("caller gave up");
  }
  resp->set_reservation_id(r->reservation_id.ToWire());
  resp->set_block_bytes(a->ns.block_bytes);
  resp->set_reservation_ttl_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(r->ttl)));
  for (AllocateOutcome o : r->outcomes) {
    switch (o) {
      case AllocateOutcome::kAllocated:
        resp->add_results(v1::ALLOCATE_RESULT_ALLOCATED);
        break;
      case AllocateOutcome::kAlreadyPresent:
        resp->add_results(v1::ALLOCATE_RESULT_ALREADY_PRESENT);
        break;
      case AllocateOutcome::kInProgress:
        resp->add_results(v1::ALLOCATE_RESULT_IN_PROGRESS);
        break;
      case AllocateOutcome::kNoSpace:
        resp->add_results(v1::ALLOCATE_RESULT_NO_SPACE);
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status BlockRequests::Write(const Principal& who, const CapabilityId& reservation, uint32_t index,
                                  uint64_t offset, std::span<const std::byte> data) {
  return store_.Write(reservation, index, offset, data, HolderOf(who));
}

absl::Status BlockRequests::Commit(const Principal& who, const v1::CommitRequest& req, v1::CommitResponse* resp) {
  std::vector<uint64_t> sums(req.checksums().begin(), req.checksums().end());
  auto r = store_.Commit(CapabilityId::FromWire(req.reservation_id()), sums, HolderOf(who));
  if (!r.ok()) return r.status();
  for (CommitOutcome o : *r) {
    switch (o) {
      case CommitOutcome::kCommitted:
        resp->add_results(v1::COMMIT_RESULT_COMMITTED);
        break;
      case CommitOutcome::kChecksumMismatch:
        resp->add_results(v1::COMMIT_RESULT_CHECKSUM_MISMATCH);
        break;
      case CommitOutcome::kIncomplete:
        resp->add_results(v1::COMMIT_RESULT_INCOMPLETE);
        break;
      case CommitOutcome::kNotAllocated:
        resp->add_results(v1::COMMIT_RESULT_NOT_ALLOCATED);
        break;
    }
  }
  return absl::OkStatus();
}

void BlockRequests::Abort(const Principal& who, const CapabilityId& reservation) {
  store_.Abort(reservation, HolderOf(who));
}

uint32_t BlockRequests::Release(const Principal& who, std::span<const CapabilityId> leases) {
  return store_.Release(leases, HolderOf(who));
}

}  // namespace kvtier::server
