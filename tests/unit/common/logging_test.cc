// MC_LOG_EVERY: one line per interval per call site, with the count of what it dropped.
#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include "common/logging.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "tests/fakes/fake_clock.h"

namespace mc {
namespace {

class LogEveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sink_ = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink_->set_pattern("%l %v");
    Logger("logtest").sinks().push_back(sink_);
    Logger("logtest").set_level(spdlog::level::info);
  }
  void TearDown() override {
    auto& sinks = Logger("logtest").sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  // An interval no test run reaches: the call site's limiter runs on the real clock.
  void Emit(int i) { MC_LOG_EVERY(std::chrono::hours(1), Logger("logtest"), warn, "event {}", i); }
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

TEST_F(LogEveryTest, OneLinePerIntervalPerCallSite) {
  for (int i = 0; i < 5; ++i) Emit(i);
  EXPECT_EQ(out_.str(), "warning event 0\n");
}

TEST_F(LogEveryTest, TheNextLineAfterTheIntervalCountsWhatWasSuppressed) {
  FakeClock clock;
  RateLimiter limiter(std::chrono::milliseconds(200), clock);
  uint64_t suppressed = 99;
  EXPECT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 0u);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(limiter.Allow(&suppressed));
  clock.AdvanceMs(199);
  EXPECT_FALSE(limiter.Allow(&suppressed)) << "still inside the interval";
  clock.AdvanceMs(1);
  ASSERT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 5u);
  internal::LogWithSuppressed(Logger("logtest"), spdlog::level::warn, suppressed, "event 6");
  EXPECT_EQ(out_.str(), "warning event 6 (5 similar messages suppressed)\n");
}

}  // namespace
}  // namespace mc
