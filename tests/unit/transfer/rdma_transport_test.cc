// The rdma transport against fake verbs (tests/fakes/fake_verbs.h): bytes moved, SG lists cut
// by max_sge, selective signalling, completion ordering, failed and partial work requests, QP
// errors and re-establishment, deadlines.
#include "transfer/rdma/rdma_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/status.h"
#include "tests/fakes/await.h"
#include "tests/fakes/fake_verbs.h"
#include "tests/fakes/in_process_rdma_connector.h"

namespace mc::transfer::rdma {
namespace {

constexpr uint64_t kSegment = 7;
constexpr uint64_t kSegmentBytes = 1 << 20;
const std::string kPeer = "peer:1";

class NoConnector final : public RdmaConnector {
 public:
  absl::StatusOr<PeerHandshake> Connect(const std::string&, std::span<const QpAddress>,
                                        std::span<const uint32_t>) override {
    return McError(Code::kUnavailable, "no peers");
  }
};

int64_t Now() {
  static RealClock clock;
  return clock.NowMs();
}

class RdmaTransportTest : public ::testing::Test {
 protected:
  void Start(RdmaTransportOptions options = {}, uint32_t max_sge = 4) {
    DeviceAttributes attr;
    attr.name = "fake0";
    attr.max_sge = max_sge;
    attr.max_qp_wr = 256;
    auto server_dev = std::make_unique<FakeVerbsDevice>(network_, attr);
    auto client_dev = std::make_unique<FakeVerbsDevice>(network_, attr);
    server_dev_ = server_dev.get();
    client_dev_ = client_dev.get();
    server_ = std::make_unique<RdmaTransport>(options, std::move(server_dev), no_connector_);
    connector_.AddPeer(kPeer, server_.get());
    client_ = std::make_unique<RdmaTransport>(options, std::move(client_dev), connector_);
    segment_.assign(kSegmentBytes, 0);
    for (size_t i = 0; i < segment_.size(); ++i) segment_[i] = static_cast<char>(i * 7 + 3);
    ASSERT_TRUE(server_->ExportSegment(kSegment, segment_.data(), segment_.size()).ok());
    local_.assign(kSegmentBytes, 0);
    ASSERT_TRUE(client_->RegisterMemory(local_.data(), local_.size(), MemoryAccess::kLocal).ok());
  }

  TransferRequest Request(Direction op, uint64_t offset, std::vector<LocalBuffer> local) {
    TransferRequest r;
    r.direction = op;
    r.local = std::move(local);
    r.endpoint = kPeer;
    r.target = SegmentRange{kSegment, offset};
    return r;
  }

  std::vector<TransferResult> Run(const std::vector<TransferRequest>& requests,
                                  int64_t deadline_ms = 0) {
    std::vector<const TransferRequest*> ptrs;
    for (const TransferRequest& r : requests) ptrs.push_back(&r);
    std::vector<TransferResult> results(requests.size());
    client_->Submit(ptrs, results, deadline_ms);
    return results;
  }

  // Waits (bounded) until the client device holds `n` WRs.
  bool WaitHeld(size_t n) {
    return WaitFor([&] { return client_dev_->held() >= n; });
  }

  FakeVerbsNetwork network_;
  NoConnector no_connector_;
  InProcessRdmaConnector connector_;
  FakeVerbsDevice* server_dev_ = nullptr;
  FakeVerbsDevice* client_dev_ = nullptr;
  std::vector<char> segment_;
  std::vector<char> local_;
  std::unique_ptr<RdmaTransport> server_;
  std::unique_ptr<RdmaTransport> client_;
};

TEST_F(RdmaTransportTest, ReadAndWriteMoveEveryByte) {
  Start();
  std::vector<TransferRequest> reads = {Request(Direction::kRead, 4096, {{local_.data(), 10000}})};
  reads[0].proof = Proof::kDeliveredBytes;
  auto r = Run(reads);
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(r[0].bytes, 10000u);
  EXPECT_EQ(0, std::memcmp(local_.data(), segment_.data() + 4096, 10000));
  ASSERT_TRUE(r[0].checksum.has_value());
  EXPECT_EQ(*r[0].checksum, Checksum(segment_.data() + 4096, 10000));

  for (size_t i = 0; i < 5000; ++i) local_[100000 + i] = static_cast<char>(i ^ 0x5a);
  auto w = Run({Request(Direction::kWrite, 200000, {{local_.data() + 100000, 5000}})});
  ASSERT_TRUE(w[0].status.ok()) << w[0].status;
  EXPECT_EQ(0, std::memcmp(segment_.data() + 200000, local_.data() + 100000, 5000));
  EXPECT_EQ(connector_.connects(), 1);
}

TEST_F(RdmaTransportTest, ScatterGatherRespectsMaxSgeAndSignalsSelectively) {
  RdmaTransportOptions options;
  options.max_wr_bytes = 4096;
  options.qps_per_peer = 1;
  Start(options, /*max_sge=*/2);
  std::vector<LocalBuffer> pieces;
  for (int i = 0; i < 7; ++i) pieces.push_back({local_.data() + i * 10000, 3000});
  auto r = Run({Request(Direction::kRead, 0, pieces)});
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(r[0].bytes, 21000u);
  uint64_t remote = 0;
  for (const LocalBuffer& p : pieces) {
    EXPECT_EQ(0, std::memcmp(p.data, segment_.data() + remote, p.length));
    remote += p.length;
  }
  EXPECT_LE(client_dev_->max_sge_seen(), 2u);
  EXPECT_GE(client_dev_->wrs_posted(), 6u);       // 21000 bytes in <= 4096-byte WRs
  EXPECT_EQ(client_dev_->signaled_posted(), 1u);  // one chain, its last WR signalled
}

TEST_F(RdmaTransportTest, SendQueueDepthIsNeverExceeded) {
  RdmaTransportOptions options;
  options.max_wr_bytes = 1024;
  options.send_queue_depth = 4;
  options.qps_per_peer = 1;
  Start(options);
  auto r = Run({Request(Direction::kRead, 0, {{local_.data(), 64 * 1024}})});
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(client_dev_->wrs_posted(), 64u);
  EXPECT_EQ(client_dev_->signaled_posted(), 16u);  // chains of 4, each signalled once
  EXPECT_EQ(0, std::memcmp(local_.data(), segment_.data(), 64 * 1024));
}

TEST_F(RdmaTransportTest, CompletionsInAnyOrderAcrossQueuePairs) {
  RdmaTransportOptions options;
  options.qps_per_peer = 3;
  Start(options);
  client_dev_->SetHold(true);
  std::vector<TransferRequest> requests;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(Request(Direction::kRead, i * 8192, {{local_.data() + i * 8192, 8192}}));
  }
  std::vector<TransferResult> results;
  std::thread submit([&] { results = Run(requests); });
  ASSERT_TRUE(WaitHeld(6));
  client_dev_->Release(0, SIZE_MAX, /*reverse=*/true);
  submit.join();
  for (const TransferResult& r : results) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(0, std::memcmp(local_.data(), segment_.data(), 6 * 8192));
}

TEST_F(RdmaTransportTest, FailedWorkRequestFailsExactlyItsRequest) {
  RdmaTransportOptions options;
  options.qps_per_peer = 2;
  Start(options);
  // Requests 0 and 2 ride queue pair A, request 1 queue pair B; B's WR fails.
  client_dev_->FailNthWr(1);
  std::vector<TransferRequest> requests;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(Request(Direction::kRead, i * 4096, {{local_.data() + i * 4096, 4096}}));
  }
  auto r = Run(requests);
  EXPECT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(ToCode(r[1].status), Code::kTransferFailed) << r[1].status;
  EXPECT_TRUE(r[2].status.ok()) << r[2].status;
  EXPECT_EQ(0, std::memcmp(local_.data(), segment_.data(), 4096));
  EXPECT_EQ(0, std::memcmp(local_.data() + 8192, segment_.data() + 8192, 4096));
}

TEST_F(RdmaTransportTest, FlushedRequestsBehindAFailureFailToo) {
  RdmaTransportOptions options;
  options.qps_per_peer = 1;
  Start(options);
  client_dev_->FailNthWr(1);
  std::vector<TransferRequest> requests;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(Request(Direction::kRead, i * 4096, {{local_.data() + i * 4096, 4096}}));
  }
  auto r = Run(requests);
  EXPECT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_FALSE(r[1].status.ok());
  EXPECT_FALSE(r[2].status.ok());  // flushed behind the failure on the same queue pair
}

TEST_F(RdmaTransportTest, PartialCompletionIsNeverOk) {
  RdmaTransportOptions options;
  options.max_wr_bytes = 4096;
  options.qps_per_peer = 1;
  Start(options);
  client_dev_->FailNthWr(2);  // WRs 0 and 1 move their bytes, 2 fails, 3 is flushed
  auto r = Run({Request(Direction::kRead, 0, {{local_.data(), 4 * 4096}})});
  EXPECT_EQ(ToCode(r[0].status), Code::kTransferFailed) << r[0].status;
  EXPECT_EQ(r[0].bytes, 2u * 4096);
  EXPECT_FALSE(r[0].checksum.has_value());
}

TEST_F(RdmaTransportTest, QueuePairErrorIsReestablished) {
  RdmaTransportOptions options;
  options.qps_per_peer = 1;
  Start(options);
  auto ok = Run({Request(Direction::kRead, 0, {{local_.data(), 4096}})});
  ASSERT_TRUE(ok[0].status.ok());
  EXPECT_EQ(client_->qps_created_for_test(), 1u);
  client_dev_->FailNthWr(0);
  auto bad = Run({Request(Direction::kRead, 0, {{local_.data(), 4096}})});
  EXPECT_FALSE(bad[0].status.ok());
  auto again = Run({Request(Direction::kWrite, 4096, {{local_.data() + 100, 4096}})});
  ASSERT_TRUE(again[0].status.ok()) << again[0].status;
  EXPECT_EQ(client_->qps_created_for_test(), 2u);
  EXPECT_EQ(0, std::memcmp(segment_.data() + 4096, local_.data() + 100, 4096));
  EXPECT_EQ(server_dev_->live_qps(), 1u);  // the peer destroyed the retired one's partner
  // The broken one is drained and destroyed by the completion thread.
  EXPECT_TRUE(WaitFor([&] { return client_dev_->live_qps() == 1; })) << client_dev_->live_qps();
}

TEST_F(RdmaTransportTest, ForcedQueuePairErrorFailsWhatItCarries) {
  RdmaTransportOptions options;
  options.qps_per_peer = 1;
  Start(options);
  client_dev_->SetHold(true);
  std::vector<TransferResult> results;
  std::thread submit([&] {
    results = Run({Request(Direction::kRead, 0, {{local_.data(), 4096}})});
  });
  ASSERT_TRUE(WaitHeld(1));
  // The fake's only active QP is the client's; QPNs are shared, so force all the client's.
  for (uint32_t qpn = 0x40; qpn < 0x50; ++qpn) client_dev_->ForceQpError(qpn);
  submit.join();
  EXPECT_EQ(ToCode(results[0].status), Code::kTransferFailed) << results[0].status;
  client_dev_->SetHold(false);
  auto again = Run({Request(Direction::kRead, 0, {{local_.data(), 4096}})});
  EXPECT_TRUE(again[0].status.ok()) << again[0].status;
}

TEST_F(RdmaTransportTest, DeadlineFailsAndNoByteLandsAfterwards) {
  Start();
  client_dev_->SetHold(true);
  std::memset(local_.data(), 0x11, 8192);
  const int64_t start = Now();
  auto r = Run({Request(Direction::kRead, 0, {{local_.data(), 8192}})}, start + 50);
  EXPECT_EQ(ToCode(r[0].status), Code::kTransferFailed);
  EXPECT_EQ(r[0].status.message(), "deadline");
  EXPECT_GE(Now() - start, 50);
  EXPECT_EQ(client_dev_->held(), 0u);  // flushed before Submit returned
  client_dev_->Release();
  for (int i = 0; i < 8192; ++i) ASSERT_EQ(local_[i], 0x11) << i;
  client_dev_->SetHold(false);
  auto again = Run({Request(Direction::kRead, 0, {{local_.data(), 8192}})});
  EXPECT_TRUE(again[0].status.ok()) << again[0].status;
}

TEST_F(RdmaTransportTest, DeadlineWithStuckQueuePairDestroysItAfterGrace) {
  RdmaTransportOptions options;
  options.flush_grace_ms = 100;
  options.busy_poll_iterations = 10;
  options.event_wait_ms = 5;
  Start(options);
  client_dev_->SetHold(true);
  client_dev_->SetIgnoreModifyToError(true);
  const int64_t start = Now();
  auto r = Run({Request(Direction::kWrite, 0, {{local_.data(), 8192}})}, start + 20);
  EXPECT_EQ(r[0].status.message(), "deadline");
  EXPECT_GE(Now() - start, 100);
  EXPECT_EQ(client_dev_->destroyed_with_held(), 1u);
}

TEST_F(RdmaTransportTest, BadRequestsFailAlone) {
  Start();
  std::vector<char> unregistered(4096);
  std::vector<TransferRequest> requests = {
      Request(Direction::kRead, 0, {{unregistered.data(), 4096}}),
      Request(Direction::kRead, kSegmentBytes - 10, {{local_.data(), 4096}}),
      Request(Direction::kRead, 0, {{local_.data(), 4096}}),
      Request(Direction::kRead, 0, {{local_.data(), 4096}}),
      Request(Direction::kRead, 0, {{local_.data() + 8192, 100}}),
  };
  requests[2].target = SegmentRange{99, 0};
  requests[3].target = DiskRecord{kSegment, 0, 0};
  requests[4].endpoint = "nobody:1";
  auto r = Run(requests);
  EXPECT_EQ(ToCode(r[0].status), Code::kInvalidArgument) << r[0].status;
  EXPECT_EQ(ToCode(r[1].status), Code::kInvalidArgument) << r[1].status;
  EXPECT_EQ(ToCode(r[2].status), Code::kNotFound) << r[2].status;
  EXPECT_EQ(ToCode(r[3].status), Code::kInvalidArgument) << r[3].status;
  EXPECT_EQ(ToCode(r[4].status), Code::kTransferFailed) << r[4].status;
  EXPECT_FALSE(client_->LocalBuffersRegistered(requests[0]));
  EXPECT_TRUE(client_->LocalBuffersRegistered(requests[2]));
}

TEST_F(RdmaTransportTest, ConcurrentSubmitsAllComplete) {
  RdmaTransportOptions options;
  options.max_wr_bytes = 2048;
  options.send_queue_depth = 8;
  Start(options);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        std::vector<TransferRequest> requests;
        for (int i = 0; i < 4; ++i) {
          const uint64_t off = (t * 4 + i) * 16384;
          requests.push_back(Request(Direction::kRead, off, {{local_.data() + off, 16384}}));
        }
        for (const TransferResult& r : Run(requests)) failures += r.status.ok() ? 0 : 1;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(0, std::memcmp(local_.data(), segment_.data(), 16 * 16384));
}

TEST_F(RdmaTransportTest, RegistrationIsReleased) {
  Start();
  EXPECT_EQ(ToCode(client_->RegisterMemory(local_.data(), 10, MemoryAccess::kLocal)),
            Code::kAlreadyExists);
  client_->UnregisterMemory(local_.data());
  EXPECT_EQ(client_dev_->live_regions(), 0u);
  auto r = Run({Request(Direction::kRead, 0, {{local_.data(), 10}})});
  EXPECT_EQ(ToCode(r[0].status), Code::kInvalidArgument);
}

TEST_F(RdmaTransportTest, UnregisterWaitsForInFlightRequestsAndRefusesNewOnes) {
  Start();
  client_dev_->SetHold(true);
  std::vector<TransferResult> first;
  std::thread submit([&] { first = Run({Request(Direction::kRead, 0, {{local_.data(), 4096}})}); });
  ASSERT_TRUE(WaitHeld(1));
  std::atomic<bool> unregistered{false};
  std::thread unregister([&] {
    client_->UnregisterMemory(local_.data());
    unregistered.store(true);
  });
  // Once the region is closing, a new request on it fails at once (not OK), no WR posted.
  const TransferRequest probe = Request(Direction::kRead, 0, {{local_.data(), 1}});
  ASSERT_TRUE(WaitFor([&] { return !client_->LocalBuffersRegistered(probe); }));
  auto refused = Run({Request(Direction::kRead, 8192, {{local_.data() + 8192, 100}})});
  EXPECT_EQ(ToCode(refused[0].status), Code::kInvalidArgument) << refused[0].status;
  EXPECT_EQ(client_dev_->held(), 1u);
  // The region turned closing under the lock that UnregisterMemory then waits on for its users
  // to fall to 0: it is blocked now, and only the held WR's end can release it. (An unregister
  // that did not wait would deregister the region before Release, and the held WR, executed
  // against the fake device's regions then, would fail below.)
  EXPECT_FALSE(unregistered.load());  // the held WR still names the region
  EXPECT_EQ(client_dev_->live_regions(), 1u);
  client_dev_->Release();
  submit.join();
  unregister.join();
  ASSERT_TRUE(first[0].status.ok()) << first[0].status;
  EXPECT_EQ(0, std::memcmp(local_.data(), segment_.data(), 4096));
  EXPECT_EQ(client_dev_->live_regions(), 0u);
  EXPECT_EQ(client_->local_regions_for_test(), 0u);
}

TEST_F(RdmaTransportTest, LocalOnlyMemoryIsNeverServedToPeers) {
  Start();
  // The server also holds memory of its own: a served segment (remote access) and an
  // application buffer (local only) that a table entry wrongly names as a segment.
  std::vector<char> served(8192, 's'), app(8192, 'a');
  ASSERT_TRUE(server_->RegisterMemory(served.data(), served.size(), MemoryAccess::kRemote).ok());
  ASSERT_TRUE(server_->RegisterMemory(app.data(), app.size(), MemoryAccess::kLocal).ok());
  SegmentTable table;
  table.Add(21, served.data(), served.size());
  table.Add(22, app.data(), app.size());
  server_->ServeSegments(&table);
  auto r = Run({[&] {
                  TransferRequest q = Request(Direction::kRead, 0, {{local_.data(), 100}});
                  q.target = SegmentRange{21, 0};
                  return q;
                }(),
                [&] {
                  TransferRequest q = Request(Direction::kWrite, 0, {{local_.data(), 100}});
                  q.target = SegmentRange{22, 0};
                  return q;
                }()});
  EXPECT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(0, std::memcmp(local_.data(), served.data(), 100));
  EXPECT_EQ(ToCode(r[1].status), Code::kNotFound) << r[1].status;
  EXPECT_EQ(app[0], 'a');
}

TEST(FakeVerbs, LocalOnlyRegionRefusesRemoteAccess) {
  FakeVerbsNetwork network;
  std::vector<char> a(64, 'x');
  const uint32_t local_only = network.AddRegion(reinterpret_cast<uint64_t>(a.data()), 64, false);
  EXPECT_TRUE(network.Check(local_only, reinterpret_cast<uint64_t>(a.data()), 64));
  EXPECT_FALSE(network.Check(local_only, reinterpret_cast<uint64_t>(a.data()), 64, true));
}

}  // namespace
}  // namespace mc::transfer::rdma
