#include "kvtier/common/log.h"

#include <memory>

#include <spdlog/sinks/stdout_sinks.h>

namespace kvtier::log {

spdlog::logger& Logger() {
  // Leaked on purpose: lines may be logged from threads that outlive static destruction.
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("kvtier", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %L %v");
    l->set_level(spdlog::level::info);
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return *logger;
}

bool SetLogLevel(const std::string& level) {
  static constexpr const char* kNames[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (level == kNames[i]) {
      Logger().set_level(static_cast<spdlog::level::level_enum>(i));
      return true;
    }
  }
  return false;
}

bool RateLimit::Allow(uint64_t* suppressed) {
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t next = next_ns_.load(std::memory_order_relaxed);
  if (now < next || !next_ns_.compare_exchange_strong(next, now + interval_ns_, std::memory_order_relaxed)) {
    held_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *suppressed = held_.exchange(0, std::memory_order_relaxed);
  return true;
}

}  // namespace kvtier::log
