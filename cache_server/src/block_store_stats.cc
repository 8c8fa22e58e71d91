// BlockStoreStats::ForEach and DiskTierStatus::ForEach: the one list of the store's counters, with
// their Prometheus names, help and kind (docs/architecture.md, "Counters").
#include <atomic>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/common/counters.h"
#include "kvtier/server/block_store.h"

namespace kvtier::server {
namespace {

using Labels = std::vector<std::pair<std::string_view, std::string_view>>;
constexpr CounterKind kCounter = CounterKind::kCounter;
constexpr CounterKind kGauge = CounterKind::kGauge;

void Visit(const CounterVisitor& visit, std::string_view name, std::string_view help, CounterKind kind, uint64_t value,
           Labels labels = {}) {
  visit(CounterInfo{.name = name, .help = help, .kind = kind, .labels = std::move(labels)}, value);
}

uint64_t Load(const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); }

}  // namespace

void BlockStoreStats::ForEach(const CounterVisitor& visit, Tiers tiers) const {
  constexpr std::string_view kLookups = "Blocks asked of existence queries, by result.";
  Visit(visit, "kvtier_lookup_blocks_total", kLookups, kCounter, Load(lookup_blocks_hit), {{"result", "hit"}});
  Visit(visit, "kvtier_lookup_blocks_total", kLookups, kCounter, Load(lookup_blocks_miss), {{"result", "miss"}});
  Visit(visit, "kvtier_lookup_requests_total", "Existence queries served.", kCounter, Load(lookup_requests));
  constexpr std::string_view kReads = "Blocks asked of reads, by result.";
  Visit(visit, "kvtier_read_blocks_total", kReads, kCounter, Load(read_blocks), {{"result", "hit"}});
  Visit(visit, "kvtier_read_blocks_total", kReads, kCounter, Load(read_blocks_miss), {{"result", "miss"}});
  Visit(visit, "kvtier_read_bytes_total", "Bytes of the blocks reads served.", kCounter, Load(read_bytes));
  Visit(visit, "kvtier_committed_blocks_total", "Blocks made visible by a verified commit.", kCounter,
        Load(committed_blocks));
  Visit(visit, "kvtier_committed_bytes_total", "Bytes of the blocks made visible by a verified commit.", kCounter,
        Load(committed_bytes));
  Visit(visit, "kvtier_put_already_present_total", "Puts of blocks already stored (counted as accesses).", kCounter,
        Load(already_present));

  constexpr std::string_view kEvictions = "Blocks evicted, by tier (host evictions demote to disk when there is one).";
  Visit(visit, "kvtier_evictions_total", kEvictions, kCounter, Load(evictions), {{"tier", "host"}});
  Visit(visit, "kvtier_evictions_total", kEvictions, kCounter, Load(disk_evictions), {{"tier", "disk"}});
  Visit(visit, "kvtier_quota_evictions_total",
        "Blocks a tenant at its quota dropped (its own least recently used) to make room.", kCounter,
        Load(quota_evictions));

  constexpr std::string_view kMoves = "Blocks moved between tiers.";
  Visit(visit, "kvtier_tier_moves_total", kMoves, kCounter, Load(demotions), {{"from", "host"}, {"to", "disk"}});
  Visit(visit, "kvtier_tier_moves_total", kMoves, kCounter, Load(promotions), {{"from", "disk"}, {"to", "host"}});
  if (tiers.hbm) {
    Visit(visit, "kvtier_tier_moves_total", kMoves, kCounter, Load(hbm_demotions), {{"from", "hbm"}, {"to", "host"}});
    Visit(visit, "kvtier_tier_moves_total", kMoves, kCounter, Load(hbm_promotions), {{"from", "host"}, {"to", "hbm"}});
  }
  Visit(visit, "kvtier_defrag_moves_total", "Slabs emptied and handed to another block size.", kCounter,
        Load(slab_moves));
  Visit(visit, "kvtier_defrag_moved_blocks_total", "Blocks moved between slots by compaction.", kCounter,
        Load(defrag_moved_blocks));

  Visit(visit, "kvtier_disk_errors_total", "Disk tier I/O errors.", kCounter, Load(disk_errors));
  if (tiers.disk) {
    Visit(visit, "kvtier_disk_spill_refused_total",
          "Host evictions dropped instead of spilled because the disk tier was not writable.", kCounter,
          Load(disk_spill_refused));
    Visit(visit, "kvtier_disk_spill_dropped_busy_total",
          "Host evictions dropped instead of spilled because the blocks waiting for the disk writer were at their "
          "bound (disk_tier.spill_buffer_bytes).",
          kCounter, Load(disk_spill_dropped_busy));
    Visit(visit, "kvtier_disk_admission_refused_total",
          "Host evictions dropped instead of spilled because their block was requested fewer times than "
          "disk_tier.admit_min_requests.",
          kCounter, Load(disk_admission_refused));
    Visit(visit, "kvtier_disk_spill_queue_bytes", "Bytes of evicted blocks waiting for the disk writer.", kGauge,
          Load(disk_spill_queue_bytes));
    Visit(visit, "kvtier_disk_reads_total", "Disk blocks read (without the store's lock).", kCounter, Load(disk_reads));
  }
  if (tiers.hbm) {
    Visit(visit, "kvtier_hbm_errors_total", "HBM tier copies that failed (the block is dropped or stays put).",
          kCounter, Load(hbm_errors));
  }
  Visit(visit, "kvtier_recovered_blocks", "Blocks found on disk at start.", kGauge, Load(recovered_blocks));

  Visit(visit, "kvtier_rejections_total", "Requests or blocks refused, by reason.", kCounter, Load(rejections_no_space),
        {{"reason", "no_space"}});
  Visit(visit, "kvtier_rejections_total", "Requests or blocks refused, by reason.", kCounter, Load(rejections_quota),
        {{"reason", "quota"}});

  constexpr std::string_view kChecksum = "Blocks whose bytes failed their checksum.";
  Visit(visit, "kvtier_checksum_failures_total", kChecksum, kCounter, Load(checksum_failures),
        {{"stage", "commit_or_move"}});
  Visit(visit, "kvtier_checksum_failures_total", kChecksum, kCounter, Load(disk_checksum_failures),
        {{"stage", "disk_read"}});
  constexpr std::string_view kExpired = "Leases and reservations that expired unreleased.";
  Visit(visit, "kvtier_expired_total", kExpired, kCounter, Load(expired_leases), {{"kind", "lease"}});
  Visit(visit, "kvtier_expired_total", kExpired, kCounter, Load(expired_reservations), {{"kind", "reservation"}});
  Visit(visit, "kvtier_active_leases", "Read leases held now.", kGauge, Load(active_leases));
  Visit(visit, "kvtier_lease_pinned_refusals_total",
        "Present blocks answered absent because leasing them would take their tenant past its pinned-bytes bound "
        "(all tenants; kvtier_lease_refusals_total has them by tenant).",
        kCounter, Load(lease_refusals_pinned));
  Visit(visit, "kvtier_lease_buffer_refusals_total",
        "Disk or HBM blocks answered absent because the leases' own buffers were at their bound "
        "(leases.buffer_bytes).",
        kCounter, Load(lease_refusals_buffer));
  Visit(visit, "kvtier_lease_buffer_bytes",
        "Bytes leases hold in buffers of their own (disk blocks read without moving to host memory, host copies "
        "of HBM blocks).",
        kGauge, Load(lease_buffer_bytes));
  Visit(visit, "kvtier_active_reservations", "Uncommitted put reservations held now.", kGauge,
        Load(active_reservations));

  constexpr std::string_view kBlocks = "Committed blocks, by tier.";
  if (tiers.hbm) Visit(visit, "kvtier_stored_blocks", kBlocks, kGauge, Load(hbm_blocks), {{"tier", "hbm"}});
  Visit(visit, "kvtier_stored_blocks", kBlocks, kGauge, Load(stored_blocks), {{"tier", "host"}});
  if (tiers.disk) Visit(visit, "kvtier_stored_blocks", kBlocks, kGauge, Load(disk_blocks), {{"tier", "disk"}});
  constexpr std::string_view kBytes = "Bytes of slots in use (committed and reserved), by tier.";
  if (tiers.hbm) Visit(visit, "kvtier_stored_bytes", kBytes, kGauge, Load(hbm_bytes), {{"tier", "hbm"}});
  Visit(visit, "kvtier_stored_bytes", kBytes, kGauge, Load(stored_bytes), {{"tier", "host"}});
  if (tiers.disk) Visit(visit, "kvtier_stored_bytes", kBytes, kGauge, Load(disk_bytes), {{"tier", "disk"}});
}

void DiskTierStatus::ForEach(const CounterVisitor& visit) const {
  // One sample per state, 1 for the state the tier is in (docs/config.md, "Disk tier states").
  for (const char* name : {"ok", "degraded-full", "read-only", "off"}) {
    Visit(visit, "kvtier_disk_tier_state",
          "1 for the disk tier's state: ok, degraded-full, read-only or off; 0 for the others.", kGauge,
          state == name ? 1 : 0, {{"state", name}});
  }
  constexpr std::string_view kByOp = "Disk tier I/O errors, by operation (each one is logged).";
  Visit(visit, "kvtier_disk_io_errors_total", kByOp, kCounter, open_errors, {{"op", "open"}});
  Visit(visit, "kvtier_disk_io_errors_total", kByOp, kCounter, write_errors, {{"op", "write"}});
  Visit(visit, "kvtier_disk_io_errors_total", kByOp, kCounter, read_errors, {{"op", "read"}});
  Visit(visit, "kvtier_disk_io_errors_total", kByOp, kCounter, delete_errors, {{"op", "delete"}});
  Visit(visit, "kvtier_disk_io_errors_total", kByOp, kCounter, scan_errors, {{"op", "scan"}});
  Visit(visit, "kvtier_disk_io_errors_total", kByOp, kCounter, background_errors, {{"op", "background"}});
  Visit(visit, "kvtier_disk_recreated_total",
        "Times the disk tier's database could not be opened read-write for want of room and was started empty "
        "(it is a cache; each one is logged).",
        kCounter, recreated);
  Visit(visit, "kvtier_disk_database_bytes",
        "Bytes of the disk tier's database files: the blocks' bytes plus garbage not yet collected, and SSTs.", kGauge,
        database_bytes);
  Visit(visit, "kvtier_disk_volume_bytes", "Size of the disk tier's volume at start (0: unknown).", kGauge,
        volume_bytes);
  Visit(visit, "kvtier_disk_volume_free_bytes", "Free bytes of the disk tier's volume at the last check.", kGauge,
        free_bytes);
  Visit(visit, "kvtier_disk_min_free_bytes",
        "The free space under which the disk tier writes nothing (disk_tier.min_free_bytes).", kGauge, min_free_bytes);
}

}  // namespace kvtier::server
