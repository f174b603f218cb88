#include "common/util.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/logging.h"
#include "common/status.h"

namespace mc {
namespace {

TEST(Util, ParsesHostPort) {
  auto hp = ParseHostPort("127.0.0.1:8080");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_EQ(hp->port, 8080);
  auto v6 = ParseHostPort("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_FALSE(ParseHostPort("nohost").ok());
  EXPECT_FALSE(ParseHostPort("h:99999").ok());
  EXPECT_FALSE(ParseHostPort("h:abc").ok());
}

TEST(Util, FormatsBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KB");
  EXPECT_EQ(FormatBytes(1ull << 40), "1.00 TB");
}

TEST(Util, ReadyFileIsJson) {
  std::string path = ::testing::TempDir() + "/ready.json";
  ASSERT_TRUE(WriteReadyFile(path, {{"grpc", "127.0.0.1:1"}, {"http", "127.0.0.1:2"}}).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "{\"grpc\": \"127.0.0.1:1\", \"http\": \"127.0.0.1:2\"}\n");
}

TEST(Util, ReadyFileEscapesItsStrings) {
  std::string path = ::testing::TempDir() + "/ready-escaped.json";
  ASSERT_TRUE(WriteReadyFile(path, {{"client_id", "a\"b\\c\n<d>"}}).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "{\"client_id\": \"a\\\"b\\\\c\\u000a<d>\"}\n");
}

TEST(Util, KeyForLogHexesBinaryKeys) {
  EXPECT_EQ(KeyForLog("abc"), "abc");
  EXPECT_EQ(KeyForLog(std::string("\x01\x02", 2)), "0x0102");
}

TEST(Util, LogLevelRejectsUnknownNames) {
  EXPECT_TRUE(SetLogLevel("warn"));
  EXPECT_FALSE(SetLogLevel("loud"));
  EXPECT_TRUE(SetLogLevel("info"));
}

TEST(ParseBytes, PlainAndSuffixedCounts) {
  EXPECT_EQ(*ParseBytes("65536"), 65536u);
  EXPECT_EQ(*ParseBytes("64K"), 64u << 10);
  EXPECT_EQ(*ParseBytes("64k"), 64u << 10);
  EXPECT_EQ(*ParseBytes("16MiB"), 16u << 20);
  EXPECT_EQ(*ParseBytes("1GB"), 1ull << 30);
  EXPECT_EQ(*ParseBytes("2t"), 2ull << 40);
  EXPECT_EQ(*ParseBytes("0"), 0u);
  uint64_t out = 7;
  EXPECT_TRUE(ParseBytes("4M", &out));
  EXPECT_EQ(out, 4u << 20);
}

TEST(ParseBytes, RejectsGarbageAndOverflow) {
  for (const char* bad : {"", "K", "-1", "1.5M", "12Q", "16MiBs", "1 M", "M1",
                          "99999999999999999999", "17179869184G"}) {
    EXPECT_EQ(ToCode(ParseBytes(bad).status()), Code::kInvalidArgument) << bad;
    uint64_t out = 7;
    EXPECT_FALSE(ParseBytes(bad, &out)) << bad;
    EXPECT_EQ(out, 7u) << bad;
  }
}

TEST(Util, AbsolutePath) {
  EXPECT_EQ(AbsolutePath(""), "");
  EXPECT_EQ(AbsolutePath("/abs/x.sock"), "/abs/x.sock");
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_EQ(AbsolutePath("run/c1.sock"), std::string(cwd) + "/run/c1.sock");
}

}  // namespace
}  // namespace mc
