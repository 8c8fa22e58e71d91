// Checks shared by the tests of the components' counter visitors (kvtier/common/counters.h).
#ifndef KVTIER_TESTS_TESTING_COUNTER_CHECKS_H_
#define KVTIER_TESTS_TESTING_COUNTER_CHECKS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/common/counters.h"

namespace kvtier::testing {

// One visited sample, its strings copied out of the visit.
struct VisitedSample {
  std::string name, help, sample;  // sample: SampleName()
  CounterKind kind = CounterKind::kCounter;
  std::vector<std::pair<std::string, std::string>> labels;
  uint64_t value = 0;
};

// Collects what `for_each(visitor)` reports.
template <typename ForEach>
std::vector<VisitedSample> Visit(ForEach&& for_each) {
  std::vector<VisitedSample> out;
  for_each([&](const CounterInfo& info, uint64_t value) {
    VisitedSample s{.name = std::string(info.name),
                    .help = std::string(info.help),
                    .sample = SampleName(info),
                    .kind = info.kind,
                    .value = value};
    for (const auto& [k, v] : info.labels) s.labels.emplace_back(std::string(k), std::string(v));
    out.push_back(std::move(s));
  });
  return out;
}

// Prometheus conventions (docs/architecture.md, "Counters"): valid names and label names, samples
// unique, counters end in "_total" and gauges do not (when `prometheus`), one help and one kind per family,
// and every help non-empty.
inline void ExpectWellFormed(const std::vector<VisitedSample>& samples, bool prometheus = true) {
  std::set<std::string> seen;
  std::map<std::string, std::pair<std::string, CounterKind>> families;
  for (const VisitedSample& s : samples) {
    SCOPED_TRACE(s.sample);
    EXPECT_TRUE(IsValidMetricName(s.name));
    EXPECT_TRUE(seen.insert(s.sample).second) << "listed twice";
    EXPECT_FALSE(s.help.empty());
    for (const auto& [k, v] : s.labels) {
      EXPECT_TRUE(IsValidLabelName(k)) << k;
      EXPECT_FALSE(v.empty()) << k;
    }
    if (prometheus) {
      EXPECT_EQ(s.name.rfind("kvtier_", 0), 0u);
      const bool total = s.name.size() > 6 && s.name.compare(s.name.size() - 6, 6, "_total") == 0;
      EXPECT_EQ(total, s.kind == CounterKind::kCounter) << "counters, and only they, end in _total";
    }
    const auto [it, inserted] = families.try_emplace(s.name, s.help, s.kind);
    if (!inserted) {
      EXPECT_EQ(it->second.first, s.help) << "one help per family";
      EXPECT_EQ(it->second.second, s.kind) << "one kind per family";
    }
  }
}

// For a struct made only of `N` std::atomic<uint64_t> (checked by the caller with AggregateFieldCount):
// sets each field in turn to a distinct value, the others to 0, and expects exactly one sample of
// `for_each` to carry it. So every field is listed, once.
template <typename Stats, typename ForEach>
void ExpectEachFieldInOneSample(Stats& stats, size_t n, ForEach&& for_each) {
  static_assert(std::is_standard_layout_v<std::atomic<uint64_t>>);
  ASSERT_EQ(sizeof(Stats), n * sizeof(std::atomic<uint64_t>)) << "every field is a std::atomic<uint64_t>";
  auto* fields = reinterpret_cast<std::atomic<uint64_t>*>(&stats);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) fields[j].store(0);
    const uint64_t mark = 1000003 + i;
    fields[i].store(mark);
    size_t carried = 0;
    for (const VisitedSample& s : Visit(for_each)) carried += s.value == mark ? 1 : 0;
    EXPECT_EQ(carried, 1u) << "field #" << i << " (declaration order) is in " << carried << " samples";
  }
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_COUNTER_CHECKS_H_
