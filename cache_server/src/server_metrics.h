// Prometheus metrics of one server: RPC latency histograms (prometheus-cpp families), and every counter
// of the server's components (ForEachCounter: the block store, the disk tier, the UCX and gRPC
// transfers, refusals, shadow namespaces, KV events), read at scrape time.
#ifndef KVTIER_SERVER_SRC_SERVER_METRICS_H_
#define KVTIER_SERVER_SRC_SERVER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "group_stats.h"
#include "kvtier/common/counters.h"
#include "kvtier/server/block_store.h"

namespace kvtier::server {

class EventPublisher;

// Thread-safety: ObserveRpc may be called concurrently; Collect runs on the exposer's thread.
class ServerMetrics {
 public:
  ServerMetrics(const BlockStore& store, std::string node_id);

  // Records one RPC of `method` that ended with gRPC status `code` after `elapsed`.
  void ObserveRpc(const char* method, int code, absl::Duration elapsed);
  // Counts a request refused before it reached the store (INVALID_ARGUMENT).
  void CountInvalid() { invalid_requests_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t invalid_requests() const { return invalid_requests_.load(std::memory_order_relaxed); }
  // RPCs refused for want of a valid token (UNAUTHENTICATED) or for a token without the right
  // (PERMISSION_DENIED): kvtier_rejections_total{reason="unauthenticated"|"permission_denied"}.
  void CountAuthRejection() { auth_rejections_.fetch_add(1, std::memory_order_relaxed); }
  void CountPermissionRejection() { permission_rejections_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t auth_rejections() const { return auth_rejections_.load(std::memory_order_relaxed); }
  uint64_t permission_rejections() const { return permission_rejections_.load(std::memory_order_relaxed); }

  // Payload bytes actually moved, counted where they move (kvtier_transfer_bytes_total).
  enum class Direction : uint8_t { kRead = 0, kWrite = 1 };  // read: server -> client
  enum class Transport : uint8_t { kGrpc = 0, kUcx = 1 };
  void CountTransfer(Direction d, Transport t, uint64_t bytes) {
    transfer_bytes_[static_cast<int>(d)][static_cast<int>(t)].fetch_add(bytes, std::memory_order_relaxed);
  }
  uint64_t transfer_bytes(Direction d, Transport t) const {
    return transfer_bytes_[static_cast<int>(d)][static_cast<int>(t)].load(std::memory_order_relaxed);
  }
  // UCX transfers that failed (peer gone, timed out, lease or reservation expired), by direction.
  void CountTransferError(Direction d) {
    transfer_errors_[static_cast<int>(d)].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t transfer_errors(Direction d) const {
    return transfer_errors_[static_cast<int>(d)].load(std::memory_order_relaxed);
  }

  // UCX listener connections that never became a connection request (garbage or silence), reset by the
  // UCX server (PendingConnectionReaper): kvtier_ucx_pending_connections_reset_total{reason="timeout"|
  // "per_host_limit"}; and how many were pending at the last sweep (kvtier_ucx_pending_connections).
  void CountPendingConnectionResets(uint64_t timed_out, uint64_t over_limit) {
    pending_resets_timeout_.fetch_add(timed_out, std::memory_order_relaxed);
    pending_resets_limit_.fetch_add(over_limit, std::memory_order_relaxed);
  }
  void SetPendingConnections(uint64_t n) { pending_connections_.store(n, std::memory_order_relaxed); }
  uint64_t pending_resets_timeout() const { return pending_resets_timeout_.load(std::memory_order_relaxed); }
  uint64_t pending_resets_limit() const { return pending_resets_limit_.load(std::memory_order_relaxed); }
  uint64_t pending_connections() const { return pending_connections_.load(std::memory_order_relaxed); }

  // Shadow namespaces (docs/config.md): keys asked of Lookup, those present (answered absent: would-be
  // hits), and keys asked of Read (all answered absent). kvtier_shadow_lookup_blocks_total{result},
  // kvtier_shadow_read_blocks_total.
  void CountShadowLookup(uint64_t blocks, uint64_t would_hit_blocks) {
    shadow_lookup_blocks_.fetch_add(blocks, std::memory_order_relaxed);
    shadow_hit_blocks_.fetch_add(would_hit_blocks, std::memory_order_relaxed);
  }
  void CountShadowRead(uint64_t blocks) { shadow_read_blocks_.fetch_add(blocks, std::memory_order_relaxed); }
  uint64_t shadow_lookup_blocks() const { return shadow_lookup_blocks_.load(std::memory_order_relaxed); }
  uint64_t shadow_hit_blocks() const { return shadow_hit_blocks_.load(std::memory_order_relaxed); }
  uint64_t shadow_read_blocks() const { return shadow_read_blocks_.load(std::memory_order_relaxed); }

  // Present blocks answered absent to `tenant` because leasing them would take it past its pinned bound
  // (BlockStoreOptions::tenant_pinned_share): kvtier_lease_refusals_total{tenant, reason="pinned_bound"}.
  void CountPinnedRefusals(const std::string& tenant, uint64_t blocks);
  // Exports `tenant`'s per-tenant counters (at 0 until counted), so that a dashboard sees the series
  // before the first refusal. Idempotent; called for configured tenants and each newly seen namespace's.
  void DeclareTenant(const std::string& tenant) { CountPinnedRefusals(tenant, 0); }
  // The count so far for `tenant` (0 for a tenant never refused).
  uint64_t pinned_refusals(const std::string& tenant) const;
  std::vector<std::pair<std::string, uint64_t>> PinnedRefusalsSnapshot() const;  // (tenant, blocks)

  // Lookup statistics per similarity group (AdminService.ListGroups). Thread-safe.
  GroupStatsTable& groups() { return groups_; }
  const GroupStatsTable& groups() const { return groups_; }

  // The KV event publisher whose counters ForEachCounter lists too; null (the default): none. Set before
  // the servers start; `events` must outlive every ForEachCounter call (the exposer is reset and the
  // gRPC server shut down before it is destroyed).
  void SetEventPublisher(const EventPublisher* events) { events_ = events; }

  // Calls `visit` once per sample of every counter of this server, in a fixed order: the block store's
  // (BlockStoreStats::ForEach), each tier's capacity, the disk tier's status (with a disk tier), the
  // transfers, refusals, UCX pending connections, shadow namespaces, similarity groups and pinned
  // refusals by tenant counted here, and the KV event publisher's (when set). Samples of one family
  // share help and kind. /metrics (counters_collectable), GetStats (counters) and kvtierctl stats
  // iterate it, so a counter listed here appears in all of them.
  // Thread-safety: any thread (relaxed loads; the disk status and the refusal map take their locks).
  void ForEachCounter(const CounterVisitor& visit) const;

  // What the exposer serves: the registry (histograms, build info) and every counter of ForEachCounter,
  // grouped into families at scrape time.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  std::shared_ptr<prometheus::Collectable> counters_collectable() const { return counters_collectable_; }

 private:
  const BlockStore& store_;
  const EventPublisher* events_ = nullptr;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_;
  std::shared_ptr<prometheus::Collectable> counters_collectable_;
  std::atomic<uint64_t> invalid_requests_{0};
  std::atomic<uint64_t> auth_rejections_{0};
  std::atomic<uint64_t> permission_rejections_{0};
  std::atomic<uint64_t> transfer_bytes_[2][2] = {};  // [direction][transport]
  std::atomic<uint64_t> transfer_errors_[2] = {};    // [direction], UCX only
  std::atomic<uint64_t> pending_resets_timeout_{0};
  std::atomic<uint64_t> pending_resets_limit_{0};
  std::atomic<uint64_t> pending_connections_{0};
  std::atomic<uint64_t> shadow_lookup_blocks_{0};
  std::atomic<uint64_t> shadow_hit_blocks_{0};
  std::atomic<uint64_t> shadow_read_blocks_{0};
  GroupStatsTable groups_;
  mutable std::mutex refusals_mu_;
  absl::flat_hash_map<std::string, uint64_t> pinned_refusals_;  // guarded by refusals_mu_; tenant -> blocks
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_SERVER_METRICS_H_
