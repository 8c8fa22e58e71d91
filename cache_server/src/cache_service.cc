#include "cache_service.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvtier/common/counters.h"
#include "kvtier/common/log.h"
#include "kvtier/wire/wire.h"

namespace kvtier::server {

struct CacheServiceImpl::Parsed {
  NamespaceRef ns;
  std::string tenant;  // the namespace's tenant, for what the server logs and counts by name
  std::vector<BlockKey> keys;
  bool shadow = false;  // the namespace is in shadow mode (ServerOptions::namespaces)
};

CacheServiceImpl::CacheServiceImpl(const ServerOptions& options, BlockStore& store, ServerMetrics& metrics,
                                   NamespaceRegistry& namespaces, const Authenticator& auth)
    : options_(options), store_(store), metrics_(metrics), namespaces_(namespaces), auth_(auth) {}

absl::StatusOr<CacheServiceImpl::Parsed> CacheServiceImpl::Parse(const grpc::ServerContext& ctx,
                                                                 const v1::Namespace& pns, const v1::BlockKeys& pkeys) {
  Principal who;
  if (grpc::Status s = auth_.Authenticate(ctx, &who); !s.ok()) return wire::FromGrpc(s);
  return ParseFor(who, pns, pkeys);
}

absl::StatusOr<CacheServiceImpl::Parsed> CacheServiceImpl::ParseFor(const Principal& who, const v1::Namespace& pns,
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
  Parsed p;
  p.ns = NamespaceRef{.id = ns->Id(), .tenant_id = TenantId(ns->tenant), .block_bytes = block_bytes};
  namespaces_.Remember(p.ns.id, ns->tenant, ns->model);
  p.tenant = ns->tenant;
  p.keys = std::move(keys).value();
  const NamespaceOptions* settings = options_.FindNamespace(ns->tenant, ns->model);
  p.shadow = settings != nullptr && settings->shadow;
  return p;
}

grpc::Status CacheServiceImpl::AuthenticateHolder(const grpc::ServerContext& ctx, IdHolder* holder) const {
  Principal who;
  if (grpc::Status s = auth_.Authenticate(ctx, &who); !s.ok()) return s;
  *holder = who.admin() ? kAnyTenant : IdHolder(who.tenant_id);
  return grpc::Status::OK;
}

void CacheServiceImpl::NotePinnedRefusals(const Parsed& p, uint32_t refused) {
  if (refused == 0) return;
  metrics_.CountPinnedRefusals(p.tenant, refused);
  KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                   "kvtier-server: tenant \"{}\" pins {} bytes of its {}-byte bound (leases.tenant_pinned_share); "
                   "{} present block(s) answered absent instead of leased",
                   p.tenant, store_.TenantPinnedBytes(p.ns.tenant_id), store_.TenantPinnedBound(p.ns.tenant_id),
                   refused);
}

grpc::Status CacheServiceImpl::Finish(const char* method, absl::Time start, const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) metrics_.CountInvalid();
  metrics_.ObserveRpc(method, status.error_code(), absl::Now() - start);
  return status;
}

grpc::Status CacheServiceImpl::Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req,
                                      v1::LookupResponse* resp) {
  const absl::Time start = absl::Now();
  auto p = Parse(*ctx, req->namespace_(), req->keys());
  if (!p.ok()) return Finish("Lookup", start, wire::ToGrpc(p.status()));
  // A shadow namespace is never served: no lease, every key answered absent, the would-be hits counted.
  auto r = store_.Lookup(p->ns, p->keys, p->shadow ? absl::ZeroDuration() : absl::Milliseconds(req->lease_ms()));
  NotePinnedRefusals(*p, r.refused_pinned);
  const uint64_t hits = static_cast<uint64_t>(std::count(r.present.begin(), r.present.end(), true));
  if (p->shadow) metrics_.CountShadowLookup(r.present.size(), hits);
  metrics_.groups().Record(req->group_key(), r.present.size(), hits, p->shadow);
  resp->mutable_present()->Reserve(static_cast<int>(r.present.size()));
  for (bool b : r.present) resp->add_present(b && !p->shadow);
  resp->set_lease_id(r.lease_id.ToWire());
  resp->set_lease_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(r.lease_ttl)));
  return Finish("Lookup", start, grpc::Status::OK);
}

grpc::Status CacheServiceImpl::Allocate(grpc::ServerContext* ctx, const v1::AllocateRequest* req,
                                        v1::AllocateResponse* resp) {
  const absl::Time start = absl::Now();
  auto p = Parse(*ctx, req->namespace_(), req->keys());
  if (!p.ok()) return Finish("Allocate", start, wire::ToGrpc(p.status()));
  // A caller that has given up (deadline passed while the request waited, e.g. in a stopped process)
  // will never write or commit: reserving for it would hold slots until reservation_ttl.
  const absl::Status s = AllocateParsed(
      *p, *req, [ctx] { return ctx->IsCancelled(); }, resp);
  return Finish("Allocate", start, wire::ToGrpc(s));
}

absl::Status CacheServiceImpl::AllocateAs(const Principal& who, const v1::AllocateRequest& req,
                                          v1::AllocateResponse* resp) {
  const absl::Time start = absl::Now();
  auto p = ParseFor(who, req.namespace_(), req.keys());
  const absl::Status s = p.ok() ? AllocateParsed(
                                      *p, req, [] { return false; }, resp)
                                : p.status();
  Finish("Allocate", start, wire::ToGrpc(s));
  return s;
}

absl::Status CacheServiceImpl::AllocateParsed(const Parsed& p, const v1::AllocateRequest& req,
                                              const std::function<bool()>& cancelled, v1::AllocateResponse* resp) {
  if (req.depths_size() != 0 && static_cast<size_t>(req.depths_size()) != p.keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat("depths: ", req.depths_size(), " for ", p.keys.size(), " keys"));
  }
  const std::vector<uint32_t> depths(req.depths().begin(), req.depths().end());
  if (req.block_meta_size() != 0 && static_cast<size_t>(req.block_meta_size()) != p.keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_meta: ", req.block_meta_size(), " for ", p.keys.size(), " keys"));
  }
  std::vector<BlockMeta> block_meta;
  block_meta.reserve(static_cast<size_t>(req.block_meta_size()));
  for (int i = 0; i < req.block_meta_size(); ++i) {
    auto m = wire::FromProto(req.block_meta(i), absl::StrCat("block_meta[", i, "]"));
    if (!m.ok()) return m.status();
    block_meta.push_back(*std::move(m));
  }
  if (cancelled()) return absl::CancelledError("caller gave up");
  auto r = store_.Allocate(p.ns, p.keys, depths, block_meta);
  if (!r.ok()) return r.status();
  if (cancelled() && !r->reservation_id.null()) {
    store_.Abort(r->reservation_id);
    return absl::CancelledError("caller gave up");
  }
  resp->set_reservation_id(r->reservation_id.ToWire());
  resp->set_block_bytes(p.ns.block_bytes);
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

grpc::Status CacheServiceImpl::WriteBlocks(grpc::ServerContext* ctx, grpc::ServerReader<v1::WriteBlocksRequest>* reader,
                                           v1::WriteBlocksResponse* resp) {
  const absl::Time start = absl::Now();
  IdHolder holder;
  if (grpc::Status s = AuthenticateHolder(*ctx, &holder); !s.ok()) return Finish("WriteBlocks", start, s);
  v1::WriteBlocksRequest chunk;
  uint64_t written = 0;
  while (reader->Read(&chunk)) {
    const std::string& data = chunk.data();
    absl::Status s =
        store_.Write(CapabilityId::FromWire(chunk.reservation_id()), chunk.index(), chunk.offset(),
                     std::span<const std::byte>(reinterpret_cast<const std::byte*>(data.data()), data.size()), holder);
    if (!s.ok()) {
      metrics_.CountTransfer(ServerMetrics::Direction::kWrite, ServerMetrics::Transport::kGrpc, written);
      return Finish("WriteBlocks", start, wire::ToGrpc(s));
    }
    written += data.size();
  }
  metrics_.CountTransfer(ServerMetrics::Direction::kWrite, ServerMetrics::Transport::kGrpc, written);
  resp->set_bytes_written(written);
  return Finish("WriteBlocks", start, grpc::Status::OK);
}

grpc::Status CacheServiceImpl::Commit(grpc::ServerContext* ctx, const v1::CommitRequest* req,
                                      v1::CommitResponse* resp) {
  const absl::Time start = absl::Now();
  IdHolder holder;
  if (grpc::Status s = AuthenticateHolder(*ctx, &holder); !s.ok()) return Finish("Commit", start, s);
  return Finish("Commit", start, wire::ToGrpc(CommitFor(holder, *req, resp)));
}

absl::Status CacheServiceImpl::CommitAs(const Principal& who, const v1::CommitRequest& req, v1::CommitResponse* resp) {
  const absl::Time start = absl::Now();
  const absl::Status s = CommitFor(who.admin() ? kAnyTenant : IdHolder(who.tenant_id), req, resp);
  Finish("Commit", start, wire::ToGrpc(s));
  return s;
}

absl::Status CacheServiceImpl::CommitFor(IdHolder holder, const v1::CommitRequest& req, v1::CommitResponse* resp) {
  std::vector<uint64_t> sums(req.checksums().begin(), req.checksums().end());
  auto r = store_.Commit(CapabilityId::FromWire(req.reservation_id()), sums, holder);
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

grpc::Status CacheServiceImpl::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req, v1::AbortResponse*) {
  const absl::Time start = absl::Now();
  IdHolder holder;
  if (grpc::Status s = AuthenticateHolder(*ctx, &holder); !s.ok()) return Finish("Abort", start, s);
  store_.Abort(CapabilityId::FromWire(req->reservation_id()), holder);  // unknown and foreign ids alike: OK
  return Finish("Abort", start, grpc::Status::OK);
}

grpc::Status CacheServiceImpl::Read(grpc::ServerContext* ctx, const v1::ReadRequest* req,
                                    grpc::ServerWriter<v1::ReadResponse>* writer) {
  const absl::Time start = absl::Now();
  auto p = Parse(*ctx, req->namespace_(), req->keys());
  if (!p.ok()) return Finish("Read", start, wire::ToGrpc(p.status()));
  if (p->shadow) {
    // Never served: every key absent, no lease taken, no access counted.
    metrics_.CountShadowRead(p->keys.size());
    v1::ReadResponse head;
    for (size_t i = 0; i < p->keys.size(); ++i) head.add_blocks()->set_present(false);
    const bool sent = writer->Write(head);
    return Finish("Read", start,
                  sent ? grpc::Status::OK : grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
  }
  BlockStore::ReadLease lease = store_.AcquireRead(p->ns, p->keys, absl::Milliseconds(req->lease_ms()));
  NotePinnedRefusals(*p, lease.refused_pinned);
  v1::ReadResponse head;
  head.set_lease_id(lease.lease_id.ToWire());
  for (const ReadBlockInfo& b : lease.blocks) {
    v1::BlockStatus* s = head.add_blocks();
    s->set_present(b.present);
    s->set_size_bytes(b.size_bytes);
    s->set_checksum(b.checksum);
  }
  grpc::Status status = grpc::Status::OK;
  if (req->status_only()) {
    // The bytes go over UCX; the lease stays until Release, the UCX request's release, or expiry.
    if (!writer->Write(head) && !lease.lease_id.null()) {
      store_.Release(std::span<const CapabilityId>(&lease.lease_id, 1));
      status = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    return Finish("Read", start, status);
  }
  if (!writer->Write(head)) status = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  v1::ReadResponse chunk;
  uint64_t sent = 0;
  for (size_t i = 0; status.ok() && i < lease.blocks.size(); ++i) {
    const ReadBlockInfo& b = lease.blocks[i];
    if (!b.present) continue;
    for (uint64_t off = 0; off < b.size_bytes && status.ok(); off += options_.stream_chunk_bytes) {
      if (ctx->IsCancelled()) {
        status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
        break;
      }
      const uint64_t n = std::min<uint64_t>(options_.stream_chunk_bytes, b.size_bytes - off);
      chunk.set_index(static_cast<uint32_t>(i));
      chunk.set_offset(off);
      std::string* data = chunk.mutable_data();
      data->resize(n);
      absl::Status s = store_.CopyOut(lease.lease_id, static_cast<uint32_t>(i), off,
                                      std::span<std::byte>(reinterpret_cast<std::byte*>(data->data()), n));
      if (!s.ok()) {
        // The lease expired under a slow reader: abort so the client counts these blocks as misses.
        status = grpc::Status(grpc::StatusCode::ABORTED, std::string(s.message()));
        break;
      }
      if (!writer->Write(chunk)) {
        status = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      } else {
        sent += n;
      }
    }
  }
  metrics_.CountTransfer(ServerMetrics::Direction::kRead, ServerMetrics::Transport::kGrpc, sent);
  if (!req->hold_lease() && !lease.lease_id.null()) store_.Release(std::span<const CapabilityId>(&lease.lease_id, 1));
  return Finish("Read", start, status);
}

void CacheServiceImpl::LeaseParsed(const Parsed& p, uint32_t lease_ms, v1::ReadResponse* resp) {
  if (p.shadow) {
    // Never served: every key absent, no lease taken, no access counted.
    metrics_.CountShadowRead(p.keys.size());
    for (size_t i = 0; i < p.keys.size(); ++i) resp->add_blocks()->set_present(false);
    return;
  }
  BlockStore::ReadLease lease = store_.AcquireRead(p.ns, p.keys, absl::Milliseconds(lease_ms));
  NotePinnedRefusals(p, lease.refused_pinned);
  resp->set_lease_id(lease.lease_id.ToWire());
  for (const ReadBlockInfo& b : lease.blocks) {
    v1::BlockStatus* s = resp->add_blocks();
    s->set_present(b.present);
    s->set_size_bytes(b.size_bytes);
    s->set_checksum(b.checksum);
  }
}

grpc::Status CacheServiceImpl::Lease(grpc::ServerContext* ctx, const v1::ReadRequest* req, v1::ReadResponse* resp) {
  const absl::Time start = absl::Now();
  auto p = Parse(*ctx, req->namespace_(), req->keys());
  if (!p.ok()) return Finish("Lease", start, wire::ToGrpc(p.status()));
  LeaseParsed(*p, req->lease_ms(), resp);
  if (ctx->IsCancelled() && !resp->lease_id().empty()) {  // nobody will use or release it
    const CapabilityId id = CapabilityId::FromWire(resp->lease_id());
    store_.Release(std::span<const CapabilityId>(&id, 1));
    return Finish("Lease", start, grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
  }
  return Finish("Lease", start, grpc::Status::OK);
}

absl::Status CacheServiceImpl::LeaseAs(const Principal& who, const v1::ReadRequest& req, v1::ReadResponse* resp) {
  const absl::Time start = absl::Now();
  auto p = ParseFor(who, req.namespace_(), req.keys());
  if (!p.ok()) {
    Finish("Lease", start, wire::ToGrpc(p.status()));
    return p.status();
  }
  LeaseParsed(*p, req.lease_ms(), resp);
  Finish("Lease", start, grpc::Status::OK);
  return absl::OkStatus();
}

grpc::Status CacheServiceImpl::OpenUcxSession(grpc::ServerContext* ctx, const v1::OpenUcxSessionRequest*,
                                              v1::OpenUcxSessionResponse* resp) {
  const absl::Time start = absl::Now();
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return Finish("OpenUcxSession", start, s);
  if (ucx_sessions_ == nullptr) {
    return Finish("OpenUcxSession", start,
                  grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this server has no UCX listener"));
  }
  auto ticket = ucx_sessions_->Open(who);
  if (!ticket.ok()) return Finish("OpenUcxSession", start, wire::ToGrpc(ticket.status()));
  resp->set_ticket(*std::move(ticket));
  resp->set_ttl_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(ucx_sessions_->ttl())));
  resp->set_required(ucx_sessions_->required());
  return Finish("OpenUcxSession", start, grpc::Status::OK);
}

grpc::Status CacheServiceImpl::Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                                       v1::ReleaseResponse* resp) {
  const absl::Time start = absl::Now();
  IdHolder holder;
  if (grpc::Status s = AuthenticateHolder(*ctx, &holder); !s.ok()) return Finish("Release", start, s);
  std::vector<CapabilityId> ids;
  ids.reserve(req->lease_ids_size());
  for (const std::string& id : req->lease_ids()) ids.push_back(CapabilityId::FromWire(id));
  // Unknown, ended and other tenants' leases are skipped alike (and not counted).
  resp->set_released(store_.Release(ids, holder));
  return Finish("Release", start, grpc::Status::OK);
}

AdminServiceImpl::AdminServiceImpl(const ServerOptions& options, BlockStore& store, const ServerMetrics& metrics,
                                   const NamespaceRegistry& namespaces, const Authenticator& auth)
    : options_(options), store_(store), metrics_(metrics), namespaces_(namespaces), auth_(auth) {}

absl::StatusOr<BlockStore::BlockFilter> AdminServiceImpl::ParseFilter(const v1::BlockFilter& f) const {
  BlockStore::BlockFilter filter;
  if (!f.tenant().empty()) filter.tenant_id = TenantId(f.tenant());
  if (f.namespace_id() != 0) filter.namespace_id = f.namespace_id();
  if (f.tier() == "host") {
    filter.tier = Tier::kHost;
  } else if (f.tier() == "disk") {
    filter.tier = Tier::kDisk;
  } else if (f.tier() == "hbm") {
    filter.tier = Tier::kHbm;
  } else if (!f.tier().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("filter.tier: \"", f.tier(), "\" is not hbm, host or disk"));
  }
  return filter;
}

void AdminServiceImpl::FillRecord(const BlockStore::BlockInfo& b, v1::BlockRecord* out) const {
  out->set_fingerprint(std::string(reinterpret_cast<const char*>(b.key.fingerprint.bytes.data()), 32));
  out->set_shard(b.key.shard);
  out->set_namespace_id(b.namespace_id);
  if (auto names = namespaces_.Find(b.namespace_id)) {
    out->set_tenant(names->first);
    out->set_model(names->second);
  }
  out->set_tier(TierName(b.tier));
  out->set_size_bytes(b.size_bytes);
  out->set_checksum(b.checksum);
  out->set_depth(b.depth);
  out->set_access_count(b.access_count);
  out->set_lease_count(b.lease_count);
  const absl::Time now = absl::Now();
  out->set_age_ms(absl::ToInt64Milliseconds(now - b.inserted));
  out->set_idle_ms(absl::ToInt64Milliseconds(now - b.last_access));
}

grpc::Status AdminServiceImpl::ListBlocks(grpc::ServerContext* ctx, const v1::ListBlocksRequest* req,
                                          v1::ListBlocksResponse* resp) {
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return s;
  auto filter = ParseFilter(req->filter());
  if (!filter.ok()) return wire::ToGrpc(filter.status());
  const size_t limit = req->limit() == 0 ? 100 : std::min<uint32_t>(req->limit(), 10000);
  auto [blocks, next] = store_.ListBlocks(*filter, req->cursor(), limit);
  for (const auto& b : blocks) FillRecord(b, resp->add_blocks());
  resp->set_next_cursor(next);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::InspectBlock(grpc::ServerContext* ctx, const v1::InspectBlockRequest* req,
                                            v1::InspectBlockResponse* resp) {
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return s;
  if (req->fingerprint().size() != 32) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("fingerprint is ", req->fingerprint().size(), " bytes, want 32"));
  }
  BlockKey key;
  std::memcpy(key.fingerprint.bytes.data(), req->fingerprint().data(), 32);
  key.shard = req->shard();
  if (auto info = store_.Inspect(key)) {
    resp->set_found(true);
    FillRecord(*info, resp->mutable_block());
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req, v1::EvictResponse* resp) {
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return s;
  if (!req->fingerprint().empty()) {
    if (req->fingerprint().size() != 32) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "fingerprint must be 32 bytes");
    }
    BlockKey key;
    std::memcpy(key.fingerprint.bytes.data(), req->fingerprint().data(), 32);
    key.shard = req->shard();
    const bool dropped = store_.EvictKey(key);
    resp->set_evicted(dropped ? 1 : 0);
    if (!dropped && store_.Inspect(key).has_value()) resp->set_skipped_leased(1);
    return grpc::Status::OK;
  }
  auto filter = ParseFilter(req->filter());
  if (!filter.ok()) return wire::ToGrpc(filter.status());
  if (!filter->tenant_id && !filter->namespace_id && !filter->tier && !req->all()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "an empty filter would evict everything: set all=true to mean it");
  }
  auto [evicted, leased] = store_.Evict(*filter);
  resp->set_evicted(evicted);
  resp->set_skipped_leased(leased);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Verify(grpc::ServerContext* ctx, const v1::VerifyRequest*,
                                      grpc::ServerWriter<v1::VerifyProgress>* writer) {
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return s;
  auto result = store_.Verify([&](uint64_t done, uint64_t total) {
    if (ctx->IsCancelled()) return;
    v1::VerifyProgress p;
    p.set_checked(done);
    p.set_total(total);
    writer->Write(p);
  });
  v1::VerifyProgress last;
  last.set_checked(result.checked);
  last.set_total(result.checked);
  last.set_corrupt(result.corrupt);
  last.set_done(true);
  for (const BlockKey& k : result.corrupt_keys) {
    last.add_corrupt_fingerprints(std::string(reinterpret_cast<const char*>(k.fingerprint.bytes.data()), 32));
  }
  writer->Write(last);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::SetDraining(grpc::ServerContext* ctx, const v1::SetDrainingRequest* req,
                                           v1::SetDrainingResponse* resp) {
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return s;
  store_.SetDraining(req->draining());
  resp->set_draining(store_.draining());
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::GetInfo(grpc::ServerContext* ctx, const v1::GetInfoRequest*, v1::GetInfoResponse* resp) {
  if (grpc::Status s = auth_.AuthorizeAny(*ctx); !s.ok()) return s;
  resp->set_node_id(options_.node_id);
  resp->set_version(KVTIER_VERSION);
  const int ucx_port = ucx_port_.load(std::memory_order_acquire);
  resp->set_transport(ucx_port > 0 ? "ucx+grpc" : "grpc");
  if (ucx_port > 0) {
    resp->set_ucx_port(static_cast<uint32_t>(ucx_port));
    const std::string& a = options_.ucx_listen_address;
    resp->set_ucx_address(absl::StrCat(a.substr(0, a.rfind(':')), ":", ucx_port));
  }
  resp->set_http_port(static_cast<uint32_t>(std::max(0, http_port_.load(std::memory_order_acquire))));
  if (store_.has_hbm_tier()) {
    v1::TierInfo* hbm = resp->add_tiers();
    hbm->set_tier("hbm");
    hbm->set_capacity_bytes(store_.hbm_capacity_bytes());
    hbm->set_used_bytes(store_.stats().hbm_bytes.load(std::memory_order_relaxed));
    hbm->set_blocks(store_.stats().hbm_blocks.load(std::memory_order_relaxed));
  }
  v1::TierInfo* host = resp->add_tiers();
  host->set_tier("host");
  host->set_capacity_bytes(store_.capacity_bytes());
  host->set_used_bytes(store_.stats().stored_bytes.load(std::memory_order_relaxed));
  host->set_blocks(store_.stats().stored_blocks.load(std::memory_order_relaxed));
  if (store_.has_disk_tier()) {
    v1::TierInfo* disk = resp->add_tiers();
    disk->set_tier("disk");
    disk->set_capacity_bytes(store_.disk_capacity_bytes());
    disk->set_used_bytes(store_.stats().disk_bytes.load(std::memory_order_relaxed));
    disk->set_blocks(store_.stats().disk_blocks.load(std::memory_order_relaxed));
    const DiskTierStatus st = store_.disk_status();
    disk->set_state(st.state);
    disk->set_state_reason(st.reason);
    disk->set_volume_free_bytes(st.free_bytes);
    disk->set_min_free_bytes(st.min_free_bytes);
    disk->set_database_bytes(st.database_bytes);
  }
  resp->set_uptime_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(absl::Now() - start_)));
  resp->set_eviction_policy(store_.eviction_policy_name());
  resp->set_max_block_bytes(options_.max_block_bytes);
  resp->set_max_blocks_per_request(options_.max_blocks_per_request);
  resp->set_draining(store_.draining());
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest*,
                                        v1::GetStatsResponse* resp) {
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return s;
  const BlockStoreStats& s = store_.stats();
  auto v = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  resp->set_node_id(options_.node_id);
  resp->set_lookup_requests(v(s.lookup_requests));
  resp->set_lookup_blocks_hit(v(s.lookup_blocks_hit));
  resp->set_lookup_blocks_miss(v(s.lookup_blocks_miss));
  resp->set_read_blocks(v(s.read_blocks));
  resp->set_read_bytes(v(s.read_bytes));
  resp->set_read_blocks_miss(v(s.read_blocks_miss));
  resp->set_committed_blocks(v(s.committed_blocks));
  resp->set_committed_bytes(v(s.committed_bytes));
  resp->set_already_present(v(s.already_present));
  resp->set_evictions(v(s.evictions));
  resp->set_rejections_no_space(v(s.rejections_no_space));
  resp->set_rejections_invalid(metrics_.invalid_requests());
  resp->set_checksum_failures(v(s.checksum_failures));
  resp->set_expired_reservations(v(s.expired_reservations));
  resp->set_expired_leases(v(s.expired_leases));
  resp->set_active_leases(v(s.active_leases));
  resp->set_active_reservations(v(s.active_reservations));
  resp->set_stored_blocks(v(s.stored_blocks));
  resp->set_stored_bytes(v(s.stored_bytes));
  resp->set_capacity_bytes(store_.capacity_bytes());
  resp->set_disk_blocks(v(s.disk_blocks));
  resp->set_disk_bytes(v(s.disk_bytes));
  resp->set_disk_capacity_bytes(store_.disk_capacity_bytes());
  resp->set_demotions(v(s.demotions));
  resp->set_promotions(v(s.promotions));
  resp->set_disk_evictions(v(s.disk_evictions));
  resp->set_disk_checksum_failures(v(s.disk_checksum_failures));
  resp->set_disk_errors(v(s.disk_errors));
  resp->set_recovered_blocks(v(s.recovered_blocks));
  resp->set_slab_moves(v(s.slab_moves));
  if (store_.has_disk_tier()) {
    const DiskTierStatus st = store_.disk_status();
    resp->set_disk_state(st.state);
    resp->set_disk_state_reason(st.reason);
    resp->set_disk_spill_refused(v(s.disk_spill_refused));
    resp->set_disk_write_errors(st.write_errors);
    resp->set_disk_read_errors(st.read_errors);
    resp->set_disk_delete_errors(st.delete_errors);
    resp->set_disk_open_errors(st.open_errors);
    resp->set_disk_database_bytes(st.database_bytes);
    resp->set_disk_background_errors(st.background_errors);
  }
  using D = ServerMetrics::Direction;
  using T = ServerMetrics::Transport;
  resp->set_grpc_read_bytes(metrics_.transfer_bytes(D::kRead, T::kGrpc));
  resp->set_grpc_write_bytes(metrics_.transfer_bytes(D::kWrite, T::kGrpc));
  resp->set_ucx_read_bytes(metrics_.transfer_bytes(D::kRead, T::kUcx));
  resp->set_ucx_write_bytes(metrics_.transfer_bytes(D::kWrite, T::kUcx));
  resp->set_ucx_read_errors(metrics_.transfer_errors(D::kRead));
  resp->set_ucx_write_errors(metrics_.transfer_errors(D::kWrite));
  resp->set_shadow_hit_blocks(metrics_.shadow_hit_blocks());
  resp->set_shadow_lookup_blocks(metrics_.shadow_lookup_blocks());
  resp->set_shadow_read_blocks(metrics_.shadow_read_blocks());
  metrics_.ForEachCounter([resp](const CounterInfo& info, uint64_t value) {
    v1::CounterSample* c = resp->add_counters();
    c->set_name(SampleName(info));
    c->set_value(value);
    c->set_kind(info.kind == CounterKind::kGauge ? v1::CounterSample::GAUGE : v1::CounterSample::COUNTER);
  });
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::ListGroups(grpc::ServerContext* ctx, const v1::ListGroupsRequest* req,
                                          v1::ListGroupsResponse* resp) {
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return s;
  resp->set_node_id(options_.node_id);
  resp->set_capacity(static_cast<uint32_t>(metrics_.groups().capacity()));
  resp->set_untracked_lookups(metrics_.groups().untracked_lookups());
  for (const GroupCounters& g : metrics_.groups().Top(req->limit())) {
    v1::GroupStats* out = resp->add_groups();
    out->set_group_key(g.group_key);
    out->set_lookups(g.lookups);
    out->set_blocks(g.blocks);
    out->set_hit_blocks(g.hit_blocks);
    out->set_shadow_blocks(g.shadow_blocks);
    out->set_shadow_hit_blocks(g.shadow_hit_blocks);
    out->set_error_blocks(g.error_blocks);
  }
  return grpc::Status::OK;
}

}  // namespace kvtier::server
