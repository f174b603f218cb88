// StoreAuth and its helpers: the TCP token check (constant-time, counted refusals), the token
// file's rules, the socket mode parser, and the caller's owner key.
#include "client/access/store_auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "client/access/caller_limits.h"
#include "gtest/gtest.h"

namespace mc::client {
namespace {

const std::string kToken(40, 't');

uint64_t Failures(MetricsRegistry& m, const char* reason) {
  return m.GetCounter("mc_store_auth_failures_total", "", {{"reason", reason}}).Value();
}

class TokenFile {
 public:
  TokenFile(const std::string& content, mode_t mode)
      : path_(::testing::TempDir() + "/store-token-" + std::to_string(getpid()) + "-" +
              std::to_string(counter_++)) {
    std::ofstream(path_) << content;
    chmod(path_.c_str(), mode);
  }
  ~TokenFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

TEST(StoreAuth, TcpCallWithoutTokenIsUnauthenticatedAndCounted) {
  MetricsRegistry m;
  StoreAuth auth({.token = kToken}, m);
  absl::Status s = auth.Check("ipv4:127.0.0.1:4000", "", "");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_EQ(Failures(m, "missing_token"), 1u);
  EXPECT_EQ(auth.Check("ipv4:127.0.0.1:4000", "Basic abc", "").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Failures(m, "missing_token"), 2u);
}

TEST(StoreAuth, TcpCallWithWrongTokenIsUnauthenticatedAndCounted) {
  MetricsRegistry m;
  StoreAuth auth({.token = kToken}, m);
  for (const std::string& wrong : {std::string(40, 'x'), kToken + "x", kToken.substr(1)}) {
    EXPECT_EQ(auth.Check("ipv6:[::1]:4000", "Bearer " + wrong, "").code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(auth.Check("ipv6:[::1]:4000", "", wrong).code(), absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(Failures(m, "wrong_token"), 6u);
}

TEST(StoreAuth, RightTokenInEitherHeaderPasses) {
  MetricsRegistry m;
  StoreAuth auth({.token = kToken}, m);
  EXPECT_TRUE(auth.Check("ipv4:10.0.0.1:1", "Bearer " + kToken, "").ok());
  EXPECT_TRUE(auth.Check("ipv4:10.0.0.1:1", "bearer  " + kToken + " ", "").ok());
  EXPECT_TRUE(auth.Check("ipv4:10.0.0.1:1", "", kToken).ok());
  EXPECT_EQ(Failures(m, "wrong_token") + Failures(m, "missing_token"), 0u);
}

TEST(StoreAuth, UnixSocketCallsAndOptOutNeedNoToken) {
  MetricsRegistry m;
  StoreAuth auth({.token = kToken}, m);
  EXPECT_TRUE(auth.Check("unix:/run/mc.sock", "", "").ok());
  StoreAuth open_tcp({.token = "", .tcp_auth = false}, m);
  EXPECT_TRUE(open_tcp.Check("ipv4:1.2.3.4:5", "", "").ok());
  StoreAuth no_token({.token = ""}, m);
  EXPECT_EQ(no_token.Check("ipv4:1.2.3.4:5", "Bearer ", "").code(),
            absl::StatusCode::kUnauthenticated)
      << "no configured token never matches";
}

TEST(StoreAuth, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
}

TEST(StoreAuth, OwnerIsTheLiveSessionElseTheTransportsAnonymousBucket) {
  class OneSession : public CallerSessions {
   public:
    bool IsLive(std::string_view owner) const override { return owner == "live"; }
  } sessions;
  EXPECT_EQ(*StoreAuth::OwnerOf("unix:/x", "live", &sessions), "live");
  EXPECT_EQ(*StoreAuth::OwnerOf("ipv4:10.1.2.3:555", "", &sessions), "anon:ipv4:10.1.2.3");
  EXPECT_EQ(*StoreAuth::OwnerOf("unix:/x", "live", nullptr), "anon:unix");
}

TEST(StoreAuth, ASessionTokenThatNamesNoLiveSessionIsASessionLostError) {
  // A daemon restarted under its caller: the caller's token and buffer ids mean nothing here.
  class OneSession : public CallerSessions {
   public:
    bool IsLive(std::string_view owner) const override { return owner == "live"; }
  } sessions;
  absl::StatusOr<std::string> lost = StoreAuth::OwnerOf("unix:/x", "dead", &sessions);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(lost.status().message()).rfind(StoreAuth::kSessionLost, 0), 0u)
      << lost.status();
}

TEST(StoreAuth, TokenFileMustBePrivateAndLongEnough) {
  TokenFile good("  " + kToken + "\n", 0600);
  auto token = LoadStoreToken(good.path());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kToken);
  TokenFile readable(kToken, 0640);
  EXPECT_NE(LoadStoreToken(readable.path()).status().message().find("mode 0640"), std::string::npos)
      << LoadStoreToken(readable.path()).status();
  TokenFile world(kToken, 0604);
  EXPECT_FALSE(LoadStoreToken(world.path()).ok());
  TokenFile short_token(std::string(31, 'a'), 0600);
  EXPECT_NE(LoadStoreToken(short_token.path()).status().message().find("at least 32"),
            std::string::npos);
  TokenFile spaced(std::string(20, 'a') + " " + std::string(20, 'b'), 0600);
  EXPECT_FALSE(LoadStoreToken(spaced.path()).ok());
  EXPECT_FALSE(LoadStoreToken("/nonexistent/store.token").ok());
}

TEST(StoreAuth, SocketModeParsing) {
  EXPECT_EQ(*ParseSocketMode("0660"), 0660u);
  EXPECT_EQ(*ParseSocketMode("600"), 0600u);
  EXPECT_EQ(*ParseSocketMode("0o666"), 0666u);
  for (const char* bad : {"", "0999", "rw", "04660", "01777", "0400", "0060", "12345"}) {
    EXPECT_FALSE(ParseSocketMode(bad).ok()) << bad;
  }
  EXPECT_EQ(*ParseGroup("0"), 0u);
  EXPECT_FALSE(ParseGroup("no-such-group-mc-test").ok());
}

TEST(StoreAuth, RandomTokensAre128BitHex) {
  auto a = RandomHexToken();
  auto b = RandomHexToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(CallerLimits, InFlightRequestsPerCallerAreCapped) {
  MetricsRegistry m;
  CallerLimits limits(CallerLimitsOptions{.max_inflight_per_caller = 2}, &m);
  auto a1 = limits.Enter("a");
  auto a2 = limits.Enter("a");
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = limits.Enter("a");
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a3.status().message().find("--store_max_inflight_per_caller"), std::string::npos);
  EXPECT_TRUE(limits.Enter("b").ok()) << "another caller is not starved";
  EXPECT_EQ(m.GetCounter("mc_store_limit_refusals_total", "", {{"limit", "inflight"}}).Value(), 1u);
  { auto done = std::move(*a1); }
  EXPECT_EQ(limits.InFlight("a"), 1u);
  EXPECT_TRUE(limits.Enter("a").ok());
}

TEST(CallerLimits, SessionsOfOneUidShareOneInFlightBudget) {
  MetricsRegistry m;
  CallerLimits limits(
      CallerLimitsOptions{.max_inflight_per_caller = 2, .max_inflight_per_account = 3}, &m);
  // Three sessions of uid 7: each under its own cap, together at the uid's.
  auto s1 = limits.Enter("s1", "uid:7");
  auto s2 = limits.Enter("s2", "uid:7");
  auto s3 = limits.Enter("s3", "uid:7");
  ASSERT_TRUE(s1.ok() && s2.ok() && s3.ok());
  auto s4 = limits.Enter("s4", "uid:7");
  EXPECT_EQ(s4.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s4.status().message().find("--store_max_inflight_per_uid"), std::string::npos);
  EXPECT_EQ(m.GetCounter("mc_store_limit_refusals_total", "", {{"limit", "inflight_uid"}}).Value(),
            1u);
  EXPECT_TRUE(limits.Enter("t1", "uid:8").ok()) << "another uid is not starved";
  EXPECT_EQ(limits.AccountInFlight("uid:7"), 3u);
  { auto done = std::move(*s2); }
  EXPECT_EQ(limits.AccountInFlight("uid:7"), 2u);
  EXPECT_TRUE(limits.Enter("s4", "uid:7").ok());
  // An owner without an account is its own.
  auto anon = limits.Enter("anon:unix");
  ASSERT_TRUE(anon.ok());
  EXPECT_EQ(limits.AccountInFlight("anon:unix"), 1u);
}

TEST(CallerLimits, SlicesInFlightAreBoundedPerUidAndDaemonWideAndGivenBack) {
  MetricsRegistry m;
  CallerLimits limits(CallerLimitsOptions{.max_inflight_per_caller = 0,
                                          .max_inflight_per_account = 0,
                                          .max_slices = 100,
                                          .max_slices_per_account = 60},
                      &m);
  auto a = limits.Enter("a1", "uid:1");
  auto b = limits.Enter("a2", "uid:1");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->ReserveSlices(40).ok());
  absl::Status over = b->ReserveSlices(21);  // 40 + 21 > 60 of uid 1
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("--store_max_inflight_slices_per_uid"), std::string::npos);
  EXPECT_TRUE(b->ReserveSlices(20).ok());
  EXPECT_EQ(limits.AccountSlices("uid:1"), 60u);

  auto c = limits.Enter("c1", "uid:2");
  ASSERT_TRUE(c.ok());
  absl::Status full = c->ReserveSlices(41);  // 60 + 41 > 100 of the daemon
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("--store_max_inflight_slices="), std::string::npos);
  EXPECT_TRUE(c->ReserveSlices(40).ok());
  EXPECT_EQ(limits.SlicesInFlight(), 100u);
  // A huge reservation cannot wrap the counters around.
  auto d = limits.Enter("d1", "uid:3");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->ReserveSlices(~0ull).ok());

  { auto done = std::move(*a); }  // its 40 slices come back with it
  EXPECT_EQ(limits.AccountSlices("uid:1"), 20u);
  EXPECT_EQ(limits.SlicesInFlight(), 60u);
  { auto done = std::move(*b), done2 = std::move(*c), done3 = std::move(*d); }
  EXPECT_EQ(limits.SlicesInFlight(), 0u);
  EXPECT_EQ(limits.AccountSlices("uid:1"), 0u);
  EXPECT_EQ(limits.AccountInFlight("uid:1"), 0u);
  // The 21 over uid 1's budget, and the ~0 one.
  EXPECT_EQ(m.GetCounter("mc_store_limit_refusals_total", "", {{"limit", "slices_uid"}}).Value(),
            2u);
  EXPECT_EQ(m.GetCounter("mc_store_limit_refusals_total", "", {{"limit", "slices"}}).Value(), 1u);
}

}  // namespace
}  // namespace mc::client
