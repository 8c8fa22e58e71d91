// The sequence rules of KV event subscribers: in-order batches apply, duplicates are skipped, gaps,
// tail gaps (heartbeats) and restarts are detected.
#include "client/event_sequence.h"

#include <gtest/gtest.h>

namespace kvtier::client {
namespace {

constexpr uint64_t kA = 0xa1, kB = 0xb2;

TEST(EventSequenceTest, FirstMessageOfANodeResetsAndAppliesFromSeqOne) {
  const BatchPlan p = PlanBatch(EventCursor{}, kA, /*first_seq=*/1, /*num_events=*/3, /*last_seq=*/3);
  EXPECT_TRUE(p.reset);
  EXPECT_EQ(p.catch_up_from, 0u);
  EXPECT_EQ(p.first_index, 0u);
}

TEST(EventSequenceTest, LateJoinerCatchesUpFromSeqOne) {
  const BatchPlan p = PlanBatch(EventCursor{}, kA, /*first_seq=*/500, 10, 509);
  EXPECT_TRUE(p.reset);
  EXPECT_EQ(p.catch_up_from, 1u);
}

TEST(EventSequenceTest, InOrderBatchApplies) {
  const EventCursor c{.instance_id = kA, .applied_seq = 10, .synced = true};
  const BatchPlan p = PlanBatch(c, kA, 11, 5, 15);
  EXPECT_FALSE(p.reset);
  EXPECT_EQ(p.catch_up_from, 0u);
  EXPECT_EQ(p.first_index, 0u);
}

TEST(EventSequenceTest, OverlapWithWhatAReplayAppliedIsSkipped) {
  const EventCursor c{.instance_id = kA, .applied_seq = 13, .synced = true};
  const BatchPlan p = PlanBatch(c, kA, 11, 5, 15);
  EXPECT_EQ(p.catch_up_from, 0u);
  EXPECT_EQ(p.first_index, 3u);  // seqs 11, 12, 13 are applied; 14 is events[3]
  const BatchPlan old = PlanBatch(c, kA, 5, 3, 15);
  EXPECT_EQ(old.catch_up_from, 0u);
  EXPECT_EQ(old.first_index, 3u);  // all of it is old
}

TEST(EventSequenceTest, AGapAsksForCatchUpFromTheFirstMissingSeq) {
  const EventCursor c{.instance_id = kA, .applied_seq = 10, .synced = true};
  const BatchPlan p = PlanBatch(c, kA, 12, 5, 16);
  EXPECT_FALSE(p.reset);
  EXPECT_EQ(p.catch_up_from, 11u);
}

TEST(EventSequenceTest, HeartbeatAheadOfTheCursorIsATailGap) {
  const EventCursor c{.instance_id = kA, .applied_seq = 10, .synced = true};
  EXPECT_EQ(PlanBatch(c, kA, 0, 0, 10).catch_up_from, 0u);   // up to date
  EXPECT_EQ(PlanBatch(c, kA, 0, 0, 12).catch_up_from, 11u);  // 11 and 12 were lost
}

TEST(EventSequenceTest, UnsyncedCursorAlwaysCatchesUp) {
  const EventCursor c{.instance_id = kA, .applied_seq = 10, .synced = false};
  EXPECT_EQ(PlanBatch(c, kA, 11, 1, 11).catch_up_from, 11u);
  EXPECT_EQ(PlanBatch(c, kA, 0, 0, 10).catch_up_from, 11u);
}

TEST(EventSequenceTest, ANewInstanceResetsTheNode) {
  const EventCursor c{.instance_id = kA, .applied_seq = 900, .synced = true};
  const BatchPlan fresh = PlanBatch(c, kB, 1, 4, 4);
  EXPECT_TRUE(fresh.reset);
  EXPECT_EQ(fresh.catch_up_from, 0u);  // seq 1 is AllBlocksCleared: applying from it is complete
  const BatchPlan missed = PlanBatch(c, kB, 3, 4, 6);
  EXPECT_TRUE(missed.reset);
  EXPECT_EQ(missed.catch_up_from, 1u);
  const BatchPlan heartbeat = PlanBatch(c, kB, 0, 0, 2);
  EXPECT_TRUE(heartbeat.reset);
  EXPECT_EQ(heartbeat.catch_up_from, 1u);
}

TEST(EventSequenceTest, FirstUnappliedAfterACatchUp) {
  EXPECT_EQ(FirstUnapplied(/*applied_seq=*/20, /*first_seq=*/12, 5), 5u);  // caught up past the batch
  EXPECT_EQ(FirstUnapplied(14, 12, 5), 3u);
  EXPECT_EQ(FirstUnapplied(11, 12, 5), 0u);
  EXPECT_EQ(FirstUnapplied(9, 12, 5), 6u);  // still a gap
}

}  // namespace
}  // namespace kvtier::client
