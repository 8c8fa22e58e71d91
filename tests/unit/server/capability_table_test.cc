// CapabilityTable (kvtier/server/capability_table.h): leases and reservations by id, with deadlines.
#include "kvtier/server/capability_table.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/time/time.h"

namespace kvtier::server {
namespace {

struct Value {
  int n = 0;
  bool dead = false;
};

const absl::Time kT0 = absl::FromUnixSeconds(100);

TEST(CapabilityTableTest, FindSeesDeadValuesAndFindLiveDoesNot) {
  CapabilityTable<Value> t;
  const CapabilityId a = t.NewId();
  t.Add(a, {.n = 1}, kT0);
  EXPECT_EQ(t.Find(a)->n, 1);
  EXPECT_EQ(t.FindLive(a)->n, 1);
  t.Find(a)->dead = true;
  EXPECT_NE(t.Find(a), nullptr);
  EXPECT_EQ(t.FindLive(a), nullptr);
  EXPECT_EQ(t.Find(CapabilityId::Random()), nullptr);
  t.Erase(a);
  EXPECT_FALSE(t.Contains(a));
  EXPECT_EQ(t.size(), 0u);
}

TEST(CapabilityTableTest, NewIdAvoidsIdsInUseAndThoseTheCallerRefuses) {
  CapabilityTable<Value> t;
  std::vector<CapabilityId> refused;
  int asked = 0;
  const CapabilityId id = t.NewId([&](const CapabilityId& c) {
    if (++asked <= 3) {
      refused.push_back(c);
      return true;  // e.g. its tag prefix is taken
    }
    return false;
  });
  EXPECT_EQ(asked, 4);
  for (const CapabilityId& r : refused) EXPECT_NE(id, r);
}

TEST(CapabilityTableTest, DueValuesComeEarliestFirstAndErasedOrDeadOnesAreSkipped) {
  CapabilityTable<Value> t;
  std::vector<CapabilityId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(t.NewId());
  // Deadlines out of order: 3 s, 1 s, 4 s, 2 s, 10 s.
  const int seconds[] = {3, 1, 4, 2, 10};
  for (int i = 0; i < 5; ++i) t.Add(ids[i], {.n = i}, kT0 + absl::Seconds(seconds[i]));
  EXPECT_EQ(t.NextDeadline(), kT0 + absl::Seconds(1));
  t.Erase(ids[3]);              // ended early: its heap item goes stale
  t.Find(ids[0])->dead = true;  // dead: ends at its last unpin, not at its deadline
  std::vector<int> due;
  t.ForEachDue(kT0 + absl::Seconds(4), [&](const CapabilityId& id, Value& v) {
    due.push_back(v.n);
    t.Erase(id);  // the caller may end it in the callback
  });
  EXPECT_EQ(due, (std::vector<int>{1, 2}));
  EXPECT_EQ(t.NextDeadline(), kT0 + absl::Seconds(10));
  EXPECT_TRUE(t.Contains(ids[0])) << "a dead value stays until its owner erases it";
  EXPECT_TRUE(t.Contains(ids[4]));
  due.clear();
  t.ForEachDue(kT0 + absl::Seconds(9), [&](const CapabilityId&, Value& v) { due.push_back(v.n); });
  EXPECT_TRUE(due.empty()) << "nothing else due before 10 s";
  t.ForEachDue(kT0 + absl::Seconds(10), [&](const CapabilityId&, Value& v) { due.push_back(v.n); });
  EXPECT_EQ(due, (std::vector<int>{4}));
  EXPECT_EQ(t.NextDeadline(), absl::InfiniteFuture());
}

}  // namespace
}  // namespace kvtier::server
