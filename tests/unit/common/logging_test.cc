// MC_LOG_EVERY: one line per interval per call site, with the count of what it dropped.
#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "common/logging.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"

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
  void Emit(int i) {
    MC_LOG_EVERY(std::chrono::milliseconds(200), Logger("logtest"), warn, "event {}", i);
  }
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

TEST_F(LogEveryTest, OneLinePerIntervalThenTheSuppressedCount) {
  for (int i = 0; i < 5; ++i) Emit(i);
  EXPECT_EQ(out_.str(), "warning event 0\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  Emit(5);
  EXPECT_EQ(out_.str(), "warning event 0\nwarning event 5 (4 similar messages suppressed)\n");
}

}  // namespace
}  // namespace mc
