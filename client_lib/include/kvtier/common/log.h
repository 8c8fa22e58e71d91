// Logging for every kvtier library and binary: spdlog with levels, to stderr, and rate limiting for
// lines on paths that can repeat many times a second (a failing disk, a flapping peer).
//
//   KVTIER_LOG(warn, "disk tier at {}: {}", path, why);
//   KVTIER_LOG_EVERY(std::chrono::seconds(10), error, "disk write failed: {}", why);
//
// Levels are spdlog's: trace, debug, info, warn, err, critical. The level shown is set once by the
// binary (SetLogLevel); the default is info. Never write to stderr directly from a library.
// Thread-safety: everything here may be called from any thread.
#ifndef KVTIER_COMMON_LOG_H_
#define KVTIER_COMMON_LOG_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include <spdlog/spdlog.h>

namespace kvtier::log {

// The process's kvtier logger ("kvtier", stderr, one line per message with time and level). Never null;
// created on first use and alive until exit.
spdlog::logger& Logger();

// Sets the lowest level shown. `level` is one of "trace", "debug", "info", "warn", "error", "critical",
// "off". Returns false (and changes nothing) for any other string.
bool SetLogLevel(const std::string& level);

// Lets one line through per `interval` and counts the ones it held back. One instance per call site
// (the macro below makes a static one).
class RateLimit {
 public:
  explicit RateLimit(std::chrono::nanoseconds interval) : interval_ns_(interval.count()) {}
  // True when a line may be written now; *suppressed is then the number held back since the last one.
  bool Allow(uint64_t* suppressed);

 private:
  const int64_t interval_ns_;
  std::atomic<int64_t> next_ns_{0};
  std::atomic<uint64_t> held_{0};
};

}  // namespace kvtier::log

#define KVTIER_LOG(lvl, ...) ::kvtier::log::Logger().log(::spdlog::level::lvl, __VA_ARGS__)

// At most one line per `interval` (a std::chrono duration) from this call site; a line after a quiet
// spell says how many were held back.
#define KVTIER_LOG_EVERY(interval, lvl, ...)                                                 \
  do {                                                                                       \
    static ::kvtier::log::RateLimit kvtier_rate_limit_(interval);                            \
    uint64_t kvtier_held_ = 0;                                                               \
    if (kvtier_rate_limit_.Allow(&kvtier_held_)) {                                           \
      if (kvtier_held_ == 0) {                                                               \
        KVTIER_LOG(lvl, __VA_ARGS__);                                                        \
      } else {                                                                               \
        ::kvtier::log::Logger().log(::spdlog::level::lvl, "{} ({} similar lines held back)", \
                                    ::fmt::format(__VA_ARGS__), kvtier_held_);               \
      }                                                                                      \
    }                                                                                        \
  } while (0)

#endif  // KVTIER_COMMON_LOG_H_
