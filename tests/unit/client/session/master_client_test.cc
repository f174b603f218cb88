// The gRPC MasterClient against a real mc-master served in-process on loopback: releases sent
// without waiting (ReleaseLeasesAsync) complete, ride along with the next GetReplicas or go alone
// after the delay, and this client's own Remove and PutStart wait for the releases sent before
// them without waiting out the delay.
#include "client/session/master_client.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/auth.h"
#include "common/logging.h"
#include "common/master_credentials.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "master/master_server.h"
#include "tests/fakes/await.h"
#include "tests/unit/client/session/master_client_test_util.h"

namespace mc::client {
namespace {

class GrpcMasterClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel("warn");
    server_ = testing::StartTestMaster();
  }

  // Each test connects once: a second registration of "c1" would replace the first session.
  void Connect(int64_t release_delay_us) {
    client_ = CreateGrpcMasterClient({.address = server_->grpc_address(),
                                      .rpc_timeout_ms = 10'000,
                                      .max_message_bytes = 64 << 20,
                                      .release_delay_us = release_delay_us});
    testing::RegisterTestClient(*client_);
  }

  void Put(const std::string& key) { testing::PutTestKey(*client_, key); }

  // Leases `key` and returns the release request for it.
  v1::ReleaseLeasesRequest Lease(const std::string& key) {
    return testing::LeaseTestKeys(*client_, {key});
  }

  // Leases `key` and queues its release; the counter goes up once the release is answered (it
  // must be answered OK).
  std::shared_ptr<EventCounter> QueueRelease(const std::string& key) {
    auto done = std::make_shared<EventCounter>();
    client_->ReleaseLeasesAsync(Lease(key), [done](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      done->Add();
    });
    return done;
  }
  // Waits for `done` to count one answer.
  static void WaitAnswered(const EventCounter& done) { EXPECT_TRUE(done.AwaitAtLeast(1)); }
  // Removes `key` through the client; the master's answer for it.
  v1::Result Remove(const std::string& key) {
    v1::RemoveRequest rm;
    rm.add_keys(key);
    v1::RemoveResponse removed;
    EXPECT_TRUE(client_->Remove(rm, &removed).ok());
    return removed.results_size() == 1 ? removed.results(0) : v1::Result();
  }

  size_t ActiveLeases() { return server_->service().ActiveLeaseCount(); }
  uint64_t ReleaseRpcs() {
    return server_->metrics()
        .GetCounter("mc_master_rpc_requests_total", "Master RPCs received",
                    {{"rpc", "ReleaseLeases"}})
        .Value();
  }

  std::unique_ptr<master::MasterServer> server_;
  std::unique_ptr<MasterClient> client_;
};

constexpr int64_t kLongDelayUs = 60'000'000;  // a minute: only something else can send them

TEST_F(GrpcMasterClientTest, TheNextLookupCarriesQueuedReleases) {
  Connect(kLongDelayUs);
  Put("a");
  Put("b");
  auto done = QueueRelease("a");
  EXPECT_EQ(ActiveLeases(), 1u);
  const uint64_t rpcs_before = ReleaseRpcs();
  v1::ReleaseLeasesRequest b = Lease("b");  // carries a's release
  EXPECT_EQ(done->value(), 1);
  EXPECT_EQ(ActiveLeases(), 1u) << "a's lease should be gone, b's held";
  EXPECT_EQ(ReleaseRpcs(), rpcs_before) << "the release needed no RPC of its own";
  ASSERT_TRUE(client_->ReleaseLeases(b).ok());
  EXPECT_EQ(ActiveLeases(), 0u);
}

// A delay of 0 is also what a master too old to know `releases` needs: nothing rides along.
TEST_F(GrpcMasterClientTest, WithoutADelayNothingIsCarried) {
  Connect(0);
  Put("a");
  Put("b");
  const uint64_t rpcs_before = ReleaseRpcs();
  for (int round = 0; round < 20; ++round) {
    client_->ReleaseLeasesAsync(Lease(round % 2 ? "a" : "b"), [](absl::Status) {});
  }
  const v1::Result removed = Remove("a");  // waits for all of them
  EXPECT_EQ(removed.code(), v1::OK) << removed.message();
  EXPECT_EQ(ReleaseRpcs() - rpcs_before, 20u) << "every release in an RPC of its own";
}

TEST_F(GrpcMasterClientTest, WithoutALookupReleasesGoAloneAfterTheDelay) {
  Connect(20'000);  // 20 ms
  Put("a");
  auto done = QueueRelease("a");
  WaitAnswered(*done);
  EXPECT_EQ(done->value(), 1);
  EXPECT_EQ(ActiveLeases(), 0u);
}

// Queueing a release wakes the sender only when it sleeps for want of work; while it is busy it
// must find the release on its own within the delay. Releases queued after gaps of 0-29 ms (the
// sender goes to sleep after 16 empty looks, 16 ms here) all go, each in an RPC of its own.
TEST_F(GrpcMasterClientTest, ReleasesQueuedWhileTheSenderIsBusyOrAsleepAllGo) {
  Connect(1'000);  // 1 ms
  Put("a");
  Put("b");
  const uint64_t rpcs_before = ReleaseRpcs();
  constexpr int kRounds = 30;
  for (int round = 0; round < kRounds; ++round) {
    auto done = QueueRelease(round % 2 ? "a" : "b");
    WaitAnswered(*done);
    // Other master calls for `round` ms: the client's ordinary traffic between two gets.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(round);
    while (std::chrono::steady_clock::now() < until) {
      v1::ExistRequest req;
      req.add_keys("a");
      v1::ExistResponse resp;
      ASSERT_TRUE(client_->Exist(req, &resp).ok());
    }
  }
  EXPECT_EQ(ActiveLeases(), 0u);
  EXPECT_EQ(ReleaseRpcs() - rpcs_before, static_cast<uint64_t>(kRounds));
}

TEST_F(GrpcMasterClientTest, RemoveDoesNotWaitOutTheDelay) {
  Connect(kLongDelayUs);
  Put("a");
  client_->ReleaseLeasesAsync(Lease("a"), [](absl::Status) {});
  auto start = std::chrono::steady_clock::now();
  const v1::Result removed = Remove("a");
  EXPECT_EQ(removed.code(), v1::OK) << removed.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// An application releasing its MatchPrefix lease and then removing the keys through another
// mc-client must not find this client's earlier gets still holding leases.
TEST_F(GrpcMasterClientTest, AnExplicitReleaseFirstEndsTheQueuedOnes) {
  Connect(kLongDelayUs);
  Put("a");
  Put("b");
  auto done = QueueRelease("a");
  v1::GetReplicasRequest get;  // a lease taken without carrying a's release
  get.set_client_id("c1");
  get.add_keys("b");
  v1::GetReplicasResponse got;
  {
    // Leases b directly at the master, so the queue stays as it is.
    auto stub = v1::Master::NewStub(
        grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetReplicas(&ctx, get, &got).ok());
  }
  EXPECT_EQ(ActiveLeases(), 2u);
  v1::ReleaseLeasesRequest rel;
  rel.set_lease_id(got.lease_id());
  rel.add_keys("b");
  ASSERT_TRUE(client_->ReleaseLeases(rel).ok());
  EXPECT_EQ(done->value(), 1) << "a's queued release went first";
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(GrpcMasterClientTest, ALookupTheMasterRejectsDoesNotLoseTheReleasesItCarried) {
  Connect(kLongDelayUs);
  Put("a");
  auto done = QueueRelease("a");
  v1::GetReplicasRequest bad;  // count_only without stop_at_first_miss: INVALID_ARGUMENT
  bad.set_client_id("c1");
  bad.add_keys("a");
  bad.set_count_only(true);
  v1::GetReplicasResponse resp;
  EXPECT_FALSE(client_->GetReplicas(bad, &resp).ok());
  // Sent again, alone and at once.
  WaitAnswered(*done);
  EXPECT_EQ(done->value(), 1);
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(GrpcMasterClientTest, RemoveWaitsForTheReleasesSentBeforeIt) {
  Connect(1000);
  for (int round = 0; round < 20; ++round) {
    const std::string key = "k" + std::to_string(round);
    Put(key);
    auto done = QueueRelease(key);
    const v1::Result removed = Remove(key);
    EXPECT_EQ(done->value(), 1) << "Remove returned before the release it follows completed";
    EXPECT_EQ(removed.code(), v1::OK) << removed.message();
  }
}

TEST_F(GrpcMasterClientTest, DestroyingTheClientWaitsForReleasesInFlight) {
  Connect(1000);
  Put("k");
  auto done = std::make_shared<EventCounter>();
  client_->ReleaseLeasesAsync(Lease("k"), [done](absl::Status) { done->Add(); });
  client_.reset();
  EXPECT_EQ(done->value(), 1);
}

TEST_F(GrpcMasterClientTest, ReleaseToAStoppedMasterReportsAnErrorNotAHang) {
  Connect(1000);
  Put("k");
  v1::ReleaseLeasesRequest rel = Lease("k");
  server_->Shutdown();
  auto status = std::make_shared<absl::Status>();
  auto done = std::make_shared<EventCounter>();
  client_->ReleaseLeasesAsync(rel, [status, done](absl::Status s) {
    *status = s;
    done->Add();
  });
  client_.reset();  // waits for the answer (an error, within the RPC deadline)
  EXPECT_EQ(done->value(), 1);
  EXPECT_FALSE(status->ok());
}

// ---- Authentication: the gRPC client against a master that has the cluster keys.

class AuthenticatedMasterClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel("error");
    master::MasterServerOptions opts;
    opts.listen = "127.0.0.1:0";
    opts.http = "";
    opts.cluster_keys = Keys(std::string(64, 's'));
    server_ = std::make_unique<master::MasterServer>(opts);
    ASSERT_TRUE(server_->Start().ok());
  }
  static auth::ClusterKeysPtr Keys(const std::string& secret) {
    return *auth::ClusterKeys::FromSecrets({secret});
  }
  std::unique_ptr<MasterClient> Client(auth::ClusterKeysPtr keys) {
    return CreateGrpcMasterClient({.address = server_->grpc_address(),
                                   .rpc_timeout_ms = 10'000,
                                   .max_message_bytes = 64 << 20,
                                   .release_delay_us = 0,
                                   .cluster_keys = std::move(keys)});
  }
  static absl::Status Register(MasterClient& client, const std::string& id,
                               v1::RegisterClientResponse* resp) {
    v1::RegisterClientRequest reg;
    reg.set_client_id(id);
    reg.set_data_endpoint("127.0.0.1:1");
    reg.add_segments()->set_size(1 << 20);
    return client.RegisterClient(reg, resp);
  }
  static absl::Status PutStart(MasterClient& client, const std::string& as, v1::Code* code) {
    v1::PutStartRequest start;
    start.set_client_id(as);
    auto* item = start.add_items();
    item->set_key("k-" + as);
    item->set_size(100);
    v1::PutStartResponse started;
    absl::Status s = client.PutStart(start, &started);
    if (s.ok()) *code = started.results(0).code();
    return s;
  }
  uint64_t AuthFailures(const std::string& reason) {
    return server_->metrics()
        .GetCounter("mc_master_auth_failures_total", "", {{"reason", reason}})
        .Value();
  }

  std::unique_ptr<master::MasterServer> server_;
};

TEST_F(AuthenticatedMasterClientTest, AClientWithTheSecretRegistersAndActsAsItself) {
  auto client = Client(Keys(std::string(64, 's')));
  v1::RegisterClientResponse resp;
  ASSERT_TRUE(Register(*client, "c1", &resp).ok());
  EXPECT_EQ(resp.session_token().size(), auth::kSessionTokenSize);
  v1::Code code = v1::INTERNAL;
  ASSERT_TRUE(PutStart(*client, "c1", &code).ok());
  EXPECT_EQ(code, v1::OK);
  v1::HeartbeatRequest hb;
  hb.set_client_id("c1");
  hb.set_session(resp.session());
  v1::HeartbeatResponse known;
  ASSERT_TRUE(client->Heartbeat(hb, &known).ok());
  EXPECT_TRUE(known.known());
  // As another client: refused as a whole, nothing placed.
  absl::Status other = PutStart(*client, "c2", &code);
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << other;
  EXPECT_EQ(AuthFailures("wrong_client"), 1u);
}

TEST_F(AuthenticatedMasterClientTest, WithoutTheSecretNothingIsAccepted) {
  for (auth::ClusterKeysPtr keys : {auth::ClusterKeysPtr(), Keys(std::string(64, 'x'))}) {
    auto client = Client(keys);
    v1::RegisterClientResponse resp;
    absl::Status s = Register(*client, "c1", &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
    v1::Code code;
    EXPECT_EQ(ToCode(PutStart(*client, "c1", &code)), Code::kUnavailable)
        << "no session: transient for mc-client, which registers again";
  }
  EXPECT_EQ(server_->service().Clients().size(), 0u);
  // The keyless client's RegisterClient, and both clients' PutStart (no session to send).
  EXPECT_EQ(AuthFailures("missing"), 3u);
  EXPECT_EQ(AuthFailures("bad_mac"), 1u);
}

TEST_F(AuthenticatedMasterClientTest, ASessionTheMasterForgotRegistersAgainWithoutWaiting) {
  auto client = Client(Keys(std::string(64, 's')));
  v1::RegisterClientResponse resp;
  ASSERT_TRUE(Register(*client, "c1", &resp).ok());
  // The master forgets us (as after its restart, or our expiry).
  ASSERT_TRUE(server_->service().UnregisterClient("c1", resp.session()).ok());
  v1::HeartbeatRequest hb;
  hb.set_client_id("c1");
  hb.set_session(resp.session());
  v1::HeartbeatResponse known;
  ASSERT_TRUE(client->Heartbeat(hb, &known).ok());
  EXPECT_FALSE(known.known()) << "an unknown session reads as known=false: register again";
  v1::Code code;
  EXPECT_EQ(ToCode(PutStart(*client, "c1", &code)), Code::kUnavailable);
  v1::RegisterClientResponse again;
  ASSERT_TRUE(Register(*client, "c1", &again).ok());
  ASSERT_TRUE(PutStart(*client, "c1", &code).ok());
  EXPECT_EQ(code, v1::OK);
  // A live session re-registers at once when it presents its own token (the same daemon)...
  v1::RegisterClientResponse third;
  ASSERT_TRUE(Register(*client, "c1", &third).ok());
  EXPECT_NE(third.session(), again.session());
  // ...and another daemon with the same id and the secret but not the token does not.
  auto impostor = Client(Keys(std::string(64, 's')));
  v1::RegisterClientResponse stolen;
  EXPECT_EQ(ToCode(Register(*impostor, "c1", &stolen)), Code::kUnavailable);
  ASSERT_TRUE(PutStart(*client, "c1", &code).ok()) << "the real client keeps its session";
}

}  // namespace
}  // namespace mc::client
