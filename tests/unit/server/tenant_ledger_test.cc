// TenantLedger (cache_server/src/tenant_ledger.h): per-tenant stored and pinned bytes, quotas, the
// pinned bound and when it applies.
#include "tenant_ledger.h"

#include <gtest/gtest.h>

#include "absl/time/time.h"

namespace kvtier::server {
namespace {

constexpr uint64_t kA = 1, kB = 2;
const absl::Time kNow = absl::FromUnixSeconds(1000);

TEST(TenantLedgerTest, CountsNeverWrapAndEmptyTenantsLeave) {
  TenantLedger t({}, 100);
  t.AddStored(kA, 30);
  t.AddStored(kA, 20);
  EXPECT_EQ(t.Stored(kA), 50u);
  t.RemoveStored(kA, 80);  // more than counted: stops at 0
  EXPECT_EQ(t.Stored(kA), 0u);
  t.RemoveStored(kB, 5);  // never counted
  EXPECT_EQ(t.Stored(kB), 0u);
  // kA left the ledger when it reached 0: a lone kB now holds the server alone.
  t.AddStored(kB, 10);
  EXPECT_FALSE(t.BoundApplies(kB, kNow));
}

TEST(TenantLedgerTest, ThePinnedBoundIsTheShareOrTheQuotaWhicheverIsSmaller) {
  TenantLedger t({{kA, 40}, {kB, 500}}, 100);
  EXPECT_EQ(t.PinnedBound(kA), 40u);
  EXPECT_EQ(t.PinnedBound(kB), 100u);
  EXPECT_EQ(t.PinnedBound(3), 100u);
  EXPECT_EQ(t.Quota(kA), std::optional<uint64_t>(40));
  EXPECT_EQ(t.Quota(3), std::nullopt);
}

TEST(TenantLedgerTest, TheBoundAppliesOnlyWhileAnotherTenantHoldsBlocksOrWasRefusedLately) {
  TenantLedger t({}, 100);
  t.AddStored(kA, 1000);
  EXPECT_FALSE(t.BoundApplies(kA, kNow)) << "alone: no one to keep out";
  t.AddPinned(kA, 900);
  EXPECT_TRUE(t.MayPin(kA, 50, /*adds_bytes=*/true, kNow)) << "alone, it may pin past its bound";

  t.NoteRefused(kB, kNow + absl::Seconds(2));  // kB found no room: kA's leases are bounded for 2 s
  EXPECT_TRUE(t.BoundApplies(kA, kNow));
  EXPECT_TRUE(t.BoundApplies(kB, kNow)) << "kA holds blocks";
  EXPECT_FALSE(t.MayPin(kA, 50, /*adds_bytes=*/true, kNow));
  EXPECT_FALSE(t.MayPin(kA, 50, /*adds_bytes=*/false, kNow)) << "over its bound: not even a block it holds";
  EXPECT_FALSE(t.BoundApplies(kA, kNow + absl::Seconds(2))) << "the refusal ended";

  t.AddStored(kB, 10);  // kB holds blocks: the bound applies for as long as it does
  EXPECT_TRUE(t.BoundApplies(kA, kNow + absl::Hours(1)));
  t.RemoveStored(kB, 10);
  EXPECT_FALSE(t.BoundApplies(kA, kNow + absl::Hours(1)));
}

TEST(TenantLedgerTest, ATenantsOwnRefusalDoesNotBoundIt) {
  TenantLedger t({}, 100);
  t.AddStored(kA, 1000);
  t.NoteRefused(kA, kNow + absl::Seconds(2));
  EXPECT_FALSE(t.BoundApplies(kA, kNow));
  EXPECT_TRUE(t.BoundApplies(kB, kNow));
}

TEST(TenantLedgerTest, UnderTheBoundALeaseFitsOrItIsTheFirst) {
  TenantLedger t({}, 100);
  t.AddStored(kA, 1);
  t.AddStored(kB, 1);  // shared: bounds apply
  EXPECT_TRUE(t.MayPin(kA, 300, true, kNow)) << "nothing pinned: one block always, even above the bound";
  t.AddPinned(kA, 60);
  EXPECT_TRUE(t.MayPin(kA, 40, true, kNow)) << "60 + 40 <= 100";
  EXPECT_FALSE(t.MayPin(kA, 41, true, kNow));
  EXPECT_TRUE(t.MayPin(kA, 41, false, kNow)) << "another lease on a block already pinned adds nothing";
  t.RemovePinned(kA, 60);
  EXPECT_EQ(t.Pinned(kA), 0u);
}

}  // namespace
}  // namespace kvtier::server
