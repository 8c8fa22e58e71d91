// The results of a capacity sweep, written as CSV and as an SVG plot of hit ratio against capacity.
#ifndef KVTIER_BENCH_POLICY_SIM_SWEEP_REPORT_H_
#define KVTIER_BENCH_POLICY_SIM_SWEEP_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvtier::bench {

struct SweepPoint {
  std::string policy;            // "lru", "weighted", ..., "belady"
  uint64_t capacity_blocks = 0;  // 0 = infinite
  uint64_t hit_blocks = 0;
  uint64_t blocks = 0;
  double hit_ratio = 0;
  double belady_fraction = 0;  // hit_ratio / Belady's at the same capacity; 0 when Belady was not run
  uint64_t evictions = 0;
  uint64_t not_admitted = 0;
  uint64_t disk_hit_blocks = 0;  // with a disk tier: hits served from disk, and the moves between tiers
  uint64_t demotions = 0;
  uint64_t clean_demotions = 0;  // demotions that wrote nothing (the disk copy was kept)
  uint64_t promotions = 0;
  uint64_t disk_evictions = 0;
  uint64_t disk_refused = 0;     // host victims the disk admission rule did not write
  uint64_t orphaning_drops = 0;  // blocks dropped while a child stayed (SimResult::orphaning_drops)
  double seconds = 0;            // wall time of the replay
};

// policy,capacity_blocks,hit_ratio,belady_fraction,hit_blocks,blocks,evictions,not_admitted,seconds;
// capacity 0 is written "inf". Errors: Internal when the file cannot be written.
absl::Status WriteSweepCsv(const std::string& path, const std::vector<SweepPoint>& points);

// One line per policy over the finite capacities (log-scaled x axis), and a dashed line for the
// infinite cache when it was swept. `title` goes above the plot. Errors: Internal (file).
absl::Status WriteSweepSvg(const std::string& path, const std::string& title, const std::vector<SweepPoint>& points);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_POLICY_SIM_SWEEP_REPORT_H_
