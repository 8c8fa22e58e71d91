// RequestHistory: counts of dropped blocks, bounded, oldest forgotten first.
#include "kvtier/server/request_history.h"

#include <gtest/gtest.h>

namespace kvtier::server {
namespace {

TEST(RequestHistoryTest, TakeReturnsWhatWasRememberedOnce) {
  RequestHistory h;
  EXPECT_EQ(h.Take(7), 0u);
  h.Remember(7, 3, 10);
  h.Remember(8, 1, 10);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_EQ(h.Take(7), 3u);
  EXPECT_EQ(h.Take(7), 0u) << "taken: the block is stored again";
  EXPECT_EQ(h.Take(8), 1u);
  EXPECT_EQ(h.size(), 0u);
}

TEST(RequestHistoryTest, RememberingAgainReplacesTheCount) {
  RequestHistory h;
  h.Remember(7, 2, 10);
  h.Remember(7, 5, 10);
  EXPECT_EQ(h.size(), 1u);
  EXPECT_EQ(h.Take(7), 5u);
}

TEST(RequestHistoryTest, TheOldestAreForgottenPastTheBound) {
  RequestHistory h;
  for (uint64_t k = 1; k <= 5; ++k) h.Remember(k, static_cast<uint32_t>(k), 3);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.Take(1), 0u);
  EXPECT_EQ(h.Take(2), 0u);
  EXPECT_EQ(h.Take(3), 3u);
  EXPECT_EQ(h.Take(5), 5u);
  // A renewed entry is as young as its last Remember: 4 renewed, then 6 and 7 push out the rest.
  h.Remember(8, 8, 3);
  h.Remember(4, 40, 3);
  h.Remember(6, 6, 3);
  h.Remember(7, 7, 3);
  EXPECT_EQ(h.Take(8), 0u);
  EXPECT_EQ(h.Take(4), 40u);
}

// Entries taken at once leave stale order entries behind; memory stays bounded by the bound, not by
// the number of drops.
TEST(RequestHistoryTest, StaleEntriesDoNotAccumulate) {
  RequestHistory h;
  h.Remember(1, 1, 100);  // stays
  for (uint64_t k = 2; k < 100000; ++k) {
    h.Remember(k, 1, 100);
    EXPECT_EQ(h.Take(k), 1u);
  }
  EXPECT_LE(h.size(), 100u);
  h.Remember(100000, 2, 100);
  EXPECT_EQ(h.Take(100000), 2u);
}

}  // namespace
}  // namespace kvtier::server
