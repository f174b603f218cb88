// mc-bench's statistics helpers: percentiles, medians and the CPU readings printed beside every
// throughput figure.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "gtest/gtest.h"
#include "tools/mc_bench_stats.h"

namespace mc::bench {
namespace {

TEST(BenchStatsTest, PercentilesAndMedian) {
  LatencySummary s = Summarize({4, 1, 3, 2});
  EXPECT_EQ(s.p50_ms, 3);
  EXPECT_EQ(s.max_ms, 4);
  EXPECT_EQ(Summarize({}).p99_ms, 0);
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({}), 0);
}

// Burns about `seconds` of this thread's CPU time.
void Spin(double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  volatile uint64_t x = 0;
  while (std::chrono::steady_clock::now() < until) x = x + 1;
}

TEST(BenchStatsTest, ParsesPidListsAndNamesTheBadPart) {
  std::vector<int> pids;
  std::string bad;
  EXPECT_TRUE(ParsePids("12,,34", &pids, &bad));
  EXPECT_EQ(pids, (std::vector<int>{12, 34}));
  EXPECT_TRUE(ParsePids("", &pids, &bad));
  EXPECT_EQ(pids.size(), 2u);
  for (const char* wrong : {"1,x", "0", "-5", "99999999999"}) {
    EXPECT_FALSE(ParsePids(wrong, &pids, &bad)) << wrong;
  }
  EXPECT_EQ(bad, "99999999999");
}

TEST(BenchStatsTest, OwnCpuGrowsWithWork) {
  double before = OwnCpuSeconds();
  Spin(0.05);
  EXPECT_GT(OwnCpuSeconds(), before);
}

TEST(BenchStatsTest, ProcessCpuReadsThisProcessAndRefusesTheGone) {
  // /proc counts in clock ticks (10 ms): after 0.2 s of spinning it has moved.
  double before = ProcessCpuSeconds(getpid());
  ASSERT_GE(before, 0);
  Spin(0.2);
  EXPECT_GT(ProcessCpuSeconds(getpid()), before);
  EXPECT_GE(ProcessesCpuSeconds({getpid(), getpid()}), 2 * before);
  EXPECT_EQ(ProcessesCpuSeconds({}), 0);

  // A pid that is gone (a reaped child) reads as "not measured", and so does any list with it.
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_LT(ProcessCpuSeconds(child), 0);
  EXPECT_LT(ProcessesCpuSeconds({getpid(), child}), 0);
}

}  // namespace
}  // namespace mc::bench
