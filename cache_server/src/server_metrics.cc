#include "server_metrics.h"

#include <prometheus/metric_family.h>

#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace kvtier::server {
namespace {

const char* CodeName(int code) {
  static const char* kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void Add(prometheus::MetricFamily& f, double value, std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f.type == prometheus::MetricType::Counter)
    m.counter.value = value;
  else
    m.gauge.value = value;
  f.metric.push_back(std::move(m));
}

// Reads the store's atomics when scraped, so the hot path pays nothing for metrics.
class StoreCollectable final : public prometheus::Collectable {
 public:
  StoreCollectable(const BlockStore& store, const ServerMetrics& metrics) : store_(store), metrics_(metrics) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    const BlockStoreStats& s = store_.stats();
    auto v = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
    std::vector<prometheus::MetricFamily> out;

    auto lookups =
        Family("kvtier_lookup_blocks_total", "Blocks asked of existence queries, by result.", MetricType::Counter);
    Add(lookups, v(s.lookup_blocks_hit), {{"result", "hit"}});
    Add(lookups, v(s.lookup_blocks_miss), {{"result", "miss"}});
    out.push_back(std::move(lookups));

    auto lookup_requests = Family("kvtier_lookup_requests_total", "Existence queries served.", MetricType::Counter);
    Add(lookup_requests, v(s.lookup_requests));
    out.push_back(std::move(lookup_requests));

    auto read_blocks = Family("kvtier_read_blocks_total", "Blocks asked of reads, by result.", MetricType::Counter);
    Add(read_blocks, v(s.read_blocks), {{"result", "hit"}});
    Add(read_blocks, v(s.read_blocks_miss), {{"result", "miss"}});
    out.push_back(std::move(read_blocks));

    auto transfer =
        Family("kvtier_transfer_bytes_total", "Payload bytes moved, by direction and transport.", MetricType::Counter);
    using D = ServerMetrics::Direction;
    using T = ServerMetrics::Transport;
    auto m = [&](D d, T t) { return static_cast<double>(metrics_.transfer_bytes(d, t)); };
    Add(transfer, m(D::kRead, T::kGrpc), {{"direction", "read"}, {"transport", "grpc"}});
    Add(transfer, m(D::kWrite, T::kGrpc), {{"direction", "write"}, {"transport", "grpc"}});
    Add(transfer, m(D::kRead, T::kUcx), {{"direction", "read"}, {"transport", "ucx"}});
    Add(transfer, m(D::kWrite, T::kUcx), {{"direction", "write"}, {"transport", "ucx"}});
    out.push_back(std::move(transfer));

    auto transfer_errors = Family("kvtier_transfer_errors_total",
                                  "UCX block transfers that failed (peer gone, timed out, lease or reservation "
                                  "expired), by direction.",
                                  MetricType::Counter);
    Add(transfer_errors, static_cast<double>(metrics_.transfer_errors(D::kRead)), {{"direction", "read"}});
    Add(transfer_errors, static_cast<double>(metrics_.transfer_errors(D::kWrite)), {{"direction", "write"}});
    out.push_back(std::move(transfer_errors));

    auto pending_resets = Family("kvtier_ucx_pending_connections_reset_total",
                                 "Connections to the UCX port that never became a connection request (garbage "
                                 "or silence), reset for their age or beyond the per-host limit.",
                                 MetricType::Counter);
    Add(pending_resets, static_cast<double>(metrics_.pending_resets_timeout()), {{"reason", "timeout"}});
    Add(pending_resets, static_cast<double>(metrics_.pending_resets_limit()), {{"reason", "per_host_limit"}});
    out.push_back(std::move(pending_resets));
    auto pending =
        Family("kvtier_ucx_pending_connections",
               "Connections to the UCX port not yet a connection request, at the last sweep.", MetricType::Gauge);
    Add(pending, static_cast<double>(metrics_.pending_connections()));
    out.push_back(std::move(pending));

    auto committed =
        Family("kvtier_committed_blocks_total", "Blocks made visible by a verified commit.", MetricType::Counter);
    Add(committed, v(s.committed_blocks));
    out.push_back(std::move(committed));

    auto present = Family("kvtier_put_already_present_total", "Puts of blocks already stored (counted as accesses).",
                          MetricType::Counter);
    Add(present, v(s.already_present));
    out.push_back(std::move(present));

    auto evictions = Family("kvtier_evictions_total",
                            "Blocks evicted, by tier (host evictions demote to disk "
                            "when there is one).",
                            MetricType::Counter);
    Add(evictions, v(s.evictions), {{"tier", "host"}});
    Add(evictions, v(s.disk_evictions), {{"tier", "disk"}});
    out.push_back(std::move(evictions));
    auto quota_evictions =
        Family("kvtier_quota_evictions_total",
               "Blocks a tenant at its quota dropped (its own least recently used) to make room.", MetricType::Counter);
    Add(quota_evictions, v(s.quota_evictions));
    out.push_back(std::move(quota_evictions));

    auto moves = Family("kvtier_tier_moves_total", "Blocks moved between tiers.", MetricType::Counter);
    Add(moves, v(s.demotions), {{"from", "host"}, {"to", "disk"}});
    Add(moves, v(s.promotions), {{"from", "disk"}, {"to", "host"}});
    if (store_.has_hbm_tier()) {
      Add(moves, v(s.hbm_demotions), {{"from", "hbm"}, {"to", "host"}});
      Add(moves, v(s.hbm_promotions), {{"from", "host"}, {"to", "hbm"}});
    }
    out.push_back(std::move(moves));

    auto defrag =
        Family("kvtier_defrag_moves_total", "Slabs emptied and handed to another block size.", MetricType::Counter);
    Add(defrag, v(s.slab_moves));
    out.push_back(std::move(defrag));

    auto defrag_blocks =
        Family("kvtier_defrag_moved_blocks_total", "Blocks moved between slots by compaction.", MetricType::Counter);
    Add(defrag_blocks, v(s.defrag_moved_blocks));
    out.push_back(std::move(defrag_blocks));

    auto disk_errors = Family("kvtier_disk_errors_total", "Disk tier I/O errors.", MetricType::Counter);
    Add(disk_errors, v(s.disk_errors));
    out.push_back(std::move(disk_errors));

    if (store_.has_disk_tier()) {
      const DiskTierStatus st = store_.disk_status();
      // One sample per state, 1 for the state the tier is in (docs/config.md, "Disk tier states").
      auto state = Family("kvtier_disk_tier_state",
                          "1 for the disk tier's state: ok, degraded-full, read-only or off; 0 for the others.",
                          MetricType::Gauge);
      for (const char* name : {"ok", "degraded-full", "read-only", "off"}) {
        Add(state, st.state == name ? 1.0 : 0.0, {{"state", name}});
      }
      out.push_back(std::move(state));
      auto by_op = Family("kvtier_disk_io_errors_total", "Disk tier I/O errors, by operation (each one is logged).",
                          MetricType::Counter);
      Add(by_op, static_cast<double>(st.open_errors), {{"op", "open"}});
      Add(by_op, static_cast<double>(st.write_errors), {{"op", "write"}});
      Add(by_op, static_cast<double>(st.read_errors), {{"op", "read"}});
      Add(by_op, static_cast<double>(st.delete_errors), {{"op", "delete"}});
      Add(by_op, static_cast<double>(st.scan_errors), {{"op", "scan"}});
      Add(by_op, static_cast<double>(st.background_errors), {{"op", "background"}});
      out.push_back(std::move(by_op));
      auto recreated = Family("kvtier_disk_recreated_total",
                              "Times the disk tier's database could not be opened read-write for want of room "
                              "and was started empty (it is a cache; each one is logged).",
                              MetricType::Counter);
      Add(recreated, static_cast<double>(st.recreated));
      out.push_back(std::move(recreated));
      auto database = Family("kvtier_disk_database_bytes",
                             "Bytes of the disk tier's database files: the blocks' bytes plus garbage not yet "
                             "collected, and SSTs.",
                             MetricType::Gauge);
      Add(database, static_cast<double>(st.database_bytes));
      out.push_back(std::move(database));
      auto refused = Family("kvtier_disk_spill_refused_total",
                            "Host evictions dropped instead of spilled because the disk tier was not writable.",
                            MetricType::Counter);
      Add(refused, v(s.disk_spill_refused));
      out.push_back(std::move(refused));
      auto busy = Family("kvtier_disk_spill_dropped_busy_total",
                         "Host evictions dropped instead of spilled because the blocks waiting for the disk "
                         "writer were at their bound (disk_tier.spill_buffer_bytes).",
                         MetricType::Counter);
      Add(busy, v(s.disk_spill_dropped_busy));
      out.push_back(std::move(busy));
      auto queued = Family("kvtier_disk_spill_queue_bytes", "Bytes of evicted blocks waiting for the disk writer.",
                           MetricType::Gauge);
      Add(queued, v(s.disk_spill_queue_bytes));
      out.push_back(std::move(queued));
      auto reads = Family("kvtier_disk_reads_total", "Disk blocks read (without the store's lock).",
                          MetricType::Counter);
      Add(reads, v(s.disk_reads));
      out.push_back(std::move(reads));
      auto free = Family("kvtier_disk_volume_free_bytes", "Free bytes of the disk tier's volume at the last check.",
                         MetricType::Gauge);
      Add(free, static_cast<double>(st.free_bytes));
      out.push_back(std::move(free));
      auto floor = Family("kvtier_disk_min_free_bytes",
                          "The free space under which the disk tier writes nothing (disk_tier.min_free_bytes).",
                          MetricType::Gauge);
      Add(floor, static_cast<double>(st.min_free_bytes));
      out.push_back(std::move(floor));
    }

    if (store_.has_hbm_tier()) {
      auto hbm_errors = Family("kvtier_hbm_errors_total",
                               "HBM tier copies that failed (the block is dropped or stays put).", MetricType::Counter);
      Add(hbm_errors, v(s.hbm_errors));
      out.push_back(std::move(hbm_errors));
    }

    auto recovered = Family("kvtier_recovered_blocks", "Blocks found on disk at start.", MetricType::Gauge);
    Add(recovered, v(s.recovered_blocks));
    out.push_back(std::move(recovered));

    auto rejections = Family("kvtier_rejections_total", "Requests or blocks refused, by reason.", MetricType::Counter);
    Add(rejections, v(s.rejections_no_space), {{"reason", "no_space"}});
    Add(rejections, v(s.rejections_quota), {{"reason", "quota"}});
    Add(rejections, static_cast<double>(metrics_.auth_rejections()), {{"reason", "unauthenticated"}});
    Add(rejections, static_cast<double>(metrics_.permission_rejections()), {{"reason", "permission_denied"}});
    Add(rejections, static_cast<double>(metrics_.invalid_requests()), {{"reason", "invalid_argument"}});
    out.push_back(std::move(rejections));

    auto shadow = Family("kvtier_shadow_lookup_blocks_total",
                         "Blocks asked of lookups in shadow namespaces, by what the result would have been "
                         "(all were answered absent).",
                         MetricType::Counter);
    // Hits first: CountShadowLookup adds the asked blocks before the hits.
    const uint64_t shadow_hits = metrics_.shadow_hit_blocks();
    const uint64_t shadow_asked = metrics_.shadow_lookup_blocks();
    Add(shadow, static_cast<double>(shadow_hits), {{"result", "hit"}});
    Add(shadow, static_cast<double>(shadow_asked > shadow_hits ? shadow_asked - shadow_hits : 0), {{"result", "miss"}});
    out.push_back(std::move(shadow));
    auto shadow_reads =
        Family("kvtier_shadow_read_blocks_total", "Blocks asked of reads in shadow namespaces (all answered absent).",
               MetricType::Counter);
    Add(shadow_reads, static_cast<double>(metrics_.shadow_read_blocks()));
    out.push_back(std::move(shadow_reads));

    auto checksum =
        Family("kvtier_checksum_failures_total", "Blocks whose bytes failed their checksum.", MetricType::Counter);
    Add(checksum, v(s.checksum_failures), {{"stage", "commit_or_move"}});
    Add(checksum, v(s.disk_checksum_failures), {{"stage", "disk_read"}});
    out.push_back(std::move(checksum));

    auto expired =
        Family("kvtier_expired_total", "Leases and reservations that expired unreleased.", MetricType::Counter);
    Add(expired, v(s.expired_leases), {{"kind", "lease"}});
    Add(expired, v(s.expired_reservations), {{"kind", "reservation"}});
    out.push_back(std::move(expired));

    auto leases = Family("kvtier_active_leases", "Read leases held now.", MetricType::Gauge);
    Add(leases, v(s.active_leases));
    out.push_back(std::move(leases));

    auto refusals = Family("kvtier_lease_refusals_total",
                           "Present blocks answered absent because leasing them would take their tenant past its "
                           "pinned-bytes bound, by tenant.",
                           MetricType::Counter);
    for (const auto& [tenant, blocks] : metrics_.PinnedRefusalsSnapshot()) {
      Add(refusals, static_cast<double>(blocks), {{"tenant", tenant}, {"reason", "pinned_bound"}});
    }
    out.push_back(std::move(refusals));
    auto buffer_refusals = Family("kvtier_lease_buffer_refusals_total",
                                  "Disk or HBM blocks answered absent because the leases' own buffers were at "
                                  "their bound (leases.buffer_bytes).",
                                  MetricType::Counter);
    Add(buffer_refusals, v(s.lease_refusals_buffer));
    out.push_back(std::move(buffer_refusals));
    auto buffer_bytes = Family("kvtier_lease_buffer_bytes",
                               "Bytes leases hold in buffers of their own (disk blocks read without moving to host "
                               "memory, host copies of HBM blocks).",
                               MetricType::Gauge);
    Add(buffer_bytes, v(s.lease_buffer_bytes));
    out.push_back(std::move(buffer_bytes));

    auto reservations =
        Family("kvtier_active_reservations", "Uncommitted put reservations held now.", MetricType::Gauge);
    Add(reservations, v(s.active_reservations));
    out.push_back(std::move(reservations));

    auto blocks = Family("kvtier_stored_blocks", "Committed blocks, by tier.", MetricType::Gauge);
    if (store_.has_hbm_tier()) Add(blocks, v(s.hbm_blocks), {{"tier", "hbm"}});
    Add(blocks, v(s.stored_blocks), {{"tier", "host"}});
    if (store_.has_disk_tier()) Add(blocks, v(s.disk_blocks), {{"tier", "disk"}});
    out.push_back(std::move(blocks));

    auto stored =
        Family("kvtier_stored_bytes", "Bytes of slots in use (committed and reserved), by tier.", MetricType::Gauge);
    if (store_.has_hbm_tier()) Add(stored, v(s.hbm_bytes), {{"tier", "hbm"}});
    Add(stored, v(s.stored_bytes), {{"tier", "host"}});
    if (store_.has_disk_tier()) Add(stored, v(s.disk_bytes), {{"tier", "disk"}});
    out.push_back(std::move(stored));

    auto capacity = Family("kvtier_capacity_bytes", "Bytes each tier may hold.", MetricType::Gauge);
    if (store_.has_hbm_tier()) Add(capacity, static_cast<double>(store_.hbm_capacity_bytes()), {{"tier", "hbm"}});
    Add(capacity, static_cast<double>(store_.capacity_bytes()), {{"tier", "host"}});
    if (store_.has_disk_tier()) Add(capacity, static_cast<double>(store_.disk_capacity_bytes()), {{"tier", "disk"}});
    out.push_back(std::move(capacity));
    return out;
  }

 private:
  const BlockStore& store_;
  const ServerMetrics& metrics_;
};

}  // namespace

ServerMetrics::ServerMetrics(const BlockStore& store, std::string node_id)
    : registry_(std::make_shared<prometheus::Registry>()) {
  rpc_duration_ = &prometheus::BuildHistogram()
                       .Name("kvtier_rpc_duration_seconds")
                       .Help("Server-side RPC latency, by method and gRPC status code.")
                       .Register(*registry_);
  prometheus::BuildGauge()
      .Name("kvtier_build_info")
      .Help("Build of this server (always 1).")
      .Register(*registry_)
      .Add({{"version", KVTIER_VERSION}, {"node_id", std::move(node_id)}})
      .Set(1);
  store_collectable_ = std::make_shared<StoreCollectable>(store, *this);
}

void ServerMetrics::CountPinnedRefusals(const std::string& tenant, uint64_t blocks) {
  std::lock_guard<std::mutex> lock(refusals_mu_);
  pinned_refusals_[tenant] += blocks;
}

uint64_t ServerMetrics::pinned_refusals(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(refusals_mu_);
  const auto it = pinned_refusals_.find(tenant);
  return it == pinned_refusals_.end() ? 0 : it->second;
}

std::vector<std::pair<std::string, uint64_t>> ServerMetrics::PinnedRefusalsSnapshot() const {
  std::lock_guard<std::mutex> lock(refusals_mu_);
  return {pinned_refusals_.begin(), pinned_refusals_.end()};
}

void ServerMetrics::ObserveRpc(const char* method, int code, absl::Duration elapsed) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
  rpc_duration_->Add({{"method", method}, {"code", CodeName(code)}}, kBuckets).Observe(absl::ToDoubleSeconds(elapsed));
}

}  // namespace kvtier::server
