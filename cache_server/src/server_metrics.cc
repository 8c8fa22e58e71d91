#include "server_metrics.h"

#include <prometheus/metric_family.h>

#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "events/event_publisher.h"

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

// Every sample of ServerMetrics::ForEachCounter, grouped into families (in their first sample's order)
// when scraped, so the hot path pays nothing for metrics.
class CountersCollectable final : public prometheus::Collectable {
 public:
  explicit CountersCollectable(const ServerMetrics& metrics) : metrics_(metrics) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    absl::flat_hash_map<std::string, size_t> index;  // family name -> position in out
    metrics_.ForEachCounter([&](const CounterInfo& info, uint64_t value) {
      auto [it, inserted] = index.try_emplace(std::string(info.name), out.size());
      if (inserted) {
        prometheus::MetricFamily f;
        f.name = std::string(info.name);
        f.help = std::string(info.help);
        f.type = info.kind == CounterKind::kGauge ? prometheus::MetricType::Gauge : prometheus::MetricType::Counter;
        out.push_back(std::move(f));
      }
      prometheus::MetricFamily& f = out[it->second];
      prometheus::ClientMetric m;
      for (const auto& [name, label_value] : info.labels)
        m.label.push_back({std::string(name), std::string(label_value)});
      if (f.type == prometheus::MetricType::Counter) {
        m.counter.value = static_cast<double>(value);
      } else {
        m.gauge.value = static_cast<double>(value);
      }
      f.metric.push_back(std::move(m));
    });
    return out;
  }

 private:
  const ServerMetrics& metrics_;
};

using Labels = std::vector<std::pair<std::string_view, std::string_view>>;

void Visit(const CounterVisitor& visit, std::string_view name, std::string_view help, CounterKind kind, uint64_t value,
           Labels labels = {}) {
  visit(CounterInfo{.name = name, .help = help, .kind = kind, .labels = std::move(labels)}, value);
}

}  // namespace

ServerMetrics::ServerMetrics(const BlockStore& store, std::string node_id)
    : store_(store), registry_(std::make_shared<prometheus::Registry>()) {
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
  counters_collectable_ = std::make_shared<CountersCollectable>(*this);
}

void ServerMetrics::ForEachCounter(const CounterVisitor& visit) const {
  constexpr CounterKind kCounter = CounterKind::kCounter;
  constexpr CounterKind kGauge = CounterKind::kGauge;
  const bool hbm = store_.has_hbm_tier();
  const bool disk = store_.has_disk_tier();
  store_.stats().ForEach(visit, {.hbm = hbm, .disk = disk});

  constexpr std::string_view kCapacity = "Bytes each tier may hold.";
  if (hbm) Visit(visit, "kvtier_capacity_bytes", kCapacity, kGauge, store_.hbm_capacity_bytes(), {{"tier", "hbm"}});
  Visit(visit, "kvtier_capacity_bytes", kCapacity, kGauge, store_.capacity_bytes(), {{"tier", "host"}});
  if (disk) Visit(visit, "kvtier_capacity_bytes", kCapacity, kGauge, store_.disk_capacity_bytes(), {{"tier", "disk"}});
  if (disk) store_.disk_status().ForEach(visit);

  constexpr std::string_view kTransfer = "Payload bytes moved, by direction and transport.";
  using D = Direction;
  using T = Transport;
  Visit(visit, "kvtier_transfer_bytes_total", kTransfer, kCounter, transfer_bytes(D::kRead, T::kGrpc),
        {{"direction", "read"}, {"transport", "grpc"}});
  Visit(visit, "kvtier_transfer_bytes_total", kTransfer, kCounter, transfer_bytes(D::kWrite, T::kGrpc),
        {{"direction", "write"}, {"transport", "grpc"}});
  Visit(visit, "kvtier_transfer_bytes_total", kTransfer, kCounter, transfer_bytes(D::kRead, T::kUcx),
        {{"direction", "read"}, {"transport", "ucx"}});
  Visit(visit, "kvtier_transfer_bytes_total", kTransfer, kCounter, transfer_bytes(D::kWrite, T::kUcx),
        {{"direction", "write"}, {"transport", "ucx"}});
  constexpr std::string_view kTransferErrors =
      "UCX block transfers that failed (peer gone, timed out, lease or reservation expired), by direction.";
  Visit(visit, "kvtier_transfer_errors_total", kTransferErrors, kCounter, transfer_errors(D::kRead),
        {{"direction", "read"}});
  Visit(visit, "kvtier_transfer_errors_total", kTransferErrors, kCounter, transfer_errors(D::kWrite),
        {{"direction", "write"}});
  constexpr std::string_view kPendingResets =
      "Connections to the UCX port that never became a connection request (garbage or silence), reset for their "
      "age or beyond the per-host limit.";
  Visit(visit, "kvtier_ucx_pending_connections_reset_total", kPendingResets, kCounter, pending_resets_timeout(),
        {{"reason", "timeout"}});
  Visit(visit, "kvtier_ucx_pending_connections_reset_total", kPendingResets, kCounter, pending_resets_limit(),
        {{"reason", "per_host_limit"}});
  Visit(visit, "kvtier_ucx_pending_connections",
        "Connections to the UCX port not yet a connection request, at the last sweep.", kGauge, pending_connections());

  constexpr std::string_view kRejections = "Requests or blocks refused, by reason.";  // as the store's samples
  Visit(visit, "kvtier_rejections_total", kRejections, kCounter, auth_rejections(), {{"reason", "unauthenticated"}});
  Visit(visit, "kvtier_rejections_total", kRejections, kCounter, permission_rejections(),
        {{"reason", "permission_denied"}});
  Visit(visit, "kvtier_rejections_total", kRejections, kCounter, invalid_requests(), {{"reason", "invalid_argument"}});

  // Hits first: CountShadowLookup adds the asked blocks before the hits.
  constexpr std::string_view kShadow =
      "Blocks asked of lookups in shadow namespaces, by what the result would have been (all were answered "
      "absent).";
  const uint64_t shadow_hits = shadow_hit_blocks();
  const uint64_t shadow_asked = shadow_lookup_blocks();
  Visit(visit, "kvtier_shadow_lookup_blocks_total", kShadow, kCounter, shadow_hits, {{"result", "hit"}});
  Visit(visit, "kvtier_shadow_lookup_blocks_total", kShadow, kCounter,
        shadow_asked > shadow_hits ? shadow_asked - shadow_hits : 0, {{"result", "miss"}});
  Visit(visit, "kvtier_shadow_read_blocks_total", "Blocks asked of reads in shadow namespaces (all answered absent).",
        kCounter, shadow_read_blocks());
  Visit(visit, "kvtier_group_untracked_lookups_total", "Lookup calls without a similarity group key.", kCounter,
        groups_.untracked_lookups());

  const std::vector<std::pair<std::string, uint64_t>> refusals = PinnedRefusalsSnapshot();
  for (const auto& [tenant, blocks] : refusals) {
    Visit(visit, "kvtier_lease_refusals_total",
          "Present blocks answered absent because leasing them would take their tenant past its pinned-bytes bound, "
          "by tenant.",
          kCounter, blocks, {{"tenant", tenant}, {"reason", "pinned_bound"}});
  }
  if (events_ != nullptr) events_->ForEachCounter(visit);
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
