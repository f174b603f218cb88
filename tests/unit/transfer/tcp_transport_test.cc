#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status.h"
#include "tests/fakes/await.h"
#include "tests/unit/transfer/transfer_test_util.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/server.h"
#include "transfer/tcp/socket_util.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer {
namespace {

using tcp::TcpDataServer;
using tcp::TcpDataServerOptions;
using testing::Pattern;
using testing::Request;
using testing::Split;

constexpr uint64_t kSegmentBytes = 48 << 20;

struct Peer {
  explicit Peer(MetricsRegistry* metrics) : memory(kSegmentBytes) {
    table.Add(5, memory.data(), memory.size());
    TcpDataServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics = metrics;
    server = std::make_unique<TcpDataServer>(options, table);
    EXPECT_TRUE(server->Start().ok());
  }
  std::vector<char> memory;
  SegmentTable table;
  std::unique_ptr<TcpDataServer> server;
};

class TcpTransportTest : public ::testing::Test {
 protected:
  TcpTransportTest() {
    peers_.push_back(std::make_unique<Peer>(&server_metrics_));
    peers_.push_back(std::make_unique<Peer>(&server_metrics_));
    TransferEngineOptions options;
    options.local_endpoint = "127.0.0.1:1";  // not the peers: everything goes over tcp
    options.metrics = &metrics_;
    engine_ = std::make_unique<TransferEngine>(options, local_table_);
  }
  const std::string& Endpoint(int peer) { return peers_[peer]->server->endpoint(); }

  MetricsRegistry server_metrics_;
  MetricsRegistry metrics_;
  std::vector<std::unique_ptr<Peer>> peers_;
  SegmentTable local_table_;
  std::unique_ptr<TransferEngine> engine_;
};

TEST_F(TcpTransportTest, PipelinedBatchRoundTripsAcrossPeers) {
  const std::vector<uint64_t> sizes = {1, 7, 4096, 65537, (1 << 20) + 3, 4 << 20, 16 << 20};
  std::vector<std::vector<char>> sources, sinks;
  std::vector<TransferRequest> writes, reads;
  for (int peer = 0; peer < 2; ++peer) {
    uint64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int pieces = 1 + static_cast<int>(i % 4);
      sources.push_back(Pattern(sizes[i], peer * 100 + i));
      sinks.emplace_back(sizes[i]);
      writes.push_back(
          Request(Direction::kWrite, Split(sources.back(), pieces), Endpoint(peer), 5, offset));
      reads.push_back(
          Request(Direction::kRead, Split(sinks.back(), 5 - pieces), Endpoint(peer), 5, offset));
      offset += sizes[i] + 13;
    }
  }
  auto wr = engine_->Submit(writes);
  for (size_t i = 0; i < wr.size(); ++i) {
    ASSERT_TRUE(wr[i].status.ok()) << i << ": " << wr[i].status;
    EXPECT_EQ(wr[i].bytes, sources[i].size());
  }
  auto rr = engine_->Submit(reads);
  for (size_t i = 0; i < rr.size(); ++i) {
    ASSERT_TRUE(rr[i].status.ok()) << i << ": " << rr[i].status;
    EXPECT_EQ(rr[i].bytes, sinks[i].size());
    EXPECT_TRUE(sinks[i] == sources[i]) << "request " << i;
  }
  EXPECT_GT(
      metrics_.GetCounter("mc_transfer_bytes_total", "", {{"transport", "tcp"}, {"op", "read"}})
          .Value(),
      0u);
}

TEST_F(TcpTransportTest, OutOfBoundsFailsAloneInItsBatch) {
  std::vector<char> src = Pattern(100000, 1), big = Pattern(1 << 20, 2);
  std::vector<char> dst(100000), dst_bad(1 << 20);
  std::vector<TransferRequest> writes = {
      Request(Direction::kWrite, Split(src, 2), Endpoint(0), 5, 0),
      Request(Direction::kWrite, Split(big, 2), Endpoint(0), 5,
              kSegmentBytes - 10),                                   // past the end
      Request(Direction::kWrite, Split(big, 1), Endpoint(0), 6, 0),  // no segment
      Request(Direction::kWrite, Split(src, 3), Endpoint(0), 5, 200000),
  };
  auto wr = engine_->Submit(writes);
  EXPECT_TRUE(wr[0].status.ok()) << wr[0].status;
  EXPECT_EQ(ToCode(wr[1].status), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(wr[2].status), Code::kNotFound);
  EXPECT_TRUE(wr[3].status.ok()) << wr[3].status;
  std::vector<TransferRequest> reads = {
      Request(Direction::kRead, Split(dst_bad, 1), Endpoint(0), 5, UINT64_MAX - 100),  // overflow
      Request(Direction::kRead, Split(dst, 4), Endpoint(0), 5, 200000),
  };
  auto rr = engine_->Submit(reads);
  EXPECT_FALSE(rr[0].status.ok());
  ASSERT_TRUE(rr[1].status.ok()) << rr[1].status;
  EXPECT_TRUE(dst == src);
  EXPECT_GE(metrics_.GetCounter("mc_transfer_errors_total", "", {{"transport", "tcp"}}).Value(),
            3u);
}

TEST_F(TcpTransportTest, FramesForAnUnpublishedSegmentAreRefusedAndCounted) {
  // A reader or writer of an earlier registration names a segment id that is gone.
  std::vector<char> src = Pattern(1000, 3), dst(1000);
  std::vector<TransferRequest> reqs = {
      Request(Direction::kWrite, Split(src, 1), Endpoint(0), 77, 0),
      Request(Direction::kRead, Split(dst, 1), Endpoint(0), 77, 0),
      Request(Direction::kRead, Split(dst, 1), Endpoint(0), 78, 0),
  };
  auto res = engine_->Submit(reqs);
  for (const auto& r : res) EXPECT_EQ(ToCode(r.status), Code::kNotFound) << r.status;
  EXPECT_EQ(peers_[0]->server->unknown_segment_frames(), 3u);
  EXPECT_EQ(server_metrics_.GetCounter(kUnknownSegmentMetric, "", {{"op", "read"}}).Value(), 2u);
  EXPECT_EQ(server_metrics_.GetCounter(kUnknownSegmentMetric, "", {{"op", "write"}}).Value(), 1u);
  // The connection stays usable.
  std::vector<TransferRequest> again = {
      Request(Direction::kWrite, Split(src, 1), Endpoint(0), 5, 0)};
  auto ok = engine_->Submit(again);
  EXPECT_TRUE(ok[0].status.ok()) << ok[0].status;
}

TEST_F(TcpTransportTest, DeadlineInThePastFailsEveryRequest) {
  std::vector<char> dst(4096);
  std::vector<TransferRequest> reads = {
      Request(Direction::kRead, Split(dst, 1), Endpoint(0), 5, 0),
      Request(Direction::kRead, Split(dst, 1), Endpoint(1), 5, 0)};
  auto rr = engine_->Submit(reads, RealClock::Get().NowMs() - 5);
  for (auto& r : rr) {
    EXPECT_EQ(ToCode(r.status), Code::kTransferFailed);
    EXPECT_EQ(r.status.message(), "deadline");
  }
}

TEST_F(TcpTransportTest, ShortDeadlineFailsUnfinishedRequestsNeverShortOk) {
  // One destination per request: requests never share destination bytes (the batch paths above
  // the engine refuse overlapping destinations; TSan would rightly call a shared one a race).
  std::vector<std::vector<char>> dsts(64, std::vector<char>(2 << 20));
  std::vector<TransferRequest> reads;
  for (int i = 0; i < 64; ++i) {
    reads.push_back(Request(Direction::kRead, Split(dsts[i], 1), Endpoint(i % 2), 5, 0));
  }
  auto rr = engine_->Submit(reads, RealClock::Get().NowMs() + 2);
  int failed = 0;
  for (auto& r : rr) {
    if (r.status.ok()) {
      EXPECT_EQ(r.bytes, dsts[0].size());
    } else {
      ++failed;
    }
  }
  EXPECT_GT(failed, 0);
  // The engine recovers: fresh connections serve the next batch.
  auto again = engine_->Submit(std::span(reads).first(2));
  for (auto& r : again) EXPECT_TRUE(r.status.ok()) << r.status;
}

TEST_F(TcpTransportTest, ServerStopMidBatchGivesErrorsNotOk) {
  std::vector<std::vector<char>> dsts(64, std::vector<char>(4 << 20));
  std::vector<TransferRequest> reads;
  for (int i = 0; i < 64; ++i) {
    reads.push_back(Request(Direction::kRead, Split(dsts[i], 2), Endpoint(0), 5, 0));
  }
  // Stops the server once the batch's connections are up: 256 MiB are still to come.
  std::thread stopper([this] {
    EXPECT_TRUE(WaitFor([&] { return peers_[0]->server->connection_count() > 0; }));
    peers_[0]->server->Stop();
  });
  auto rr = engine_->Submit(reads, RealClock::Get().NowMs() + 30000);
  stopper.join();
  int failed = 0;
  for (auto& r : rr) {
    if (r.status.ok()) {
      EXPECT_EQ(r.bytes, dsts[0].size());
    } else {
      ++failed;
    }
  }
  EXPECT_GT(failed, 0);
  // A stopped peer fails fast on the next batch too.
  auto after = engine_->Submit(std::span(reads).first(1), RealClock::Get().NowMs() + 5000);
  EXPECT_FALSE(after[0].status.ok());
}

TEST_F(TcpTransportTest, ReconnectsAfterPeerRestart) {
  std::vector<char> src = Pattern(8192, 4), dst(8192);
  std::vector<TransferRequest> w = {Request(Direction::kWrite, Split(src, 1), Endpoint(0), 5, 0)};
  ASSERT_TRUE(engine_->Submit(w)[0].status.ok());
  const std::string endpoint = Endpoint(0);
  peers_[0]->server->Stop();  // pooled connections now dead
  TcpDataServerOptions options;
  options.listen_address = endpoint;
  TcpDataServer again(options, peers_[0]->table);
  ASSERT_TRUE(again.Start().ok());
  std::vector<TransferRequest> r = {Request(Direction::kRead, Split(dst, 1), endpoint, 5, 0)};
  auto res = engine_->Submit(r, RealClock::Get().NowMs() + 5000);
  ASSERT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_TRUE(dst == src);
}

TEST_F(TcpTransportTest, ReportsLoopbackThroughput) {
  std::vector<char> dst(16 << 20);
  std::vector<TransferRequest> r = {Request(Direction::kRead, Split(dst, 1), Endpoint(0), 5, 0)};
  ASSERT_TRUE(engine_->Submit(r)[0].status.ok());  // warm up: connections, page faults
  constexpr int kRounds = 20;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) ASSERT_TRUE(engine_->Submit(r)[0].status.ok());
  const double secs = testing::SecondsSince(start);
  Logger("transfer")
      .info("tcp loopback 16 MiB read: {:.2f} GB/s", kRounds * double(16 << 20) / secs / 1e9);
}

int ReceiveBufferOf(int fd) {
  int bytes = 0;
  socklen_t len = sizeof(bytes);
  EXPECT_EQ(::getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, &len), 0);
  return bytes;
}

// The floor raises an autotuned receive buffer past the kernel's default (tcp_rmem[1]) from the
// start; an explicit SO_RCVBUF takes precedence over it.
TEST(TcpSocketBuffers, ReceiveFloorRaisesAnAutotunedBuffer) {
  std::string endpoint;
  auto listener = tcp::ListenTcp("127.0.0.1:0", {}, &endpoint);
  ASSERT_TRUE(listener.ok());
  constexpr int kFloor = 4 << 20;
  auto plain = tcp::ConnectTcp(endpoint, {}, RealClock::Get().NowMs() + 5000);
  auto floored =
      tcp::ConnectTcp(endpoint, {.receive_floor_bytes = kFloor}, RealClock::Get().NowMs() + 5000);
  auto fixed = tcp::ConnectTcp(endpoint, {.receive_bytes = 64 << 10, .receive_floor_bytes = kFloor},
                               RealClock::Get().NowMs() + 5000);
  ASSERT_TRUE(plain.ok() && floored.ok() && fixed.ok());
  EXPECT_GE(ReceiveBufferOf(floored->get()), kFloor / 2);
  EXPECT_GT(ReceiveBufferOf(floored->get()), ReceiveBufferOf(plain->get()));
  EXPECT_EQ(ReceiveBufferOf(fixed->get()), 2 * (64 << 10));  // the kernel doubles what is asked
}

// A peer that answers the first READ with a response for another request id.
TEST(TcpTransportProtocol, MismatchedResponseFailsTheRequest) {
  std::string endpoint;
  auto listener = tcp::ListenTcp("127.0.0.1:0", {}, &endpoint);
  ASSERT_TRUE(listener.ok());
  std::thread fake([&] {
    tcp::UniqueFd conn(::accept(listener->get(), nullptr, nullptr));
    uint8_t buf[tcp::kFrameHeaderSize];
    if (!tcp::RecvAll(conn.get(), buf, sizeof(buf)).ok()) return;
    auto h = tcp::DecodeFrameHeader(buf, sizeof(buf));
    if (!h.ok()) return;
    tcp::FrameHeader resp = tcp::MakeResponse(*h, Code::kOk, h->length);
    resp.request_id += 1;
    std::vector<char> payload(h->length, 'x');
    tcp::FrameBytes hb = tcp::EncodeFrameHeader(resp);
    iovec iov[2] = {{hb.data(), hb.size()}, {payload.data(), payload.size()}};
    (void)tcp::SendAll(conn.get(), iov, 2).ok();
    char c;
    (void)::recv(conn.get(), &c, 1, 0);  // until the client closes
  });
  SegmentTable none;
  TransferEngine engine(TransferEngineOptions{}, none);
  std::vector<char> dst(4096, 0);
  std::vector<TransferRequest> r = {Request(Direction::kRead, Split(dst, 1), endpoint, 1, 0)};
  auto res = engine.Submit(r, RealClock::Get().NowMs() + 5000);
  fake.join();
  EXPECT_EQ(ToCode(res[0].status), Code::kTransferFailed);
  EXPECT_EQ(dst[0], 0);  // no byte of the foreign payload landed
}

// Small frames: a hashed request spans many frames, which must all ride one connection in
// order; an unhashed one may spread over several. Large frames: a frame's payload arrives over
// several receives, each hashed as it lands. Several peers, scattered destinations.
class TcpHashedReadTest : public TcpTransportTest,
                          public ::testing::WithParamInterface<uint64_t> {};

TEST_P(TcpHashedReadTest, ChecksumsTheDeliveredBytes) {
  TransferEngineOptions options;
  options.local_endpoint = "127.0.0.1:1";
  options.tcp.frame_bytes = GetParam();
  options.tcp.connections_per_peer = 3;
  TransferEngine engine(options, local_table_);
  const std::vector<uint64_t> sizes = {1, 65535, 65536, 65537, (1 << 20) + 5, 3 << 20};
  std::vector<std::vector<char>> sources, sinks;
  std::vector<TransferRequest> writes, reads;
  for (int peer = 0; peer < 2; ++peer) {
    uint64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      sources.push_back(Pattern(sizes[i], 500 + peer * 10 + i));
      sinks.emplace_back(sizes[i]);
      writes.push_back(
          Request(Direction::kWrite, Split(sources.back(), 1), Endpoint(peer), 5, offset));
      reads.push_back(
          Request(Direction::kRead, Split(sinks.back(), 1 + i % 3), Endpoint(peer), 5, offset));
      if (i != 4) reads.back().proof = Proof::kDeliveredBytes;
      offset += sizes[i] + 11;
    }
  }
  auto wr = engine.Submit(writes);
  for (auto& r : wr) ASSERT_TRUE(r.status.ok()) << r.status;
  for (int round = 0; round < 3; ++round) {
    for (auto& s : sinks) std::fill(s.begin(), s.end(), '\x5a');
    auto rr = engine.Submit(reads);
    for (size_t i = 0; i < rr.size(); ++i) {
      ASSERT_TRUE(rr[i].status.ok()) << i << ": " << rr[i].status;
      EXPECT_TRUE(sinks[i] == sources[i]) << i;
      if (i % sizes.size() == 4) {
        EXPECT_FALSE(rr[i].checksum.has_value()) << i;
      } else {
        ASSERT_TRUE(rr[i].checksum.has_value()) << i;
        EXPECT_EQ(*rr[i].checksum, Checksum(sinks[i].data(), sinks[i].size())) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FrameBytes, TcpHashedReadTest,
                         ::testing::Values(uint64_t{64} << 10, uint64_t{8} << 20));

TEST_F(TcpTransportTest, FailedHashedReadCarriesNoChecksum) {
  std::vector<char> dst(1 << 20);
  std::vector<TransferRequest> reads = {
      Request(Direction::kRead, Split(dst, 2), Endpoint(0), 5, kSegmentBytes - 10),  // past the end
      Request(Direction::kRead, Split(dst, 1), Endpoint(1), 6, 0),                   // no segment
  };
  for (auto& r : reads) r.proof = Proof::kDeliveredBytes;
  auto rr = engine_->Submit(reads);
  for (auto& r : rr) {
    EXPECT_FALSE(r.status.ok());
    EXPECT_FALSE(r.checksum.has_value());
  }
  std::vector<char> big(16 << 20);
  std::vector<TransferRequest> late = {Request(Direction::kRead, Split(big, 1), Endpoint(0), 5, 0)};
  late[0].proof = Proof::kDeliveredBytes;
  auto lr = engine_->Submit(late, RealClock::Get().NowMs() - 1);
  EXPECT_FALSE(lr[0].status.ok());
  EXPECT_FALSE(lr[0].checksum.has_value());
}

}  // namespace
}  // namespace mc::transfer
