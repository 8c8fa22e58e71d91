// ClientStats::ForEach: every counter once, under its field name, with help text.
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/client/client.h"
#include "kvtier/client/field_lists.h"
#include "kvtier/common/aggregate_fields.h"
#include "testing/counter_checks.h"

namespace kvtier::client {
namespace {

TEST(ClientStatsTest, ForEachListsEveryCounterOnce) {
  ClientStats stats;
  testing::ExpectEachFieldInOneSample(stats, AggregateFieldCount<ClientStats>(),
                                      [&](const CounterVisitor& v) { stats.ForEach(v); });
}

TEST(ClientStatsTest, ForEachNamesAreTheFieldNamesWithHelp) {
  ClientStats stats;
  stats.lookups = 5;
  stats.nccl_get_blocks = 9;
  const std::vector<testing::VisitedSample> samples =
      testing::Visit([&](const CounterVisitor& v) { stats.ForEach(v); });
  testing::ExpectWellFormed(samples, /*prometheus=*/false);
  ASSERT_EQ(samples.size(), kClientStatsCounterCount);
  EXPECT_EQ(samples.front().name, "lookups");
  EXPECT_EQ(samples.front().value, 5u);
  EXPECT_EQ(samples.back().name, "nccl_get_blocks");
  EXPECT_EQ(samples.back().value, 9u);
  // The same names, in the same order, as the template ForEachCounter the bindings used.
  std::vector<std::string> names;
  ForEachCounter(stats, [&](const char* name, uint64_t) { names.emplace_back(name); });
  ASSERT_EQ(names.size(), samples.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(names[i], samples[i].name);
  for (const auto& s : samples) {
    EXPECT_EQ(s.kind, CounterKind::kCounter) << s.name;
    EXPECT_TRUE(s.labels.empty()) << s.name;
  }
}

}  // namespace
}  // namespace kvtier::client
