#include "client/put_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier::client {
namespace {

using std::chrono::milliseconds;

// Counts how many calls run at once and the most seen.
struct Concurrency {
  std::atomic<int> now{0};
  std::atomic<int> most{0};
  void Enter() {
    const int n = now.fetch_add(1) + 1;
    int m = most.load();
    while (n > m && !most.compare_exchange_weak(m, n)) {
    }
  }
  void Leave() { now.fetch_sub(1); }
};

TEST(PutPipelineTest, RunsEveryBatchOnceWithAtMostDepthInFlight) {
  for (size_t depth : {1u, 2u, 3u}) {
    PutPipeline pipeline(depth);
    Concurrency c;
    std::mutex mu;
    std::vector<int> runs(10, 0);
    pipeline.Run(0, 10, [&](size_t g) {
      c.Enter();
      std::this_thread::sleep_for(milliseconds(5));
      c.Leave();
      std::lock_guard<std::mutex> lock(mu);
      ++runs[g];
      return false;
    });
    for (int n : runs) EXPECT_EQ(n, 1) << "depth " << depth;
    EXPECT_EQ(c.most.load(), static_cast<int>(depth)) << "batches of 5 ms each must overlap up to the depth";
  }
}

TEST(PutPipelineTest, NoBatchStartsAfterOneAsksToStop) {
  PutPipeline pipeline(2);
  std::atomic<int> started{0};
  std::atomic<bool> asked{false};
  std::atomic<int> started_after_asking{0};
  pipeline.Run(0, 20, [&](size_t g) {
    started.fetch_add(1);
    if (asked.load()) started_after_asking.fetch_add(1);
    std::this_thread::sleep_for(milliseconds(2));
    if (g != 3) return false;
    asked.store(true);
    return true;
  });
  // Batches 0..3 ran, and batches beside batch 3 may have started while it ran; once it asked, only the
  // other thread's check that raced with its answer may start one more.
  EXPECT_GE(started.load(), 4);
  EXPECT_LT(started.load(), 20);
  EXPECT_LE(started_after_asking.load(), 1);
}

TEST(PutPipelineTest, AloneWaitsForAttemptsInFlightAndHoldsBackNewOnes) {
  PutPipeline pipeline(2);
  std::atomic<int> shared_running{0};
  std::atomic<bool> overlap_seen{false};
  std::atomic<bool> first_running{false};
  std::thread first([&] {
    (void)pipeline.Shared([&] {
      shared_running.fetch_add(1);
      first_running = true;
      std::this_thread::sleep_for(milliseconds(50));
      shared_running.fetch_sub(1);
    });
  });
  while (!first_running.load()) std::this_thread::yield();
  std::thread alone([&] {
    pipeline.Alone([&] {
      if (shared_running.load() != 0) overlap_seen = true;
      std::this_thread::sleep_for(milliseconds(30));
      if (shared_running.load() != 0) overlap_seen = true;
    });
  });
  while (pipeline.alone_waiting() == 0) std::this_thread::yield();  // the Alone waits for the first attempt
  const bool later_overlapped = pipeline.Shared([&] {
    shared_running.fetch_add(1);
    shared_running.fetch_sub(1);
  });
  first.join();
  alone.join();
  EXPECT_FALSE(overlap_seen.load()) << "an attempt ran while the Alone did";
  EXPECT_FALSE(later_overlapped) << "the later attempt should have waited for the Alone, and so for the first";
}

// An owner with a tier of `capacity` blocks: a put reserves a slot per block (refusing NO_SPACE past
// capacity) while its bytes move, then commits them; committed blocks are evictable, reserved ones not.
class SmallTier {
 public:
  explicit SmallTier(size_t capacity) : capacity_(capacity) {}

  void Put(size_t n, std::vector<PutResult>& out) {
    out.assign(n, PutResult::kNoSpace);
    size_t got = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t k = 0; k < n && reserved_ < capacity_; ++k, ++got) {
        ++reserved_;
        out[k] = PutResult::kStored;
      }
    }
    std::this_thread::sleep_for(milliseconds(10));  // the sends and the commit
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= got;  // committed: evictable by the next reservation
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  size_t reserved_ = 0;
};

TEST(PutPipelineTest, BlocksRefusedWhileAnotherBatchHeldTheTierAreStoredOnTheirRetry) {
  SmallTier tier(4);
  PutPipeline pipeline(2);
  constexpr size_t kBatches = 6;
  std::vector<std::vector<PutResult>> results(kBatches);
  std::atomic<int> attempts{0};
  pipeline.Run(0, kBatches, [&](size_t g) {
    absl::Status s = pipeline.PutBatch(
        4,
        [&](std::span<const uint32_t> positions, std::vector<PutResult>& out) {
          attempts.fetch_add(1);
          tier.Put(positions.size(), out);
          return absl::OkStatus();
        },
        results[g]);
    EXPECT_TRUE(s.ok());
    return false;
  });
  for (size_t g = 0; g < kBatches; ++g) {
    ASSERT_EQ(results[g].size(), 4u);
    for (PutResult r : results[g]) EXPECT_EQ(r, PutResult::kStored) << "batch " << g;
  }
  EXPECT_GT(attempts.load(), static_cast<int>(kBatches)) << "two batches of 4 on a tier of 4 must have clashed";
}

TEST(PutPipelineTest, ARefusalAloneIsTheAnswerAndARefusedRequestIsNotRetried) {
  PutPipeline pipeline(1);
  std::vector<PutResult> results(3);
  int calls = 0;
  absl::Status s = pipeline.PutBatch(
      3,
      [&](std::span<const uint32_t> positions, std::vector<PutResult>& out) {
        ++calls;
        out.assign(positions.size(), PutResult::kNoSpace);
        return absl::OkStatus();
      },
      results);
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 1) << "nothing else was in flight: kNoSpace is the owner's answer";
  for (PutResult r : results) EXPECT_EQ(r, PutResult::kNoSpace);

  calls = 0;
  s = pipeline.PutBatch(
      2,
      [&](std::span<const uint32_t>, std::vector<PutResult>&) {
        ++calls;
        return absl::PermissionDeniedError("no");
      },
      results);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace kvtier::client
