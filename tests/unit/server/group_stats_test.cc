#include "group_stats.h"

#include <gtest/gtest.h>

namespace kvtier::server {
namespace {

TEST(GroupStatsTableTest, CountsLookupsBlocksHitsAndShadowHitsPerGroup) {
  GroupStatsTable table(4);
  table.Record(7, 10, 6, /*shadow=*/false);
  table.Record(7, 4, 4, /*shadow=*/true);
  table.Record(0, 3, 1, false);  // no group key
  const auto top = table.Top(0);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].group_key, 7u);
  EXPECT_EQ(top[0].lookups, 2u);
  EXPECT_EQ(top[0].blocks, 14u);
  EXPECT_EQ(top[0].hit_blocks, 6u);
  EXPECT_EQ(top[0].shadow_blocks, 4u);
  EXPECT_EQ(top[0].shadow_hit_blocks, 4u);
  EXPECT_EQ(top[0].error_blocks, 0u);
  EXPECT_EQ(table.untracked_lookups(), 1u);
}

TEST(GroupStatsTableTest, KeepsTheHeaviestGroupsAndReplacesTheSmallest) {
  GroupStatsTable table(3);
  table.Record(1, 100, 0, false);
  table.Record(2, 50, 0, false);
  table.Record(3, 5, 0, false);
  table.Record(4, 1, 1, false);  // full: replaces group 3 and inherits its 5 blocks as error
  auto top = table.Top(0);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].group_key, 1u);
  EXPECT_EQ(top[1].group_key, 2u);
  EXPECT_EQ(top[2].group_key, 4u);
  EXPECT_EQ(top[2].blocks, 6u);
  EXPECT_EQ(top[2].error_blocks, 5u);
  EXPECT_EQ(top[2].hit_blocks, 1u);
  // A heavy hitter arriving late still enters and stays.
  for (int i = 0; i < 10; ++i) table.Record(9, 40, 0, false);
  top = table.Top(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].group_key, 9u);
  EXPECT_EQ(top[1].group_key, 1u);
}

}  // namespace
}  // namespace kvtier::server
