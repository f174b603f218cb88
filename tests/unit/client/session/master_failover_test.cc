// The gRPC MasterClient with a list of masters (standbys): in-process masters on
// loopback whose gRPC service answers as leader or standby through a test LeaderGate; calls
// follow the leader a standby names (over TLS with the same credentials), skip addresses that
// refuse connections, retry what was certainly not executed, and a heartbeat to a new leader
// learns the session is unknown.
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/session/master_client.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "master/grpc_service.h"
#include "master/leader_election.h"
#include "master/metadata_service.h"
#include "proto/grpc_tls.h"
#include "tests/fakes/test_certs.h"

namespace mc::client {
namespace {

// Nothing listens on port 1 of loopback: connections are refused.
constexpr char kDeadAddress[] = "127.0.0.1:1";

class TestGate final : public master::LeaderGate {
 public:
  bool Serving() const override {
    calls_.fetch_add(1);
    return serving_.load();
  }
  std::string LeaderAddress() const override {
    absl::MutexLock lock(&mu_);
    return leader_;
  }
  void Set(bool serving, std::string leader) {
    absl::MutexLock lock(&mu_);
    serving_.store(serving);
    leader_ = std::move(leader);
  }
  int calls() const { return calls_.load(); }

 private:
  mutable std::atomic<int> calls_{0};
  std::atomic<bool> serving_{false};
  mutable absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
};

// One master: its own metadata, its gRPC service behind a TestGate.
struct Master {
  explicit Master(
      std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials()) {
    master::MasterOptions o;
    service = std::make_unique<master::MetadataService>(o, RealClock::Get(), metrics);
    grpc_service = std::make_unique<master::MasterGrpcService>(*service, metrics, 100000);
    grpc_service->SetLeaderGate(&gate);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port);
    builder.RegisterService(grpc_service.get());
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~Master() { server->Shutdown(); }

  MetricsRegistry metrics;
  TestGate gate;
  std::unique_ptr<master::MetadataService> service;
  std::unique_ptr<master::MasterGrpcService> grpc_service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

class MasterFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override { SetLogLevel("warn"); }

  std::unique_ptr<MasterClient> Client(const std::string& addresses) {
    return CreateGrpcMasterClient({.address = addresses, .rpc_timeout_ms = 5'000});
  }
  // Registers "c1"; `session` receives the session number.
  static absl::Status Register(MasterClient& client, uint64_t* session = nullptr) {
    v1::RegisterClientRequest reg;
    reg.set_client_id("c1");
    reg.set_data_endpoint("127.0.0.1:1");
    reg.add_segments()->set_size(1 << 20);
    v1::RegisterClientResponse resp;
    absl::Status s = client.RegisterClient(reg, &resp);
    if (session != nullptr) *session = resp.session();
    return s;
  }
  static absl::Status PutStart(MasterClient& client, const std::string& key) {
    v1::PutStartRequest start;
    start.set_client_id("c1");
    auto* item = start.add_items();
    item->set_key(key);
    item->set_size(100);
    v1::PutStartResponse resp;
    absl::Status s = client.PutStart(start, &resp);
    if (s.ok() && resp.results(0).code() != v1::OK) return absl::InternalError("put refused");
    return s;
  }

  Master a_, b_;
};

TEST_F(MasterFailoverTest, StandbyRefusalMovesToTheLeaderItNames) {
  a_.gate.Set(false, b_.address);
  b_.gate.Set(true, b_.address);
  // The dead address between them is skipped: the standby's hint names b.
  auto client = Client(absl::StrCat(a_.address, ",", kDeadAddress, ",", b_.address));
  ASSERT_TRUE(Register(*client).ok());  // refused by a (not executed), retried on b
  ASSERT_TRUE(PutStart(*client, "k1").ok());
  ASSERT_TRUE(PutStart(*client, "k2").ok());
  EXPECT_EQ(a_.gate.calls(), 1);  // later calls go straight to the leader
  EXPECT_EQ(b_.service->KeyCount(), 2u);
  EXPECT_EQ(a_.service->KeyCount(), 0u);
}

// Over TLS the leader a standby names (an address the client was never given) is dialled with
// the same credentials: verified against the same CA, its certificate naming 127.0.0.1.
TEST_F(MasterFailoverTest, TlsClientFollowsTheLeaderWithTheSameCredentials) {
  char tmpl[] = "/tmp/mc-tls-failover-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(tls_test::WriteSelfSignedCert(dir, "master"));
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials({.cert_file = dir + "/master.pem", .key_file = dir + "/master.key"});
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  absl::StatusOr<ChannelSecurity> security =
      ChannelSecurity::Make({.ca_file = dir + "/master.pem"}, {});
  ASSERT_TRUE(security.ok()) << security.status();
  std::filesystem::remove_all(dir);  // both read the files once, when made
  Master standby(*credentials), leader(*credentials);
  standby.gate.Set(false, leader.address);
  leader.gate.Set(true, leader.address);
  auto client = CreateGrpcMasterClient(
      {.address = standby.address, .rpc_timeout_ms = 5'000, .security = *security});
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_TRUE(PutStart(*client, "k1").ok());
  EXPECT_EQ(leader.service->KeyCount(), 1u);
  // A plaintext client reaches neither.
  auto plain = Client(standby.address);
  EXPECT_FALSE(Register(*plain).ok());
}

TEST_F(MasterFailoverTest, RefusedConnectionMovesToTheNextAddress) {
  b_.gate.Set(true, b_.address);
  auto client = Client(absl::StrCat(kDeadAddress, ",", b_.address));
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_TRUE(PutStart(*client, "k1").ok());  // not idempotent, but certainly not sent before
  EXPECT_EQ(b_.service->KeyCount(), 1u);
}

TEST_F(MasterFailoverTest, NewLeaderDoesNotKnowTheSessionSoTheHeartbeatSaysRegisterAgain) {
  a_.gate.Set(true, a_.address);
  b_.gate.Set(false, a_.address);
  auto client = Client(absl::StrCat(a_.address, ",", b_.address));
  uint64_t session = 0;
  ASSERT_TRUE(Register(*client, &session).ok());
  v1::HeartbeatRequest hb;
  hb.set_client_id("c1");
  hb.set_session(session);
  v1::HeartbeatResponse resp;
  ASSERT_TRUE(client->Heartbeat(hb, &resp).ok());
  EXPECT_TRUE(resp.known());
  // Failover: a stands by naming b, b leads with an empty table.
  a_.gate.Set(false, b_.address);
  b_.gate.Set(true, b_.address);
  resp.Clear();
  ASSERT_TRUE(client->Heartbeat(hb, &resp).ok());
  EXPECT_FALSE(resp.known());  // MasterSession registers again, then reports its objects
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_TRUE(PutStart(*client, "k1").ok());
  EXPECT_EQ(b_.service->KeyCount(), 1u);
}

TEST_F(MasterFailoverTest, NoLeaderAnywhereAnswersUnavailableWithinTheDeadline) {
  auto client = CreateGrpcMasterClient(
      {.address = absl::StrCat(a_.address, ",", b_.address), .rpc_timeout_ms = 500});
  const int64_t start = RealClock::Get().NowMs();
  absl::Status s = Register(*client);
  EXPECT_EQ(ToCode(s), Code::kUnavailable) << s;
  EXPECT_LT(RealClock::Get().NowMs() - start, 2000);
  EXPECT_GE(a_.gate.calls(), 2);  // an election under way: asked again, with pauses
}

TEST_F(MasterFailoverTest, OneAddressKeepsTodaysBehaviour) {
  a_.gate.Set(false, "");
  auto client = Client(a_.address);
  absl::Status s = Register(*client);
  EXPECT_EQ(ToCode(s), Code::kUnavailable) << s;
  EXPECT_EQ(a_.gate.calls(), 1);
}

}  // namespace
}  // namespace mc::client
