// BlockStoreStats::ForEach and DiskTierStatus::ForEach: every counter listed once, under a valid
// Prometheus name, with its kind.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/common/aggregate_fields.h"
#include "kvtier/server/block_store.h"
#include "testing/counter_checks.h"

namespace kvtier::server {
namespace {

using testing::Visit;
using testing::VisitedSample;

std::vector<VisitedSample> StoreSamples(const BlockStoreStats& s, BlockStoreStats::Tiers tiers) {
  return Visit([&](const CounterVisitor& v) { s.ForEach(v, tiers); });
}

const VisitedSample* Find(const std::vector<VisitedSample>& samples, const std::string& sample) {
  auto it = std::find_if(samples.begin(), samples.end(), [&](const VisitedSample& s) { return s.sample == sample; });
  return it == samples.end() ? nullptr : &*it;
}

TEST(BlockStoreStatsTest, ListsEveryFieldInExactlyOneSample) {
  BlockStoreStats stats;
  testing::ExpectEachFieldInOneSample(stats, AggregateFieldCount<BlockStoreStats>(),
                                      [&](const CounterVisitor& v) { stats.ForEach(v, {.hbm = true, .disk = true}); });
}

TEST(BlockStoreStatsTest, SamplesAreWellFormedPrometheus) {
  testing::ExpectWellFormed(StoreSamples(BlockStoreStats(), {.hbm = true, .disk = true}));
  testing::ExpectWellFormed(StoreSamples(BlockStoreStats(), {}));
}

TEST(BlockStoreStatsTest, KindsAreRight) {
  const std::vector<VisitedSample> samples = StoreSamples(BlockStoreStats(), {.hbm = true, .disk = true});
  for (const char* gauge :
       {"kvtier_active_leases", "kvtier_active_reservations", "kvtier_stored_blocks{tier=\"host\"}",
        "kvtier_stored_bytes{tier=\"hbm\"}", "kvtier_lease_buffer_bytes", "kvtier_recovered_blocks"}) {
    const VisitedSample* s = Find(samples, gauge);
    ASSERT_NE(s, nullptr) << gauge;
    EXPECT_EQ(s->kind, CounterKind::kGauge) << gauge;
  }
  for (const char* counter :
       {"kvtier_lookup_blocks_total{result=\"hit\"}", "kvtier_quota_evictions_total",
        "kvtier_defrag_moved_blocks_total", "kvtier_tier_moves_total{from=\"hbm\",to=\"host\"}"}) {
    const VisitedSample* s = Find(samples, counter);
    ASSERT_NE(s, nullptr) << counter;
    EXPECT_EQ(s->kind, CounterKind::kCounter) << counter;
  }
}

TEST(BlockStoreStatsTest, LeavesOutTheSamplesOfAbsentTiers) {
  BlockStoreStats stats;
  stats.hbm_errors = 3;
  stats.stored_blocks = 7;
  const std::vector<VisitedSample> host_only = StoreSamples(stats, {});
  EXPECT_EQ(Find(host_only, "kvtier_hbm_errors_total"), nullptr);
  EXPECT_EQ(Find(host_only, "kvtier_stored_blocks{tier=\"disk\"}"), nullptr);
  EXPECT_EQ(Find(host_only, "kvtier_disk_spill_refused_total"), nullptr);
  ASSERT_NE(Find(host_only, "kvtier_stored_blocks{tier=\"host\"}"), nullptr);
  EXPECT_EQ(Find(host_only, "kvtier_stored_blocks{tier=\"host\"}")->value, 7u);
  const std::vector<VisitedSample> all = StoreSamples(stats, {.hbm = true, .disk = true});
  ASSERT_NE(Find(all, "kvtier_hbm_errors_total"), nullptr);
  EXPECT_EQ(Find(all, "kvtier_hbm_errors_total")->value, 3u);
  EXPECT_GT(all.size(), host_only.size());
}

TEST(DiskTierStatusTest, ListsEveryNumberAndOneStateGauge) {
  DiskTierStatus st{.state = "read-only",
                    .reason = "no room",
                    .volume_bytes = 11,
                    .free_bytes = 12,
                    .min_free_bytes = 13,
                    .database_bytes = 14,
                    .open_errors = 15,
                    .write_errors = 16,
                    .read_errors = 17,
                    .delete_errors = 18,
                    .scan_errors = 19,
                    .background_errors = 20,
                    .recreated = 21};
  const std::vector<VisitedSample> samples = Visit([&](const CounterVisitor& v) { st.ForEach(v); });
  testing::ExpectWellFormed(samples);
  for (uint64_t want = 11; want <= 21; ++want) {
    EXPECT_EQ(std::count_if(samples.begin(), samples.end(), [&](const VisitedSample& s) { return s.value == want; }), 1)
        << want;
  }
  for (const VisitedSample& s : samples) {
    if (s.name != "kvtier_disk_tier_state") continue;
    EXPECT_EQ(s.kind, CounterKind::kGauge);
    EXPECT_EQ(s.value, s.sample == "kvtier_disk_tier_state{state=\"read-only\"}" ? 1u : 0u) << s.sample;
  }
  ASSERT_NE(Find(samples, "kvtier_disk_io_errors_total{op=\"scan\"}"), nullptr);
  EXPECT_EQ(Find(samples, "kvtier_disk_io_errors_total{op=\"scan\"}")->value, 19u);
  EXPECT_EQ(Find(samples, "kvtier_disk_volume_free_bytes")->kind, CounterKind::kGauge);
}

}  // namespace
}  // namespace kvtier::server
