#include "common/status_page.h"

#include <string>

#include "common/metrics.h"
#include "gtest/gtest.h"

namespace mc {
namespace {

TEST(HtmlEscape, EscapesMarkupQuotesAndControlCharacters) {
  EXPECT_EQ(HtmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(HtmlEscape(std::string("x\0y\x1b", 4)), "x\xEF\xBF\xBDy\xEF\xBF\xBD");
  EXPECT_EQ(HtmlEscape("tab\tnewline\n"), "tab\tnewline\n");
}

TEST(StatusPage, DataIsEscapedEverywhereAndNothingLoadsOrRuns) {
  StatusPage page;
  page.title = "mc-client <b>";
  page.status_line = "Client <script>alert(1)</script> | Registered: yes";
  page.sections.push_back({"S<1>", {{"label\"x", "<img src=x onerror=alert(1)>", true}}});
  page.tables.push_back({"T", {"id'"}, {{"</td><script>"}}, 3});
  const std::string html = RenderStatusPageHtml(page);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("&lt;img src=x onerror=alert(1)&gt;"), std::string::npos);
  EXPECT_NE(html.find("&lt;/td&gt;&lt;script&gt;"), std::string::npos);
  EXPECT_NE(html.find("label&quot;x"), std::string::npos);
  EXPECT_NE(html.find("and 3 more"), std::string::npos);
  EXPECT_NE(html.find("class=\"alert\""), std::string::npos);
  // No external asset, and a policy that forbids any.
  EXPECT_NE(html.find("default-src 'none'"), std::string::npos);
  EXPECT_EQ(html.find("src="), html.find("src=x"));  // the escaped text only
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
}

TEST(StatusPage, EmptyTableSaysNone) {
  StatusPage page;
  page.tables.push_back({"Clients", {"a", "b"}, {}, 0});
  EXPECT_NE(RenderStatusPageHtml(page).find("<td colspan=\"2\">none</td>"), std::string::npos);
}

TEST(StatusLineRows, SplitsKeyValueParts) {
  const auto rows =
      StatusLineRows("Client c<1> | Registered: yes | Segments: 1 (256.00 MB) | SSD Storage: off");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].label, "Client");
  EXPECT_EQ(rows[0].value, "c<1>");
  EXPECT_EQ(rows[1].label, "Registered");
  EXPECT_EQ(rows[1].value, "yes");
  EXPECT_EQ(rows[2].value, "1 (256.00 MB)");
  EXPECT_EQ(rows[3].label, "SSD Storage");
  EXPECT_TRUE(StatusLineRows("").empty());
}

TEST(MetricsValues, MatchLabelsAndSumAllKinds) {
  MetricsRegistry registry;
  registry.GetCounter("c_total", "", {{"rpc", "Get"}, {"code", "OK"}}).Inc(3);
  registry.GetCounter("c_total", "", {{"rpc", "Get"}, {"code", "NOT_FOUND"}}).Inc(2);
  registry.GetCounter("c_total", "", {{"rpc", "Put"}, {"code", "OK"}}).Inc(7);
  registry.GetCounter("c_total", "", {{"rpc", "a\"b,code=\\\"OK"}}).Inc(100);
  registry.GetGauge("g", "").Set(-4);
  registry.AddCallbackGauge("cb", "", [] { return 2.5; });
  registry.GetHistogram("h", "").Observe(0.001);
  EXPECT_EQ(registry.Sum("c_total", {{"rpc", "Get"}}), 5);
  EXPECT_EQ(registry.Sum("c_total", {{"code", "OK"}}), 10);  // not the escaped look-alike
  EXPECT_EQ(registry.Sum("c_total", {{"rpc", "Get"}, {"code", "OK"}}), 3);
  EXPECT_EQ(registry.Sum("c_total", {{"rpc", "a\"b,code=\\\"OK"}}), 100);
  EXPECT_EQ(registry.Sum("c_total"), 112);
  EXPECT_EQ(registry.Sum("g"), -4);
  EXPECT_EQ(registry.Sum("cb"), 2.5);
  EXPECT_EQ(registry.Sum("h"), 1);
  EXPECT_EQ(registry.Sum("unknown"), 0);
  EXPECT_TRUE(registry.Values("unknown").empty());
  EXPECT_EQ(MetricValue(registry, "c_total", {{"rpc", "Put"}}), "7");
  EXPECT_EQ(MetricValue(registry, "cb"), "2.5");
}

TEST(AddMetricBreakdown, TotalThenNonZeroSeriesByLabel) {
  MetricsRegistry registry;
  registry.GetCounter("lost_total", "", {{"reason", "corrupt"}});
  registry.GetCounter("lost_total", "", {{"reason", "ssd_reclaimed"}}).Inc(4);
  StatusPage::Section section;
  AddMetricBreakdown(section, registry, "Objects lost", "lost_total", "reason", true);
  ASSERT_EQ(section.rows.size(), 2u);
  EXPECT_EQ(section.rows[0].label, "Objects lost");
  EXPECT_EQ(section.rows[0].value, "4");
  EXPECT_TRUE(section.rows[0].alert);
  EXPECT_EQ(section.rows[1].label, "  ssd_reclaimed");

  MetricsRegistry quiet;
  quiet.GetCounter("lost_total", "", {{"reason", "corrupt"}});
  StatusPage::Section calm;
  AddMetricBreakdown(calm, quiet, "Objects lost", "lost_total", "reason", true);
  ASSERT_EQ(calm.rows.size(), 1u);
  EXPECT_FALSE(calm.rows[0].alert);
}

}  // namespace
}  // namespace mc
