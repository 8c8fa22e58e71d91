#include "admin_service.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvtier/common/counters.h"
#include "kvtier/wire/wire.h"
#include "rpc_scope.h"

namespace kvtier::server {

AdminServiceImpl::AdminServiceImpl(const ServerOptions& options, BlockStore& store, ServerMetrics& metrics,
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
  RpcScope rpc(metrics_, "ListBlocks");
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return rpc.Return(s);
  auto filter = ParseFilter(req->filter());
  if (!filter.ok()) return rpc.Return(wire::ToGrpc(filter.status()));
  const size_t limit = req->limit() == 0 ? 100 : std::min<uint32_t>(req->limit(), 10000);
  auto [blocks, next] = store_.ListBlocks(*filter, req->cursor(), limit);
  for (const auto& b : blocks) FillRecord(b, resp->add_blocks());
  resp->set_next_cursor(next);
  return rpc.Return(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::InspectBlock(grpc::ServerContext* ctx, const v1::InspectBlockRequest* req,
                                            v1::InspectBlockResponse* resp) {
  RpcScope rpc(metrics_, "InspectBlock");
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return rpc.Return(s);
  if (req->fingerprint().size() != 32) {
    return rpc.Return(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   absl::StrCat("fingerprint is ", req->fingerprint().size(), " bytes, want 32")));
  }
  BlockKey key;
  std::memcpy(key.fingerprint.bytes.data(), req->fingerprint().data(), 32);
  key.shard = req->shard();
  if (auto info = store_.Inspect(key)) {
    resp->set_found(true);
    FillRecord(*info, resp->mutable_block());
  }
  return rpc.Return(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req, v1::EvictResponse* resp) {
  RpcScope rpc(metrics_, "Evict");
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return rpc.Return(s);
  if (!req->fingerprint().empty()) {
    if (req->fingerprint().size() != 32) {
      return rpc.Return(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "fingerprint must be 32 bytes"));
    }
    BlockKey key;
    std::memcpy(key.fingerprint.bytes.data(), req->fingerprint().data(), 32);
    key.shard = req->shard();
    const bool dropped = store_.EvictKey(key);
    resp->set_evicted(dropped ? 1 : 0);
    if (!dropped && store_.Inspect(key).has_value()) resp->set_skipped_leased(1);
    return rpc.Return(grpc::Status::OK);
  }
  auto filter = ParseFilter(req->filter());
  if (!filter.ok()) return rpc.Return(wire::ToGrpc(filter.status()));
  if (!filter->tenant_id && !filter->namespace_id && !filter->tier && !req->all()) {
    return rpc.Return(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "an empty filter would evict everything: set all=true to mean it"));
  }
  auto [evicted, leased] = store_.Evict(*filter);
  resp->set_evicted(evicted);
  resp->set_skipped_leased(leased);
  return rpc.Return(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::Verify(grpc::ServerContext* ctx, const v1::VerifyRequest*,
                                      grpc::ServerWriter<v1::VerifyProgress>* writer) {
  RpcScope rpc(metrics_, "Verify");
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return rpc.Return(s);
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
  return rpc.Return(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::SetDraining(grpc::ServerContext* ctx, const v1::SetDrainingRequest* req,
                                           v1::SetDrainingResponse* resp) {
  RpcScope rpc(metrics_, "SetDraining");
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return rpc.Return(s);
  store_.SetDraining(req->draining());
  resp->set_draining(store_.draining());
  return rpc.Return(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::GetInfo(grpc::ServerContext* ctx, const v1::GetInfoRequest*, v1::GetInfoResponse* resp) {
  RpcScope rpc(metrics_, "GetInfo");
  if (grpc::Status s = auth_.AuthorizeAny(*ctx); !s.ok()) return rpc.Return(s);
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
  resp->set_nccl(nccl_.load(std::memory_order_acquire));
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
  return rpc.Return(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest*,
                                        v1::GetStatsResponse* resp) {
  RpcScope rpc(metrics_, "GetStats");
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return rpc.Return(s);
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
  return rpc.Return(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::ListGroups(grpc::ServerContext* ctx, const v1::ListGroupsRequest* req,
                                          v1::ListGroupsResponse* resp) {
  RpcScope rpc(metrics_, "ListGroups");
  if (grpc::Status s = auth_.AuthorizeAdmin(*ctx); !s.ok()) return rpc.Return(s);
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
  return rpc.Return(grpc::Status::OK);
}

}  // namespace kvtier::server
