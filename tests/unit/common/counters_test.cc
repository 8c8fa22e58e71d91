#include "kvtier/common/counters.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(CountersTest, SampleNameIsTheNameAloneWithoutLabels) {
  EXPECT_EQ(SampleName({.name = "kvtier_lookup_requests_total", .help = "h"}), "kvtier_lookup_requests_total");
}

TEST(CountersTest, SampleNameWritesLabelsInOrderAndEscapesValues) {
  const CounterInfo info{
      .name = "kvtier_x_total", .help = "h", .labels = {{"tenant", "a\"b\\c\nd"}, {"reason", "pinned_bound"}}};
  EXPECT_EQ(SampleName(info), R"(kvtier_x_total{tenant="a\"b\\c\nd",reason="pinned_bound"})");
}

TEST(CountersTest, ValidatesPrometheusNames) {
  EXPECT_TRUE(IsValidMetricName("kvtier_stored_bytes"));
  EXPECT_TRUE(IsValidMetricName("instance:kvtier_usage_ratio"));
  EXPECT_TRUE(IsValidMetricName("_x9"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("9lives"));
  EXPECT_FALSE(IsValidMetricName("kvtier-stored"));
  EXPECT_TRUE(IsValidLabelName("tier"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("__name__"));
  EXPECT_FALSE(IsValidLabelName(""));
}

TEST(CountersTest, KindNames) {
  EXPECT_STREQ(CounterKindName(CounterKind::kCounter), "counter");
  EXPECT_STREQ(CounterKindName(CounterKind::kGauge), "gauge");
}

}  // namespace
}  // namespace kvtier
