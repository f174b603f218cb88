// The master lane's two ends under concurrency, without a gRPC listener: a MasterLane in front of
// a MasterGrpcService (as tests/fuzz/master_lane_fuzz.cc), and several MasterLaneClients whose
// threads put and look up at once over more connections than the lane takes. Every call is
// answered or not sent, never lost; the lane's bound holds (a connection over it is greeted
// "full"); idle connections are closed by the lane and replaced by the clients; every connection
// and thread is gone at the end. No gRPC server runs here, so ThreadSanitizer sees only our
// threads: deploy/test.sh runs this suite in its tsan stage (Debian's gRPC is not instrumented).
#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/session/master_lane_client.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "master/grpc_service.h"
#include "master/master_lane.h"
#include "master/metadata_service.h"
#include "proto/master_lane_frame.h"
#include "tests/fakes/await.h"

namespace mc::client {
namespace {

namespace v1 = mcstore::v1;
using Outcome = MasterLaneClient::Outcome;

constexpr size_t kLaneConnections = 4;

// A metadata service with client "c1" registered, behind a lane and no gRPC listener.
class LaneThreadsTest : public ::testing::Test {
 protected:
  LaneThreadsTest() : service_(master::MasterOptions{}, RealClock::Get(), metrics_) {}
  void SetUp() override {
    SetLogLevel("error");
    signal(SIGPIPE, SIG_IGN);
    master::ClientInfo info;
    info.client_id = "c1";
    info.endpoint = "127.0.0.1:1";
    ASSERT_TRUE(service_.RegisterClient(info, {1 << 20}, {}, false).ok());
    grpc_service_ = std::make_unique<master::MasterGrpcService>(service_, metrics_, 1000);
  }
  // Clients reuse a connection for half of `idle_ms`.
  void StartLane(int64_t idle_ms) {
    lane_ = std::make_unique<master::MasterLane>(
        master::MasterLaneOptions{.listen = "127.0.0.1:0",
                                  .max_connections = kLaneConnections,
                                  .idle_timeout_ms = idle_ms},
        *grpc_service_, metrics_);
    absl::StatusOr<int> port = lane_->Start();
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
  }
  // Stops the lane: no connection or thread left.
  void StopLane() {
    lane_->Stop();
    EXPECT_EQ(lane_->ConnectionsForTest(), 0u);
    EXPECT_EQ(metrics_.GetGauge("mc_master_lane_connections", "").Value(), 0);
  }
  std::unique_ptr<MasterLaneClient> NewClient(int max_connections) {
    return std::make_unique<MasterLaneClient>(MasterLaneClientOptions{
        .host = "127.0.0.1",
        .port = port_,
        .timeout_ms = 10'000,
        .max_connections = max_connections,
        .backoff_ms = 5,
    });
  }
  uint64_t Refused(const std::string& reason) {
    return metrics_.GetCounter("mc_master_lane_refused_total", "", {{"reason", reason}}).Value();
  }

  MetricsRegistry metrics_;
  master::MetadataService service_;
  std::unique_ptr<master::MasterGrpcService> grpc_service_;
  std::unique_ptr<master::MasterLane> lane_;
  int port_ = 0;
};

// Sends `req` until the lane answers (busy or not sent: the caller would use gRPC; here it
// tries again, bounded). False when it was lost or never answered.
template <typename Req, typename Resp>
bool CallUntilAnswered(MasterLaneClient& client, uint32_t method, const Req& req, Resp* resp) {
  const absl::Time deadline = absl::Now() + kAwaitTimeout;
  while (absl::Now() < deadline) {
    grpc::Status status;
    std::string leader;
    switch (client.Call(method, "", req, resp, &status, &leader)) {
      case Outcome::kAnswered:
        return status.ok();
      case Outcome::kLost:
        return false;
      case Outcome::kBusy:
      case Outcome::kNotSent:
        std::this_thread::yield();
    }
  }
  return false;
}

// PutStart, PutEnd and GetReplicas of `key` over the lane; true when all were OK.
bool PutAndGet(MasterLaneClient& client, const std::string& key) {
  v1::PutStartRequest start;
  start.set_client_id("c1");
  start.add_items()->set_key(key);
  start.mutable_items(0)->set_size(100);
  v1::PutStartResponse started;
  if (!CallUntilAnswered(client, lane::kPutStart, start, &started) ||
      started.results(0).code() != v1::OK) {
    return false;
  }
  v1::PutEndRequest end;
  end.set_client_id("c1");
  end.add_items()->set_key(key);
  end.mutable_items(0)->set_generation(started.results(0).generation());
  v1::PutEndResponse ended;
  if (!CallUntilAnswered(client, lane::kPutEnd, end, &ended) || ended.results(0).code() != v1::OK) {
    return false;
  }
  v1::GetReplicasRequest get;
  get.set_client_id("c1");
  get.add_keys(key);
  get.set_no_lease(true);
  v1::GetReplicasResponse got;
  return CallUntilAnswered(client, lane::kGetReplicas, get, &got) &&
         got.results(0).code() == v1::OK;
}

TEST_F(LaneThreadsTest, ManyThreadsOverMoreConnectionsThanTheLaneTakesLoseNoCall) {
  StartLane(/*idle_ms=*/1000);
  constexpr int kClients = 3;
  constexpr int kThreadsPerClient = 3;
  constexpr int kKeysPerThread = 40;
  std::vector<std::unique_ptr<MasterLaneClient>> clients;
  for (int c = 0; c < kClients; ++c) clients.push_back(NewClient(2));  // 6 > 4 connections
  std::atomic<int> failed{0};
  std::atomic<size_t> most_connections{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    for (int t = 0; t < kThreadsPerClient; ++t) {
      threads.emplace_back([&, c, t] {
        for (int k = 0; k < kKeysPerThread; ++k) {
          if (!PutAndGet(*clients[c], absl::StrCat("k", c, "-", t, "-", k))) ++failed;
          const size_t open = lane_->ConnectionsForTest();
          size_t most = most_connections.load();
          while (open > most && !most_connections.compare_exchange_weak(most, open)) {
          }
        }
      });
    }
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0) << "every call answered OK, none lost";
  EXPECT_EQ(service_.KeyCount(), size_t{kClients * kThreadsPerClient * kKeysPerThread});
  EXPECT_LE(most_connections.load(), kLaneConnections);
  // Idle past the lane's timeout: it closes every connection, and their threads end.
  EXPECT_TRUE(WaitFor([&] { return lane_->ConnectionsForTest() == 0; }));
  EXPECT_GE(Refused("idle"), 1u);
  // The clients notice and open new connections.
  for (int c = 0; c < kClients; ++c) EXPECT_TRUE(PutAndGet(*clients[c], absl::StrCat("again", c)));
  clients.clear();
  StopLane();
}

TEST_F(LaneThreadsTest, AConnectionOverTheBoundIsGreetedFullAndNotSent) {
  StartLane(/*idle_ms=*/60'000);
  std::vector<std::unique_ptr<MasterLaneClient>> holders;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < kLaneConnections; ++i) holders.push_back(NewClient(1));
  for (size_t i = 0; i < kLaneConnections; ++i) {
    threads.emplace_back([&, i] { EXPECT_TRUE(PutAndGet(*holders[i], absl::StrCat("h", i))); });
  }
  for (std::thread& t : threads) t.join();
  // Each holder keeps its connection idle: the lane is at its bound.
  EXPECT_TRUE(WaitFor([&] { return lane_->ConnectionsForTest() == kLaneConnections; }));
  const uint64_t full_before = Refused("max_connections");
  std::unique_ptr<MasterLaneClient> late = NewClient(1);
  v1::ExistRequest exist;
  exist.add_keys("h0");
  v1::ExistResponse exists;
  grpc::Status status;
  std::string leader;
  EXPECT_EQ(late->Call(lane::kExist, "", exist, &exists, &status, &leader), Outcome::kNotSent);
  EXPECT_EQ(Refused("max_connections"), full_before + 1);
  // The holders gone, their connections close and the lane's threads end; the late one gets in.
  holders.clear();
  EXPECT_TRUE(WaitFor([&] { return lane_->ConnectionsForTest() == 0; }));
  ASSERT_TRUE(CallUntilAnswered(*late, lane::kExist, exist, &exists));
  EXPECT_TRUE(exists.exists(0));
  late.reset();
  EXPECT_TRUE(WaitFor([&] { return lane_->ConnectionsForTest() == 0; }));
  StopLane();
}

}  // namespace
}  // namespace mc::client
