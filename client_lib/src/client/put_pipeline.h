// Private to kvtier_client: the order in which one owner's put batches run within one Put call.
#ifndef KVTIER_CLIENT_SRC_CLIENT_PUT_PIPELINE_H_
#define KVTIER_CLIENT_SRC_CLIENT_PUT_PIPELINE_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <span>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "kvtier/client/client.h"

namespace kvtier::client {

// One owner's put batches, pipelined: up to `depth` batches in flight at once, so that the next
// batch's reservation and sends overlap the previous one's completion (its last bytes landing, the
// check and the commit).
//
// Two batches in flight can take a small tier whole between their reservations (everything reserved,
// nothing evictable), so that the later one is refused NO_SPACE where it would have evicted the
// earlier one's blocks had it waited. A batch that was refused blocks while another attempt overlapped
// its own retries them Alone(): once every attempt in flight has ended, with no new one starting until
// it is done. Its answer is then the owner's answer to that batch alone.
//
// Thread-safety: Run is called once; Shared and Alone are called from the put_batch that Run runs, on
// any of its threads.
class PutPipeline {
 public:
  explicit PutPipeline(size_t depth) : depth_(std::max<size_t>(depth, 1)) {}

  // Runs put_batch(g) for every g in [first, last) in order of g, up to depth at once (threads beyond
  // the caller's). Once put_batch returns true (e.g. the owner failed a whole batch, or refused the
  // request) no further batch starts; those in flight finish. Returns when all have.
  template <typename Fn>
  void Run(size_t first, size_t last, Fn put_batch) {
    std::atomic<size_t> next{first};
    std::atomic<bool> stop{false};
    auto run = [&] {
      for (size_t g = 0; !stop.load(std::memory_order_acquire) && (g = next.fetch_add(1)) < last;) {
        if (put_batch(g)) stop.store(true, std::memory_order_release);
      }
    };
    std::vector<std::thread> helpers;
    for (size_t i = 1; i < std::min(depth_, last - first); ++i) helpers.emplace_back(run);
    run();
    for (std::thread& t : helpers) t.join();
  }

  // Runs fn() as one attempt among those in flight; waits first while an Alone() is waiting or running.
  // True when another attempt ran at some moment during this one.
  template <typename Fn>
  bool Shared(Fn fn) {
    uint64_t mine = 0;
    bool overlapped = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return alone_waiting_ == 0 && !alone_running_; });
      mine = ++starts_;
      overlapped = active_ > 0;
      ++active_;
    }
    fn();
    std::lock_guard<std::mutex> lock(mu_);
    --active_;
    overlapped |= starts_ != mine;
    cv_.notify_all();
    return overlapped;
  }

  // Runs fn() with no other attempt in flight: waits for those running to end, and holds back new ones
  // (Shared) until fn returns.
  template <typename Fn>
  void Alone(Fn fn) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++alone_waiting_;
      cv_.wait(lock, [&] { return active_ == 0 && !alone_running_; });
      --alone_waiting_;
      alone_running_ = true;
    }
    fn();
    std::lock_guard<std::mutex> lock(mu_);
    alone_running_ = false;
    cv_.notify_all();
  }

  // One batch of n blocks: put(positions, out) puts the blocks at `positions` (indices into the batch)
  // and fills `out` with one result per position, or returns the owner's refusal of the request. Runs it
  // for the whole batch Shared; if that overlapped another attempt and some blocks came back kNoSpace,
  // runs it once more for those Alone. `results` gets one result per block of the batch. Returns the
  // first refusal (the results are then not all filled).
  template <typename Put>
  absl::Status PutBatch(size_t n, Put put, std::vector<PutResult>& results) {
    std::vector<uint32_t> all(n);
    std::iota(all.begin(), all.end(), 0u);
    absl::Status s;
    const bool overlapped = Shared([&] { s = put(std::span<const uint32_t>(all), results); });
    if (!s.ok() || !overlapped) return s;
    std::vector<uint32_t> again;
    for (uint32_t k = 0; k < results.size(); ++k) {
      if (results[k] == PutResult::kNoSpace) again.push_back(k);
    }
    if (again.empty()) return s;
    std::vector<PutResult> retried;
    Alone([&] { s = put(std::span<const uint32_t>(again), retried); });
    for (size_t j = 0; s.ok() && j < again.size() && j < retried.size(); ++j) results[again[j]] = retried[j];
    return s;
  }

  size_t depth() const { return depth_; }
  // Alone() calls waiting for the attempts in flight to end (diagnostics and tests).
  size_t alone_waiting() const {
    std::lock_guard<std::mutex> lock(mu_);
    return alone_waiting_;
  }

 private:
  const size_t depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t active_ = 0;           // guarded by mu_: Shared attempts running
  uint64_t starts_ = 0;         // guarded by mu_: Shared attempts started so far
  size_t alone_waiting_ = 0;    // guarded by mu_
  bool alone_running_ = false;  // guarded by mu_
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_PUT_PIPELINE_H_
