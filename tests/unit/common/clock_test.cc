#include "kvtier/common/clock.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock(absl::UnixEpoch() + absl::Seconds(100));
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Seconds(100));
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Seconds(100));
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Milliseconds(101500));
}

TEST(RealClockTest, IsOneProcessWideWallClock) {
  Clock* clock = Clock::Real();
  ASSERT_NE(clock, nullptr);
  EXPECT_EQ(clock, Clock::Real());
  const absl::Time before = absl::Now();
  const absl::Time now = clock->Now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, absl::Now());
}

}  // namespace
}  // namespace kvtier
