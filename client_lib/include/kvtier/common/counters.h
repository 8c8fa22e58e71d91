// Counters declared once: each component lists its counters through one visitor, and /metrics, the
// admin GetStats RPC, kvtierctl stats and the bindings iterate it, so that none is left out of one of
// them. (CacheLib's getCounters(CounterVisitor&) is the model.)
#ifndef KVTIER_COMMON_COUNTERS_H_
#define KVTIER_COMMON_COUNTERS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvtier {

// kCounter: monotonic since the component started (Prometheus counter, name ends in "_total").
// kGauge: a level that goes up and down (Prometheus gauge).
enum class CounterKind : uint8_t { kCounter = 0, kGauge = 1 };

// "counter" or "gauge".
const char* CounterKindName(CounterKind kind);

// One sample a visitor reports. `name` is the Prometheus family name (server counters: "kvtier_..."; the
// client's counters use their ClientStats field names). Samples of one family differ by `labels` (a
// small fixed set of values: no per-key or per-client labels) and share `help` and `kind`.
// Ownership: every string_view is borrowed for the visitor call only.
struct CounterInfo {
  std::string_view name;
  std::string_view help;
  CounterKind kind = CounterKind::kCounter;
  std::vector<std::pair<std::string_view, std::string_view>> labels;  // (label name, value), in order
};

// Called once per sample with its description and value. Visitors call it synchronously, from the
// calling thread; values are relaxed loads, so samples of one visit are not a consistent snapshot.
using CounterVisitor = std::function<void(const CounterInfo& info, uint64_t value)>;

// The sample's name as the Prometheus text format writes it: `name` alone, or
// `name{label="value",...}` with the labels in their order and `\`, `"` and newlines escaped.
// GetStatsResponse.counters and kvtierctl stats key samples by it.
std::string SampleName(const CounterInfo& info);

// Whether `name` is a valid Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), or, for
// IsValidLabelName, label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with "__").
bool IsValidMetricName(std::string_view name);
bool IsValidLabelName(std::string_view name);

}  // namespace kvtier

#endif  // KVTIER_COMMON_COUNTERS_H_
