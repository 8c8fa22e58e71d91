// Clock abstraction so that lease and reservation expiry can be tested without sleeping.
#ifndef KVTIER_COMMON_CLOCK_H_
#define KVTIER_COMMON_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvtier {

// Source of the current time. Thread-safety: Now() may be called concurrently.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // The process-wide wall clock (absl::Now()). Never null; not owned by the caller.
  static Clock* Real();
};

// A clock that only moves when told to. Thread-safe. For tests.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(1)) : ns_(absl::ToUnixNanos(start)) {}
  absl::Time Now() const override { return absl::FromUnixNanos(ns_.load(std::memory_order_acquire)); }
  void Advance(absl::Duration d) { ns_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_acq_rel); }

 private:
  std::atomic<int64_t> ns_;
};

}  // namespace kvtier

#endif  // KVTIER_COMMON_CLOCK_H_
