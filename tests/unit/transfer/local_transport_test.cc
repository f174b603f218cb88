#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status.h"
#include "tests/unit/transfer/transfer_test_util.h"
#include "transfer/transfer_engine.h"
#include "transfer/worker_pool.h"

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
      Request(Direction::kWrite, Split(a, 1), kSelf, 1, 0),
      Request(Direction::kWrite, Split(b, 3), kSelf, 1, 10),
      Request(Direction::kWrite, Split(c, 7), kSelf, 1, 1 << 20),
  };
  auto wr = engine_->Submit(writes);
  ASSERT_EQ(wr.size(), 3u);
  for (auto& r : wr) ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(wr[1].bytes, 4097u);
  EXPECT_EQ(std::memcmp(segment_.data() + 10, b.data(), b.size()), 0);

  std::vector<char> ra(1), rb(4097), rc(1 << 20);
  std::vector<TransferRequest> reads = {
      Request(Direction::kRead, Split(ra, 1), kSelf, 1, 0),
      Request(Direction::kRead, Split(rb, 5), kSelf, 1, 10),
      Request(Direction::kRead, Split(rc, 2), kSelf, 1, 1 << 20),
  };
  auto rr = engine_->Submit(reads);
  for (auto& r : rr) ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
  EXPECT_EQ(rc, c);
  const uint64_t moved = 2 * (1 + 4097 + (1 << 20));
  EXPECT_EQ(
      metrics_.GetCounter("mc_transfer_bytes_total", "", {{"transport", "local"}, {"op", "read"}})
              .Value() +
          metrics_
              .GetCounter("mc_transfer_bytes_total", "", {{"transport", "local"}, {"op", "write"}})
              .Value(),
      moved);
}

TEST_F(LocalTransportTest, LargeParallelCopyIsExact) {
  std::vector<char> src = Pattern(32 << 20, 9);
  std::vector<TransferRequest> w = {Request(Direction::kWrite, Split(src, 3), kSelf, 1, 4096)};
  ASSERT_TRUE(engine_->Submit(w)[0].status.ok());
  std::vector<char> dst(32 << 20);
  std::vector<TransferRequest> r = {Request(Direction::kRead, Split(dst, 5), kSelf, 1, 4096)};
  auto res = engine_->Submit(r);
  ASSERT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(res[0].bytes, dst.size());
  EXPECT_TRUE(dst == src);
}

TEST_F(LocalTransportTest, ReportsLocalCopyThroughput) {
  std::vector<char> dst(16 << 20);
  std::vector<TransferRequest> r = {Request(Direction::kRead, Split(dst, 1), kSelf, 1, 0)};
  ASSERT_TRUE(engine_->Submit(r)[0].status.ok());  // warm up (page faults)
  constexpr int kRounds = 20;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) ASSERT_TRUE(engine_->Submit(r)[0].status.ok());
  const double secs = testing::SecondsSince(start);
  Logger("transfer")
      .info("local 16 MiB read: {:.2f} GB/s", kRounds * double(16 << 20) / secs / 1e9);
}

TEST_F(LocalTransportTest, ErrorsArePerRequest) {
  std::vector<char> buf(4096), empty_buf;
  std::vector<TransferRequest> reqs = {
      Request(Direction::kRead, Split(buf, 1), kSelf, 99, 0),               // unknown segment
      Request(Direction::kRead, Split(buf, 1), kSelf, 1, (64 << 20) - 10),  // past the end
      Request(Direction::kRead, Split(buf, 2), kSelf, 1, 0),                // fine
      Request(Direction::kRead, {}, kSelf, 1, 0),                           // nothing to move
      Request(Direction::kRead, {{nullptr, 8}}, kSelf, 1, 0),               // bad buffer
  };
  auto res = engine_->Submit(reqs);
  EXPECT_EQ(ToCode(res[0].status), Code::kNotFound);
  EXPECT_EQ(ToCode(res[1].status), Code::kInvalidArgument);
  EXPECT_TRUE(res[2].status.ok());
  EXPECT_EQ(res[2].bytes, 4096u);
  EXPECT_TRUE(res[3].status.ok());
  EXPECT_EQ(res[3].bytes, 0u);
  EXPECT_EQ(ToCode(res[4].status), Code::kInvalidArgument);
  EXPECT_EQ(metrics_.GetCounter("mc_transfer_errors_total", "", {{"transport", "local"}}).Value(),
            2u);
}

// A target is read or written the way it can be, and a proof belongs to one direction: the
// engine refuses the others before any transport sees them (no byte moves, no transport error).
TEST_F(LocalTransportTest, TargetsAndProofsOfTheWrongDirectionAreRefused) {
  std::vector<char> buf(4096, 'x');
  std::vector<TransferRequest> reqs(6);
  reqs[0] = {Direction::kWrite, Split(buf, 1), kSelf, DiskRecord{1, 0, 0}};
  reqs[1] = {Direction::kRead, Split(buf, 1), kSelf, IndexNotice{}};
  reqs[2] = Request(Direction::kWrite, Split(buf, 1), kSelf, 1, 0);
  reqs[2].proof = Proof::kDeliveredBytes;
  reqs[3] = Request(Direction::kRead, Split(buf, 1), kSelf, 1, 0);
  reqs[3].proof = Proof::kWrittenReplica;
  // The local transport itself refuses the targets it does not serve.
  reqs[4] = {Direction::kRead, Split(buf, 1), kSelf, DiskRecord{1, 0, 0}};
  reqs[5] = {Direction::kWrite, Split(buf, 1), kSelf, IndexNotice{}};
  auto res = engine_->Submit(reqs);
  for (size_t i = 0; i < res.size(); ++i) {
    EXPECT_EQ(ToCode(res[i].status), Code::kInvalidArgument) << i << ": " << res[i].status;
    EXPECT_EQ(res[i].bytes, 0u) << i;
  }
  EXPECT_EQ(std::string(segment_.data(), 4096), std::string(4096, '\0')) << "nothing written";
  EXPECT_EQ(metrics_.GetCounter("mc_transfer_errors_total", "", {{"transport", "local"}}).Value(),
            2u);
}

TEST_F(LocalTransportTest, PastDeadlineFails) {
  std::vector<char> buf(4096);
  std::vector<TransferRequest> reqs = {Request(Direction::kRead, Split(buf, 1), kSelf, 1, 0)};
  auto res = engine_->Submit(reqs, RealClock::Get().NowMs() - 1);
  EXPECT_EQ(ToCode(res[0].status), Code::kTransferFailed);
  EXPECT_EQ(res[0].status.message(), "deadline");
}

TEST_F(LocalTransportTest, FusedChecksumIsOfTheDeliveredBytesAcrossABatch) {
  // Sizes around the 256 KiB hashing chunk, scattered; > 1 MiB in all so the batch is spread
  // over the helper threads, one request per thread at a time.
  const std::vector<uint64_t> sizes = {1,       4095,     256 << 10,      (256 << 10) + 1,
                                       3 << 20, 64 << 10, (1 << 20) + 17, 9 << 20};
  std::vector<std::vector<char>> sources, sinks;
  std::vector<TransferRequest> writes, reads;
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sources.push_back(Pattern(sizes[i], 40 + i));
    sinks.emplace_back(sizes[i]);
    writes.push_back(Request(Direction::kWrite, Split(sources.back(), 2), kSelf, 1, offset));
    reads.push_back(Request(Direction::kRead, Split(sinks.back(), 1 + i % 3), kSelf, 1, offset));
    if (i != 2) reads.back().proof = Proof::kDeliveredBytes;  // one read does not ask
    offset += sizes[i] + 3;
  }
  auto wr = engine_->Submit(writes);
  for (auto& r : wr) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_FALSE(r.checksum.has_value());
  }
  auto rr = engine_->Submit(reads);
  for (size_t i = 0; i < rr.size(); ++i) {
    ASSERT_TRUE(rr[i].status.ok()) << i << ": " << rr[i].status;
    EXPECT_EQ(rr[i].bytes, sizes[i]);
    EXPECT_TRUE(sinks[i] == sources[i]) << i;
    if (i == 2) {
      EXPECT_FALSE(rr[i].checksum.has_value());
    } else {
      ASSERT_TRUE(rr[i].checksum.has_value()) << i;
      EXPECT_EQ(*rr[i].checksum, Checksum(sinks[i].data(), sinks[i].size())) << i;
    }
  }
}

// A write asking for Proof::kWrittenReplica (a put's replica in this daemon's own segment)
// returns the XXH3-64 of the segment bytes it stored, hashed chunk by chunk as they were copied:
// in a batch spread over the helpers, alone above the parallel-copy threshold (not split: one
// pass), and with a source overlapping its destination (hashed from the destination after).
TEST_F(LocalTransportTest, AWriteProvesTheReplicaItStored) {
  const std::vector<uint64_t> sizes = {1, 4095, (256 << 10) + 1, 3 << 20, (1 << 20) + 17};
  std::vector<std::vector<char>> sources;
  std::vector<TransferRequest> writes;
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sources.push_back(Pattern(sizes[i], 70 + i));
    writes.push_back(
        Request(Direction::kWrite, Split(sources.back(), 1 + i % 3), kSelf, 1, offset));
    if (i != 1) writes.back().proof = Proof::kWrittenReplica;  // one write does not ask
    offset += sizes[i] + 5;
  }
  auto wr = engine_->Submit(writes);
  offset = 0;
  for (size_t i = 0; i < wr.size(); ++i) {
    ASSERT_TRUE(wr[i].status.ok()) << i << ": " << wr[i].status;
    if (i == 1) {
      EXPECT_FALSE(wr[i].checksum.has_value());
    } else {
      ASSERT_TRUE(wr[i].checksum.has_value()) << i;
      EXPECT_EQ(*wr[i].checksum, Checksum(segment_.data() + offset, sizes[i])) << i;
      EXPECT_EQ(*wr[i].checksum, Checksum(sources[i].data(), sizes[i])) << i;
    }
    offset += sizes[i] + 5;
  }

  std::vector<char> big = Pattern(12 << 20, 80);  // alone, above parallel_copy_threshold
  std::vector<TransferRequest> lone = {Request(Direction::kWrite, Split(big, 4), kSelf, 1, 0)};
  lone[0].proof = Proof::kWrittenReplica;
  auto lr = engine_->Submit(lone);
  ASSERT_TRUE(lr[0].status.ok()) << lr[0].status;
  EXPECT_EQ(lr[0].checksum, Checksum(segment_.data(), big.size()));
  EXPECT_EQ(lr[0].checksum, Checksum(big.data(), big.size()));

  // The source is the segment itself, shifted by 100 bytes: moved, then hashed where it landed.
  std::vector<TransferRequest> overlap = {
      Request(Direction::kWrite, {LocalBuffer{segment_.data() + 100, 1 << 20}}, kSelf, 1, 0)};
  overlap[0].proof = Proof::kWrittenReplica;
  auto orr = engine_->Submit(overlap);
  ASSERT_TRUE(orr[0].status.ok()) << orr[0].status;
  EXPECT_EQ(orr[0].checksum, Checksum(segment_.data(), 1 << 20));
  EXPECT_EQ(std::memcmp(segment_.data(), big.data() + 100, 1 << 20), 0);
}

TEST_F(LocalTransportTest, FailedReadCarriesNoChecksum) {
  std::vector<char> buf(4096), good(2 << 20);
  std::vector<TransferRequest> reqs = {
      Request(Direction::kRead, Split(buf, 1), kSelf, 99, 0),               // unknown segment
      Request(Direction::kRead, Split(buf, 1), kSelf, 1, (64 << 20) - 10),  // past the end
      Request(Direction::kRead, Split(good, 2), kSelf, 1, 0),
  };
  for (auto& r : reqs) r.proof = Proof::kDeliveredBytes;
  auto res = engine_->Submit(reqs);
  EXPECT_FALSE(res[0].status.ok());
  EXPECT_FALSE(res[0].checksum.has_value());
  EXPECT_FALSE(res[1].status.ok());
  EXPECT_FALSE(res[1].checksum.has_value());
  ASSERT_TRUE(res[2].status.ok()) << res[2].status;
  EXPECT_EQ(res[2].checksum, Checksum(good.data(), good.size()));
}

TEST_F(LocalTransportTest, ChecksumOfOverlappingReadIsOfTheDestination) {
  // Destination inside the segment, overlapping the source range: memmove, then hash.
  std::vector<char> src = Pattern(1 << 20, 77);
  std::memcpy(segment_.data(), src.data(), src.size());
  std::vector<TransferRequest> r = {
      Request(Direction::kRead, {{segment_.data() + 4096, src.size()}}, kSelf, 1, 0)};
  r[0].proof = Proof::kDeliveredBytes;
  auto res = engine_->Submit(r);
  ASSERT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(std::memcmp(segment_.data() + 4096, src.data(), src.size()), 0);
  EXPECT_EQ(res[0].checksum, Checksum(src.data(), src.size()));
}

TEST_F(LocalTransportTest, ManySmallReadsOfOneBatchAreExact) {
  std::vector<char> src = Pattern(64 * (64 << 10), 5);
  std::vector<TransferRequest> w = {Request(Direction::kWrite, Split(src, 1), kSelf, 1, 0)};
  ASSERT_TRUE(engine_->Submit(w)[0].status.ok());
  std::vector<char> dst(src.size());
  std::vector<TransferRequest> reads;
  for (int i = 0; i < 64; ++i) {
    reads.push_back(Request(Direction::kRead, {{dst.data() + i * (64 << 10), 64 << 10}}, kSelf, 1,
                            static_cast<uint64_t>(i) * (64 << 10)));
    reads.back().proof = Proof::kDeliveredBytes;
  }
  auto res = engine_->Submit(reads);
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(res[i].status.ok()) << res[i].status;
    EXPECT_EQ(res[i].checksum, Checksum(src.data() + i * (64 << 10), 64 << 10)) << i;
  }
  EXPECT_TRUE(dst == src);
}

TEST(WorkerPool, RunsEveryPartExactlyOnceUnderConcurrentCallers) {
  WorkerPool pool(2);
  constexpr int kCallers = 4, kParts = 100;
  std::vector<std::atomic<int>> counts(kCallers * kParts);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 20; ++round) {
        pool.Run(kParts, [&](size_t i) { counts[c * kParts + i].fetch_add(1); });
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    for (int i = 0; i < kParts; ++i) EXPECT_EQ(counts[c * kParts + i].load(), 20) << c << "/" << i;
  }
  std::atomic<int> alone{0};
  WorkerPool none(0);
  none.Run(5, [&](size_t) { alone.fetch_add(1); });
  EXPECT_EQ(alone.load(), 5);
}

}  // namespace
}  // namespace mc::transfer
