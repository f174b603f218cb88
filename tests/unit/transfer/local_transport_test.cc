#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status.h"
#include "tests/unit/transfer/transfer_test_util.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer {
namespace {

using testing::Pattern;
using testing::Request;
using testing::Split;

constexpr char kSelf[] = "10.0.0.1:7000";

class LocalTransportTest : public ::testing::Test {
 protected:
  LocalTransportTest() : segment_(64 << 20) {
    table_.Add(1, segment_.data(), segment_.size());
    TransferEngineOptions options;
    options.local_endpoint = kSelf;
    options.metrics = &metrics_;
    engine_ = std::make_unique<TransferEngine>(options, table_);
  }

  std::vector<char> segment_;
  SegmentTable table_;
  MetricsRegistry metrics_;
  std::unique_ptr<TransferEngine> engine_;
};

TEST_F(LocalTransportTest, WriteThenReadScatterGatherRoundTrips) {
  std::vector<char> a = Pattern(1, 1), b = Pattern(4097, 2), c = Pattern(1 << 20, 3);
  std::vector<TransferRequest> writes = {
      Request(OpKind::kWrite, Split(a, 1), kSelf, 1, 0),
      Request(OpKind::kWrite, Split(b, 3), kSelf, 1, 10),
      Request(OpKind::kWrite, Split(c, 7), kSelf, 1, 1 << 20),
  };
  auto wr = engine_->Submit(writes);
  ASSERT_EQ(wr.size(), 3u);
  for (auto& r : wr) ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(wr[1].bytes, 4097u);
  EXPECT_EQ(std::memcmp(segment_.data() + 10, b.data(), b.size()), 0);

  std::vector<char> ra(1), rb(4097), rc(1 << 20);
  std::vector<TransferRequest> reads = {
      Request(OpKind::kRead, Split(ra, 1), kSelf, 1, 0),
      Request(OpKind::kRead, Split(rb, 5), kSelf, 1, 10),
      Request(OpKind::kRead, Split(rc, 2), kSelf, 1, 1 << 20),
  };
  auto rr = engine_->Submit(reads);
  for (auto& r : rr) ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
  EXPECT_EQ(rc, c);
  const uint64_t moved = 2 * (1 + 4097 + (1 << 20));
  EXPECT_EQ(metrics_.GetCounter("mc_transfer_bytes_total", "", {{"transport", "local"}, {"op", "read"}}).Value() +
                metrics_.GetCounter("mc_transfer_bytes_total", "", {{"transport", "local"}, {"op", "write"}}).Value(),
            moved);
}

TEST_F(LocalTransportTest, LargeParallelCopyIsExact) {
  std::vector<char> src = Pattern(32 << 20, 9);
  std::vector<TransferRequest> w = {Request(OpKind::kWrite, Split(src, 3), kSelf, 1, 4096)};
  ASSERT_TRUE(engine_->Submit(w)[0].status.ok());
  std::vector<char> dst(32 << 20);
  std::vector<TransferRequest> r = {Request(OpKind::kRead, Split(dst, 5), kSelf, 1, 4096)};
  auto res = engine_->Submit(r);
  ASSERT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(res[0].bytes, dst.size());
  EXPECT_TRUE(dst == src);
}

TEST_F(LocalTransportTest, ReportsLocalCopyThroughput) {
  std::vector<char> dst(16 << 20);
  std::vector<TransferRequest> r = {Request(OpKind::kRead, Split(dst, 1), kSelf, 1, 0)};
  ASSERT_TRUE(engine_->Submit(r)[0].status.ok());  // warm up (page faults)
  constexpr int kRounds = 20;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) ASSERT_TRUE(engine_->Submit(r)[0].status.ok());
  const double secs = testing::SecondsSince(start);
  Logger("transfer").info("local 16 MiB read: {:.2f} GB/s",
                          kRounds * double(16 << 20) / secs / 1e9);
}

TEST_F(LocalTransportTest, ErrorsArePerRequest) {
  std::vector<char> buf(4096), empty_buf;
  std::vector<TransferRequest> reqs = {
      Request(OpKind::kRead, Split(buf, 1), kSelf, 99, 0),               // unknown segment
      Request(OpKind::kRead, Split(buf, 1), kSelf, 1, (64 << 20) - 10),  // past the end
      Request(OpKind::kRead, Split(buf, 2), kSelf, 1, 0),                // fine
      Request(OpKind::kRead, {}, kSelf, 1, 0),                           // nothing to move
      Request(OpKind::kRead, {{nullptr, 8}}, kSelf, 1, 0),               // bad buffer
  };
  auto res = engine_->Submit(reqs);
  EXPECT_EQ(ToCode(res[0].status), Code::kNotFound);
  EXPECT_EQ(ToCode(res[1].status), Code::kInvalidArgument);
  EXPECT_TRUE(res[2].status.ok());
  EXPECT_EQ(res[2].bytes, 4096u);
  EXPECT_TRUE(res[3].status.ok());
  EXPECT_EQ(res[3].bytes, 0u);
  EXPECT_EQ(ToCode(res[4].status), Code::kInvalidArgument);
  EXPECT_EQ(metrics_.GetCounter("mc_transfer_errors_total", "", {{"transport", "local"}}).Value(), 2u);
}

TEST_F(LocalTransportTest, PastDeadlineFails) {
  std::vector<char> buf(4096);
  std::vector<TransferRequest> reqs = {Request(OpKind::kRead, Split(buf, 1), kSelf, 1, 0)};
  auto res = engine_->Submit(reqs, RealClock::Get().NowMs() - 1);
  EXPECT_EQ(ToCode(res[0].status), Code::kTransferFailed);
  EXPECT_EQ(res[0].status.message(), "deadline");
}

}  // namespace
}  // namespace mc::transfer
