#include "kvtier/common/clock.h"

namespace kvtier {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();  // never destroyed: usable during shutdown
  return clock;
}

}  // namespace kvtier
