#include "common/metrics.h"

#include <gtest/gtest.h>

namespace mc {
namespace {

TEST(Metrics, RendersCountersGaugesAndHistograms) {
  MetricsRegistry reg;
  reg.GetCounter("mc_requests_total", "Requests", {{"rpc", "Put"}}).Inc(3);
  reg.GetGauge("mc_keys", "Keys").Set(7);
  reg.AddCallbackGauge("mc_ratio", "Ratio", [] { return 0.5; });
  auto& h = reg.GetHistogram("mc_latency_seconds", "Latency", {}, {0.1, 1.0});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(5);
  std::string text = reg.RenderPrometheus();
  EXPECT_NE(text.find("# TYPE mc_requests_total counter"), std::string::npos);
  EXPECT_NE(text.find("mc_requests_total{rpc=\"Put\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("mc_keys 7\n"), std::string::npos);
  EXPECT_NE(text.find("mc_ratio 0.5\n"), std::string::npos);
  EXPECT_NE(text.find("mc_latency_seconds_bucket{le=\"0.10000000000000001\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("mc_latency_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("mc_latency_seconds_count 3\n"), std::string::npos);
}

TEST(Metrics, SameNameAndLabelsReturnSameCounter) {
  MetricsRegistry reg;
  Counter& a = reg.GetCounter("c", "h", {{"k", "v"}});
  Counter& b = reg.GetCounter("c", "h", {{"k", "v"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &reg.GetCounter("c", "h", {{"k", "w"}}));
}

TEST(Metrics, LabelValuesAreEscaped) {
  EXPECT_EQ(RenderLabels({{"a", "x\"y"}}), "{a=\"x\\\"y\"}");
}

}  // namespace
}  // namespace mc
