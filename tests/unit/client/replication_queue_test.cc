// The replica queue and hinted-handoff queue bounds, and the Replicator's hand-off logic, with fake
// put hooks (no sockets; the hooks block on futures instead of sleeping).
#include "client/replication.h"

#include <atomic>
#include <cstdint>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "testing/status_matchers.h"

namespace kvtier::client {
namespace {

// A task of `blocks` blocks of `block_bytes` each for `node_id`; block k's fingerprint starts with `tag`, k.
ReplicaTask MakeTask(const std::string& node_id, size_t blocks, size_t block_bytes, uint8_t tag = 0) {
  ReplicaTask t;
  t.node_id = node_id;
  t.ns = Namespace{.tenant = "t", .model = "m"};
  for (size_t k = 0; k < blocks; ++k) {
    ReplicaBlock b;
    b.fingerprint.bytes[0] = tag;
    b.fingerprint.bytes[1] = static_cast<uint8_t>(k);
    b.depth = static_cast<uint32_t>(k);
    b.bytes = std::make_shared<const std::vector<std::byte>>(block_bytes, std::byte{0});
    t.blocks.push_back(std::move(b));
  }
  return t;
}

TEST(ReplicaQueueTest, RejectNewRefusesATaskThatDoesNotFitAndKeepsTheRest) {
  ReplicaQueue q(1000, ReplicaQueue::Overflow::kRejectNew);
  EXPECT_EQ(q.Push(MakeTask("a", 4, 100, 1)), 0u);  // 400 bytes
  EXPECT_EQ(q.Push(MakeTask("b", 5, 100, 2)), 0u);  // 900
  EXPECT_EQ(q.Push(MakeTask("c", 2, 100, 3)), 2u);  // 1100 > 1000: refused, both blocks lost
  EXPECT_EQ(q.bytes(), 900u);
  EXPECT_EQ(q.blocks(), 9u);
  EXPECT_EQ(q.Push(MakeTask("d", 1, 100, 4)), 0u);  // exactly 1000 fits
  ReplicaTask t;
  ASSERT_TRUE(q.Pop(&t));
  EXPECT_EQ(t.node_id, "a");  // FIFO
  ASSERT_TRUE(q.Pop(&t));
  EXPECT_EQ(t.node_id, "b");
  ASSERT_TRUE(q.Pop(&t));
  EXPECT_EQ(t.node_id, "d");
  EXPECT_FALSE(q.Pop(&t));
  EXPECT_EQ(q.bytes(), 0u);
  EXPECT_EQ(q.blocks(), 0u);
}

TEST(ReplicaQueueTest, DropOldestMakesRoomByDroppingTheOldestTasks) {
  ReplicaQueue q(1000, ReplicaQueue::Overflow::kDropOldest);
  EXPECT_EQ(q.Push(MakeTask("a", 3, 100)), 0u);  // 300
  EXPECT_EQ(q.Push(MakeTask("b", 3, 100)), 0u);  // 600
  EXPECT_EQ(q.Push(MakeTask("c", 3, 100)), 0u);  // 900
  EXPECT_EQ(q.Push(MakeTask("d", 5, 100)), 6u);  // 1400: a and b (3 blocks each) go
  EXPECT_LE(q.bytes(), q.max_bytes());
  EXPECT_EQ(q.bytes(), 800u);
  EXPECT_EQ(q.NodeIds(), (std::vector<std::string>{"c", "d"}));
  // A task larger than the whole bound is dropped on its own; the queue is untouched.
  EXPECT_EQ(q.Push(MakeTask("e", 11, 100)), 11u);
  EXPECT_EQ(q.bytes(), 800u);
  EXPECT_EQ(q.NodeIds(), (std::vector<std::string>{"c", "d"}));
}

TEST(ReplicaQueueTest, TakeForRemovesOnlyThatOwnersTasksOldestFirst) {
  ReplicaQueue q(1 << 20, ReplicaQueue::Overflow::kDropOldest);
  q.Push(MakeTask("a", 1, 10, 1));
  q.Push(MakeTask("b", 2, 10, 2));
  q.Push(MakeTask("a", 3, 10, 3));
  EXPECT_EQ(q.NodeIds(), (std::vector<std::string>{"a", "b"}));
  const std::vector<ReplicaTask> a = q.TakeFor("a");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].blocks[0].fingerprint.bytes[0], 1);
  EXPECT_EQ(a[1].blocks[0].fingerprint.bytes[0], 3);
  EXPECT_EQ(q.blocks(), 2u);
  EXPECT_EQ(q.bytes(), 20u);
  EXPECT_EQ(q.NodeIds(), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(q.TakeFor("a").empty());
}

TEST(ReplicatorTest, AFullQueueRefusesReplicasAndCountsThemAsFailures) {
  ClientStats stats;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::latch first_put_started(1);
  std::atomic<int> puts{0};
  Replicator::Hooks hooks{.put = [&](const ReplicaTask& t) -> absl::StatusOr<std::vector<PutResult>> {
                            if (puts.fetch_add(1) == 0) {
                              first_put_started.count_down();
                              released.wait();  // holds the worker on the first task
                            }
                            return std::vector<PutResult>(t.blocks.size(), PutResult::kStored);
                          },
                          .in_ring = [](const std::string&) { return true; }};
  Replicator r({.queue_bytes = 1000, .hint_bytes = 1000, .hint_retry_interval = absl::Hours(1)}, hooks, stats);
  ASSERT_TRUE(r.Enqueue(MakeTask("a", 2, 100)));
  first_put_started.wait();                        // the worker holds the first task: the queue is empty
  ASSERT_TRUE(r.Enqueue(MakeTask("b", 9, 100)));   // 900 of 1000 bytes
  EXPECT_FALSE(r.Enqueue(MakeTask("c", 2, 100)));  // 1100: refused
  EXPECT_EQ(stats.replica_put_failures.load(), 2u);
  EXPECT_EQ(r.Flush(absl::ZeroDuration()).code(), absl::StatusCode::kDeadlineExceeded);
  release.set_value();
  EXPECT_OK(r.Flush(absl::Hours(1)));
  EXPECT_EQ(stats.replica_puts.load(), 11u);
  EXPECT_EQ(stats.hints_queued.load(), 0u);
}

TEST(ReplicatorTest, BlocksOfADownOwnerAreHintedAndDeliveredWhenItReturns) {
  ClientStats stats;
  std::mutex mu;
  bool up = false;                        // guarded by mu
  std::vector<std::string> delivered_to;  // guarded by mu
  std::latch delivered(1);
  Replicator::Hooks hooks{.put = [&](const ReplicaTask& t) -> absl::StatusOr<std::vector<PutResult>> {
                            std::lock_guard<std::mutex> lock(mu);
                            if (t.node_id == "down" && !up)
                              return std::vector<PutResult>(t.blocks.size(), PutResult::kError);
                            if (t.node_id == "down") {
                              delivered_to.push_back(t.node_id);
                              if (delivered_to.size() == 1) delivered.count_down();
                            }
                            // Every block of the "full" owner finds no space: refused, counted, not hinted.
                            std::vector<PutResult> results(t.blocks.size(), PutResult::kStored);
                            if (t.node_id == "full") results.assign(t.blocks.size(), PutResult::kNoSpace);
                            return results;
                          },
                          .in_ring = [&](const std::string&) { return true; }};
  Replicator r({.queue_bytes = 1 << 20, .hint_bytes = 1 << 20, .hint_retry_interval = absl::Milliseconds(1)}, hooks,
               stats);
  ASSERT_TRUE(r.Enqueue(MakeTask("down", 3, 100)));
  ASSERT_TRUE(r.Enqueue(MakeTask("full", 2, 100)));
  EXPECT_OK(r.Flush(absl::Hours(1)));
  EXPECT_EQ(stats.hints_queued.load(), 3u);
  EXPECT_EQ(stats.replica_put_failures.load(), 5u);  // 3 errors (then hinted) + 2 without space
  EXPECT_EQ(stats.hints_delivered.load(), 0u);
  {
    std::lock_guard<std::mutex> lock(mu);
    up = true;
  }
  delivered.wait();  // the next hint round finds the owner answering
  EXPECT_OK(r.Flush(absl::Hours(1)));
  // hints_delivered is counted right after the put returns; wait for the hint queue to empty.
  while (r.hinted_blocks() != 0 || stats.hints_delivered.load() < 3) std::this_thread::yield();
  EXPECT_EQ(stats.hints_delivered.load(), 3u);
  EXPECT_EQ(stats.replica_puts.load(), 3u);
  EXPECT_EQ(stats.hints_dropped.load(), 0u);
}

TEST(ReplicatorTest, TheHintQueueDropsTheOldestHintsBeyondItsBound) {
  ClientStats stats;
  Replicator::Hooks hooks{.put = [](const ReplicaTask&) -> absl::StatusOr<std::vector<PutResult>> {
                            return absl::UnavailableError("not in the ring");
                          },
                          .in_ring = [](const std::string&) { return false; }};
  Replicator r({.queue_bytes = 1 << 20, .hint_bytes = 500, .hint_retry_interval = absl::Hours(1)}, hooks, stats);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(r.Enqueue(MakeTask("gone", 2, 100, static_cast<uint8_t>(i))));
  EXPECT_OK(r.Flush(absl::Hours(1)));
  EXPECT_EQ(stats.hints_queued.load(), 8u);
  EXPECT_EQ(stats.hints_dropped.load(), 4u);  // 800 bytes hinted, 500 kept: the two oldest tasks went
  EXPECT_EQ(r.hinted_blocks(), 4u);
  EXPECT_EQ(stats.replica_puts.load(), 0u);
}

}  // namespace
}  // namespace kvtier::client
