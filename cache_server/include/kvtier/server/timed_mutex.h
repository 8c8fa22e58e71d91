// A mutex that can measure how long the calling thread holds it: how bench/store_bench reports the
// share of each operation's time spent holding a store lock.
#ifndef KVTIER_SERVER_TIMED_MUTEX_H_
#define KVTIER_SERVER_TIMED_MUTEX_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace kvtier::server {

// A std::mutex (so ThreadSanitizer sees it) meeting the Lockable requirements (lock_guard,
// unique_lock, std::condition_variable_any), that adds the time each hold lasted to a per-thread
// total while measuring is on. Measuring is off by default and then costs one relaxed load per lock.
// Thread-safety: as std::mutex; SetMeasuring and HeldNanosOfThisThread from any thread.
class TimedMutex {
 public:
  // What a mutex guards, so holds are told apart: the store's one lock (everything but lookups without
  // a lease) or one of the committed index's shard locks (many, each for a share of the keys).
  enum class Kind : uint8_t { kStore = 0, kIndexShard = 1 };
  static constexpr int kKinds = 2;

  explicit TimedMutex(Kind kind = Kind::kStore) : kind_(static_cast<uint8_t>(kind)) {}
  TimedMutex(const TimedMutex&) = delete;
  TimedMutex& operator=(const TimedMutex&) = delete;

  void lock() {
    mu_.lock();
    if (measuring_.load(std::memory_order_relaxed)) locked_at_ = Now();
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
    if (measuring_.load(std::memory_order_relaxed)) locked_at_ = Now();
    return true;
  }
  void unlock() {
    if (locked_at_ != 0) {
      held_ns_[kind_] += Now() - locked_at_;
      locked_at_ = 0;
    }
    mu_.unlock();
  }

  // Turns measuring on or off for every TimedMutex of the process. A hold that started while it was
  // off is not counted.
  static void SetMeasuring(bool on) { measuring_.store(on, std::memory_order_relaxed); }
  // Nanoseconds the calling thread has held TimedMutexes of `kind` while measuring, since it started.
  static uint64_t HeldNanosOfThisThread(Kind kind) { return held_ns_[static_cast<int>(kind)]; }

 private:
  static uint64_t Now() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }

  std::mutex mu_;
  const uint8_t kind_;
  uint64_t locked_at_ = 0;  // written by the holder only; 0: this hold is not measured
  static inline std::atomic<bool> measuring_{false};
  static inline thread_local uint64_t held_ns_[kKinds] = {};
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_TIMED_MUTEX_H_
