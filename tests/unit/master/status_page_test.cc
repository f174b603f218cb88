#include "master/master_status_page.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::MasterFixture;

TEST(MasterStatusPage, ShowsTiersAndEveryClientEscaped) {
  MasterFixture f;
  f.Register("<script>x</script>", {1 << 20}, 4 << 20);
  f.Register("plain", {2 << 20});
  const std::string html = MasterStatusHtml(f.svc(), nullptr, f.metrics(), f.clock());
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;x&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("<td>plain</td>"), std::string::npos);
  EXPECT_NE(html.find("Capacity per tier"), std::string::npos);
  EXPECT_NE(html.find("3.00 MB"), std::string::npos);  // memory capacity of both clients
  EXPECT_NE(html.find("leader (single master)"), std::string::npos);
  EXPECT_NE(html.find(f.svc().StatusLine().substr(0, 20)), std::string::npos);
  // The clients' session tokens never leave the master.
  for (const ClientInfo& c : f.svc().Clients()) {
    ASSERT_FALSE(c.token.empty());
    EXPECT_EQ(html.find(c.token), std::string::npos);
  }
}

// What the shards keep for leases is on the page, and comes back to 0 / 0 with the release.
TEST(MasterStatusPage, ShowsLeaseRecordsBackToZero) {
  MasterFixture f;
  f.Register("c1", {1 << 20});
  f.Put("c1", "a", 100);
  f.Put("c1", "b", 100);
  LookupBatch leased = f.svc().GetReplicas({"a", "b"}, {});
  ASSERT_TRUE(leased.results[1].status.ok());
  auto page = [&] { return MasterStatusHtml(f.svc(), nullptr, f.metrics(), f.clock()); };
  const std::string row = "Lease records (objects / grants)</td><td>";
  EXPECT_NE(page().find(row + "2 / "), std::string::npos) << page();
  EXPECT_EQ(f.svc().ReleaseLeases(leased.lease_id, {"a", "b"}), 2u);
  EXPECT_NE(page().find(row + "0 / 0<"), std::string::npos) << page();
}

TEST(MasterStatusPage, ClientTableIsBounded) {
  MasterFixture f;
  for (size_t i = 0; i < kMaxClientRows + 3; ++i) f.Register("c" + std::to_string(i), {1 << 16});
  const std::string html = MasterStatusHtml(f.svc(), nullptr, f.metrics(), f.clock());
  EXPECT_NE(html.find("and 3 more"), std::string::npos);
}

}  // namespace
}  // namespace mc::master
