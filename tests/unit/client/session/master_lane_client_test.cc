// The gRPC MasterClient's master lane against real masters in-process on loopback: the hot calls
// go over the lane (counted), with the session credential, and answer as over gRPC; off by flag;
// over TLS with gRPC's files, refusing a wrong CA, name or client certificate; a master restart
// mid-stream costs no call (gRPC until the new registration brings the new lane); a standby's
// refusal over the lane sends the call the gRPC way, which follows the leader; connections are
// bounded (busy calls take gRPC) and all closed when the client goes; a full master's connection
// is refused by its greeting, so no call is lost to it; a connection idle for half the master's
// idle timeout is not reused; releases go over the lane, and to an older master whose lane does
// not serve them (answered UNIMPLEMENTED) over gRPC, asked once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "client/session/master_client.h"
#include "client/session/master_lane_client.h"
#include "common/auth.h"
#include "common/byte_order.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "master/grpc_service.h"
#include "master/leader_election.h"
#include "master/master_lane.h"
#include "master/master_server.h"
#include "master/metadata_service.h"
#include "proto/grpc_tls.h"
#include "proto/lane_tls.h"
#include "proto/master_lane_frame.h"
#include "tests/fakes/await.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/test_certs.h"

namespace mc::client {
namespace {

class MasterLaneClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel("error");
    signal(SIGPIPE, SIG_IGN);  // as the daemons do (OpenSSL writes with write())
  }

  void StartMaster(const std::string& listen = "127.0.0.1:0", auth::ClusterKeysPtr keys = {},
                   master::MasterServerOptions opts = {}) {
    opts.listen = listen;
    opts.http = "";
    opts.cluster_keys = std::move(keys);
    server_ = std::make_unique<master::MasterServer>(opts);
    ASSERT_TRUE(server_->Start().ok());
  }
  std::unique_ptr<MasterClient> Client(GrpcMasterClientOptions o = {}) {
    o.address = o.address.empty() ? server_->grpc_address() : o.address;
    o.rpc_timeout_ms = 5'000;
    o.release_delay_us = 0;
    o.metrics = &metrics_;
    return CreateGrpcMasterClient(o);
  }
  static absl::Status Register(MasterClient& client, const std::string& id = "c1") {
    v1::RegisterClientRequest reg;
    reg.set_client_id(id);
    reg.set_data_endpoint("127.0.0.1:1");
    reg.add_segments()->set_size(1 << 20);
    v1::RegisterClientResponse resp;
    return client.RegisterClient(reg, &resp);
  }
  // PutStart + PutEnd of `key` as `id`; the code of the item.
  static absl::StatusOr<v1::Code> Put(MasterClient& client, const std::string& key,
                                      const std::string& id = "c1") {
    v1::PutStartRequest start;
    start.set_client_id(id);
    auto* item = start.add_items();
    item->set_key(key);
    item->set_size(100);
    v1::PutStartResponse started;
    absl::Status s = client.PutStart(start, &started);
    if (!s.ok()) return s;
    if (started.results(0).code() != v1::OK) return started.results(0).code();
    v1::PutEndRequest end;
    end.set_client_id(id);
    auto* e = end.add_items();
    e->set_key(key);
    e->set_generation(started.results(0).generation());
    v1::PutEndResponse ended;
    s = client.PutEnd(end, &ended);
    if (!s.ok()) return s;
    return ended.results(0).code();
  }
  static absl::StatusOr<v1::Code> Get(MasterClient& client, const std::string& key) {
    v1::GetReplicasRequest get;
    get.set_client_id("c1");
    get.add_keys(key);
    get.set_no_lease(true);
    v1::GetReplicasResponse got;
    absl::Status s = client.GetReplicas(get, &got);
    if (!s.ok()) return s;
    return got.results(0).code();
  }
  template <typename F>
  static GrpcMasterClientOptions With(F set) {
    GrpcMasterClientOptions o;
    set(o);
    return o;
  }
  uint64_t Calls(const std::string& outcome) {
    return metrics_.GetCounter("mc_client_master_lane_calls_total", "", {{"outcome", outcome}})
        .Value();
  }

  MetricsRegistry metrics_;
  std::unique_ptr<master::MasterServer> server_;
};

TEST_F(MasterLaneClientTest, HotCallsGoOverTheLaneAndAnswerAsOverGrpc) {
  StartMaster();
  auto client = Client();
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_EQ(*Put(*client, "k"), v1::OK);
  EXPECT_EQ(*Get(*client, "k"), v1::OK);
  EXPECT_EQ(*Get(*client, "missing"), v1::NOT_FOUND);
  v1::ExistRequest exist;
  exist.add_keys("k");
  v1::ExistResponse exists;
  ASSERT_TRUE(client->Exist(exist, &exists).ok());
  EXPECT_TRUE(exists.exists(0));
  v1::RemoveRequest remove;
  remove.add_keys("k");
  v1::RemoveResponse removed;
  ASSERT_TRUE(client->Remove(remove, &removed).ok());
  EXPECT_EQ(removed.results(0).code(), v1::OK);
  EXPECT_EQ(Calls("lane"), 6u);  // PutStart, PutEnd, 2 GetReplicas, Exist, Remove
  EXPECT_EQ(server_->lane()->ConnectionsForTest(), 1u) << "one caller reuses one connection";
  client.reset();
  EXPECT_TRUE(WaitFor([&] { return server_->lane()->ConnectionsForTest() == 0; }))
      << "the client closed its connections";
}

TEST_F(MasterLaneClientTest, OffByOptionEverythingGoesOverGrpc) {
  StartMaster();
  auto client = Client(With([&](GrpcMasterClientOptions& o) { o.lane = false; }));
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_EQ(*Put(*client, "k"), v1::OK);
  EXPECT_EQ(*Get(*client, "k"), v1::OK);
  EXPECT_EQ(Calls("lane"), 0u);
  EXPECT_EQ(server_->lane()->ConnectionsForTest(), 0u);
}

TEST_F(MasterLaneClientTest, TheSessionCredentialIsCarriedAndCheckedAsOverGrpc) {
  const auth::ClusterKeysPtr keys = *auth::ClusterKeys::FromSecrets({std::string(64, 's')});
  StartMaster("127.0.0.1:0", keys);
  auto client = Client(With([&](GrpcMasterClientOptions& o) { o.cluster_keys = keys; }));
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_EQ(*Put(*client, "k"), v1::OK);
  absl::StatusOr<v1::Code> other = Put(*client, "k2", "c2");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied) << other.status();
  EXPECT_EQ(Calls("lane"), 3u);
  // The master forgets the session: over the lane too, the transient kUnavailable of gRPC.
  const uint64_t session = server_->service().Clients().at(0).session;
  ASSERT_TRUE(server_->service().UnregisterClient("c1", session).ok());
  EXPECT_EQ(ToCode(Put(*client, "k3").status()), Code::kUnavailable);
}

TEST_F(MasterLaneClientTest, BusyConnectionsSendTheCallOverGrpc) {
  StartMaster();
  auto client = Client(With([&](GrpcMasterClientOptions& o) { o.lane_connections = 1; }));
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_EQ(*Put(*client, "k"), v1::OK);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) ok += Get(*client, "k").value_or(v1::INTERNAL) == v1::OK;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 200);
  EXPECT_EQ(Calls("lane") + Calls("grpc_busy"), 202u);
  EXPECT_LE(server_->lane()->ConnectionsForTest(), 1u);
}

TEST_F(MasterLaneClientTest, AFullMastersGreetingSendsTheCallsOverGrpcAndLosesNone) {
  master::MasterServerOptions opts;
  opts.lane_max_connections = 1;
  StartMaster("127.0.0.1:0", {}, opts);
  auto holder = Client();  // takes the master's one lane connection and keeps it
  ASSERT_TRUE(Register(*holder, "c1").ok());
  ASSERT_EQ(*Put(*holder, "k", "c1"), v1::OK);
  ASSERT_EQ(server_->lane()->ConnectionsForTest(), 1u);
  // A fresh connection of another daemon is accepted, greeted "full" and closed: its PutStart
  // (then PutEnd and Remove, during the backoff) go over gRPC. Sent without reading a greeting,
  // the PutStart's answer would be lost: kUnavailable although the master never read it.
  auto client = Client();
  ASSERT_TRUE(Register(*client, "c2").ok());
  ASSERT_EQ(*Put(*client, "k2", "c2"), v1::OK);
  v1::RemoveRequest remove;
  remove.add_keys("k2");
  v1::RemoveResponse removed;
  ASSERT_TRUE(client->Remove(remove, &removed).ok());
  EXPECT_EQ(removed.results(0).code(), v1::OK);
  EXPECT_EQ(Calls("lost"), 0u);
  EXPECT_EQ(Calls("grpc_not_sent"), 1u);
  EXPECT_EQ(Calls("grpc_busy"), 2u) << "PutEnd and Remove during the backoff";
  EXPECT_EQ(server_->metrics()
                .GetCounter("mc_master_lane_refused_total", "", {{"reason", "max_connections"}})
                .Value(),
            1u);
  EXPECT_EQ(server_->lane()->ConnectionsForTest(), 1u);
}

TEST_F(MasterLaneClientTest, AConnectionIdleForHalfTheMastersIdleTimeoutIsNotReused) {
  StartMaster();  // --lane_idle_timeout_ms 60000: its greeting says so, the daemon reuses < 30 s
  FakeClock clock;
  MasterLaneClient lane(
      {.host = "127.0.0.1", .port = server_->lane_port(), .timeout_ms = 5'000, .clock = &clock});
  auto exist = [&] {
    v1::ExistRequest req;
    req.add_keys("k");
    v1::ExistResponse resp;
    grpc::Status status;
    std::string leader;
    return lane.Call(lane::kExist, "", req, &resp, &status, &leader) ==
               MasterLaneClient::Outcome::kAnswered &&
           status.ok();
  };
  ASSERT_TRUE(exist());
  EXPECT_EQ(lane.ConnectedForTest(), 1u);
  clock.AdvanceMs(29'999);
  ASSERT_TRUE(exist());
  EXPECT_EQ(lane.ConnectedForTest(), 1u) << "idle for less than 30 s: reused";
  clock.AdvanceMs(30'000);
  ASSERT_TRUE(exist());
  EXPECT_EQ(lane.ConnectedForTest(), 2u) << "idle for 30 s: closed by the daemon, a new one";
  EXPECT_EQ(lane.OpenConnectionsForTest(), 1);
  EXPECT_TRUE(WaitFor([&] { return server_->lane()->ConnectionsForTest() == 1u; }));
  EXPECT_EQ(server_->metrics()
                .GetCounter("mc_master_lane_refused_total", "", {{"reason", "idle"}})
                .Value(),
            0u);
}

// Certificates in a temporary directory: master (SAN IP:127.0.0.1, DNS:localhost), client
// and other, each self-signed (its own CA).
class Certs {
 public:
  Certs() {
    char tmpl[] = "/tmp/mc-lane-tls-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    for (const char* name : {"master", "client", "other"}) {
      EXPECT_TRUE(tls_test::WriteSelfSignedCert(dir, name));
    }
  }
  ~Certs() { std::filesystem::remove_all(dir); }
  std::string pem(const std::string& name) const { return dir + "/" + name + ".pem"; }
  std::string key(const std::string& name) const { return dir + "/" + name + ".key"; }
  std::string dir;
};

TEST_F(MasterLaneClientTest, WithTlsTheHotCallsGoOverTheTlsLane) {
  Certs certs;
  master::MasterServerOptions opts;
  opts.tls = {.cert_file = certs.pem("master"), .key_file = certs.key("master")};
  StartMaster("127.0.0.1:0", {}, opts);
  absl::StatusOr<ChannelSecurity> security =
      ChannelSecurity::Make({.ca_file = certs.pem("master")}, TlsFlagNames{});
  ASSERT_TRUE(security.ok()) << security.status();
  auto client = Client(With([&](GrpcMasterClientOptions& o) { o.security = *security; }));
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_EQ(*Put(*client, "k"), v1::OK);
  EXPECT_EQ(*Get(*client, "k"), v1::OK);
  EXPECT_EQ(Calls("lane"), 3u);
  EXPECT_EQ(server_->lane()->ConnectionsForTest(), 1u);
  client.reset();
  EXPECT_TRUE(WaitFor([&] { return server_->lane()->ConnectionsForTest() == 0; }));
}

TEST_F(MasterLaneClientTest, TheTlsLaneRefusesAWrongCaAWrongNameAndAMissingClientCertificate) {
  Certs certs;
  master::MasterServerOptions opts;
  opts.tls = {.cert_file = certs.pem("master"),
              .key_file = certs.key("master"),
              .client_ca_file = certs.pem("client")};
  StartMaster("127.0.0.1:0", {}, opts);
  auto call = [&](const TlsChannelFiles& files, const std::string& host) {
    absl::StatusOr<std::shared_ptr<const lane::TlsContext>> tls =
        lane::TlsContext::ForClient(files);
    EXPECT_TRUE(tls.ok()) << tls.status();
    MasterLaneClient lane({.host = "127.0.0.1",
                           .port = server_->lane_port(),
                           .timeout_ms = 5'000,
                           .tls = *tls,
                           .tls_host = host});
    v1::ExistRequest req;
    req.add_keys("k");
    v1::ExistResponse resp;
    grpc::Status status;
    std::string leader;
    return lane.Call(lane::kExist, "", req, &resp, &status, &leader);
  };
  const TlsChannelFiles good{.ca_file = certs.pem("master"),
                             .cert_file = certs.pem("client"),
                             .key_file = certs.key("client")};
  EXPECT_EQ(call(good, "127.0.0.1"), MasterLaneClient::Outcome::kAnswered);
  EXPECT_EQ(call(good, "localhost"), MasterLaneClient::Outcome::kAnswered);
  TlsChannelFiles wrong_ca = good;
  wrong_ca.ca_file = certs.pem("other");
  EXPECT_EQ(call(wrong_ca, "127.0.0.1"), MasterLaneClient::Outcome::kNotSent);
  EXPECT_EQ(call(good, "master.example"), MasterLaneClient::Outcome::kNotSent);
  EXPECT_EQ(call(good, "127.0.0.2"), MasterLaneClient::Outcome::kNotSent);
  EXPECT_EQ(call({.ca_file = certs.pem("master")}, "127.0.0.1"),
            MasterLaneClient::Outcome::kNotSent)
      << "the master requires a client certificate";
  TlsChannelFiles wrong_cert = good;
  wrong_cert.cert_file = certs.pem("other");
  wrong_cert.key_file = certs.key("other");
  EXPECT_EQ(call(wrong_cert, "127.0.0.1"), MasterLaneClient::Outcome::kNotSent);
  EXPECT_TRUE(WaitFor([&] {
    return server_->metrics()
               .GetCounter("mc_master_lane_refused_total", "", {{"reason", "handshake"}})
               .Value() == 5u;
  }));
  EXPECT_EQ(
      server_->metrics().GetCounter("mc_master_rpc_requests_total", "", {{"rpc", "Exist"}}).Value(),
      2u)
      << "only the two good connections were served";
  EXPECT_TRUE(WaitFor([&] { return server_->lane()->ConnectionsForTest() == 0; }));
}

TEST_F(MasterLaneClientTest, AMasterRestartMidStreamLosesNoCall) {
  StartMaster();
  const std::string address = server_->grpc_address();
  auto client = Client();
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_EQ(*Put(*client, "k"), v1::OK);
  const uint64_t before = Calls("lane");
  server_->Shutdown();
  server_.reset();
  StartMaster(address);  // the same gRPC address; another lane port
  // gRPC's channel reconnects on its own schedule (its calls fail until then, lane or not).
  ASSERT_TRUE(WaitFor([&] { return Get(*client, "k").ok(); }));
  // The old lane is closed: every call goes over gRPC, none fails for the lane's sake.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(*Get(*client, "k"), v1::NOT_FOUND) << "the new master does not know k";
    EXPECT_TRUE(Put(*client, absl::StrCat("before-", i)).ok());
  }
  EXPECT_EQ(Calls("lane"), before);
  EXPECT_EQ(Calls("lost"), 0u);
  // The registration after the restart brings the new lane.
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_EQ(*Put(*client, "k"), v1::OK);
  EXPECT_EQ(*Get(*client, "k"), v1::OK);
  EXPECT_EQ(Calls("lane"), before + 3);
}

// A master by hand: its gRPC service behind a gate it sets, and a lane.
class Gate final : public master::LeaderGate {
 public:
  bool Serving() const override { return serving.load(); }
  std::string LeaderAddress() const override {
    absl::MutexLock lock(&mu);
    return leader;
  }
  std::atomic<bool> serving{true};
  mutable absl::Mutex mu;
  std::string leader ABSL_GUARDED_BY(mu);
};
struct HandMaster {
  // `advertise`: the lane port the registration answer names, given the lane's own.
  explicit HandMaster(const std::function<int(int)>& advertise = {}) {
    service = std::make_unique<master::MetadataService>(master::MasterOptions{}, RealClock::Get(),
                                                        metrics);
    grpc_service = std::make_unique<master::MasterGrpcService>(*service, metrics, 100000);
    grpc_service->SetLeaderGate(&gate);
    lane = std::make_unique<master::MasterLane>(master::MasterLaneOptions{.listen = "127.0.0.1:0"},
                                                *grpc_service, metrics);
    const int lane_port = *lane->Start();
    grpc_service->SetLanePort(advertise ? advertise(lane_port) : lane_port);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(grpc_service.get());
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~HandMaster() {
    lane->Stop();
    server->Shutdown();
  }
  MetricsRegistry metrics;
  Gate gate;
  std::unique_ptr<master::MetadataService> service;
  std::unique_ptr<master::MasterGrpcService> grpc_service;
  std::unique_ptr<master::MasterLane> lane;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

TEST_F(MasterLaneClientTest, AStandbysRefusalOverTheLaneGoesTheGrpcWayToTheLeader) {
  HandMaster a, b;
  auto client = Client(With(
      [&](GrpcMasterClientOptions& o) { o.address = absl::StrCat(a.address, ",", b.address); }));
  ASSERT_TRUE(Register(*client).ok());
  ASSERT_EQ(*Put(*client, "k"), v1::OK);
  EXPECT_EQ(Calls("lane"), 2u);
  // a steps down for b.
  {
    absl::MutexLock lock(&a.gate.mu);
    a.gate.leader = b.address;
  }
  a.gate.serving = false;
  // b does not know c1 yet: whatever b answers, it answers over gRPC, and a runs nothing.
  (void)Put(*client, "k2");
  EXPECT_EQ(Calls("grpc_standby"), 1u);
  EXPECT_EQ(a.service->KeyCount(), 1u);
  const uint64_t lane_calls = Calls("lane");
  // The session registers again (with b, the current master), and b's lane serves.
  ASSERT_TRUE(Register(*client).ok());
  EXPECT_EQ(b.service->Clients().size(), 1u);
  ASSERT_EQ(*Put(*client, "k3"), v1::OK);
  EXPECT_EQ(Calls("lane"), lane_calls + 2);
  EXPECT_EQ(b.lane->ConnectionsForTest(), 1u);
  EXPECT_TRUE(b.service->Exist({"k3"})[0]);
}

// A master from before ReleaseLeases joined the lane, as a daemon sees it: a relay in front of
// a current master's lane that answers ReleaseLeases (method 9) UNIMPLEMENTED without passing
// it on, as that master did, and passes every other frame through unchanged.
class OldLane {
 public:
  explicit OldLane(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 16), 0);
    EXPECT_EQ(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~OldLane() {
    shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    {
      absl::MutexLock lock(&mu_);
      for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : relays_) t.join();  // the acceptor is gone: no thread is added
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) close(fd);
    close(listen_fd_);
  }
  int port() const { return port_; }
  int refused() const { return refused_.load(); }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }
  void Accept() {
    for (;;) {
      const int down = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (down < 0) return;
      const int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const sockaddr_in target = Loopback(target_port_);
      EXPECT_EQ(connect(up, reinterpret_cast<const sockaddr*>(&target), sizeof(target)), 0);
      absl::MutexLock lock(&mu_);
      fds_.push_back(down);
      fds_.push_back(up);
      relays_.emplace_back([this, down, up] { Relay(down, up); });
    }
  }
  void Relay(int down_fd, int up_fd) {
    lane::Stream down(down_fd, nullptr), up(up_fd, nullptr);
    char greeting[lane::kGreetingBytes];
    if (!up.ReadExactly(greeting, sizeof(greeting)) ||
        !down.WriteAll(std::string(greeting, sizeof(greeting)))) {
      return;
    }
    for (;;) {
      lane::Request request;
      if (!lane::ReadRequest(down.Reader(), 64 << 20, &request).ok()) return;
      std::string out;
      if (request.method == lane::kReleaseLeases) {
        ++refused_;
        lane::AppendReply(grpc::StatusCode::UNIMPLEMENTED, request.call_id, "not on this lane", "",
                          nullptr, &out);
        if (!down.WriteAll(out)) return;
        continue;
      }
      out.append(lane::kRequestMagic);
      AppendLe<uint32_t>(out, request.method);
      AppendLe<uint64_t>(out, request.call_id);
      AppendLe<uint32_t>(out, static_cast<uint32_t>(request.credential.size()));
      out.append(request.credential);
      AppendLe<uint32_t>(out, static_cast<uint32_t>(request.body.size()));
      out.append(request.body);
      lane::Reply reply;
      if (!up.WriteAll(out) || !lane::ReadReply(up.Reader(), 64 << 20, &reply).ok()) return;
      out.clear();
      out.append(lane::kReplyMagic);
      AppendLe<uint32_t>(out, reply.code);
      AppendLe<uint64_t>(out, reply.call_id);
      for (const std::string* field : {&reply.message, &reply.leader, &reply.body}) {
        AppendLe<uint32_t>(out, static_cast<uint32_t>(field->size()));
        out.append(*field);
      }
      if (!down.WriteAll(out)) return;
    }
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> refused_{0};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> relays_;  // the acceptor's until it ends
};

// A daemon's releases (its explicit ReleaseLeases, and those its sender sends alone) go over the
// lane; to a master whose lane does not serve them, over gRPC: asked once, then at once.
TEST_F(MasterLaneClientTest, ReleasesGoOverTheLaneOrToAnOlderMasterOverGrpc) {
  for (const bool old : {false, true}) {
    SCOPED_TRACE(old ? "an older master" : "a current master");
    std::unique_ptr<OldLane> relay;
    HandMaster m([&](int lane_port) {
      if (!old) return lane_port;
      relay = std::make_unique<OldLane>(lane_port);
      return relay->port();
    });
    auto client = Client(With([&](GrpcMasterClientOptions& o) { o.address = m.address; }));
    ASSERT_TRUE(Register(*client).ok());
    ASSERT_EQ(*Put(*client, "k"), v1::OK);
    const auto lease = [&] {
      v1::GetReplicasRequest get;
      get.set_client_id("c1");
      get.add_keys("k");
      v1::GetReplicasResponse got;
      EXPECT_TRUE(client->GetReplicas(get, &got).ok());
      EXPECT_EQ(m.service->ActiveLeaseCount(), 1u);
      v1::ReleaseLeasesRequest release;
      release.set_lease_id(got.lease_id());
      release.add_keys("k");
      return release;
    };
    const uint64_t lane_calls = Calls("lane");
    const uint64_t unserved = Calls("grpc_unserved");
    for (int round = 0; round < 2; ++round) {
      ASSERT_TRUE(client->ReleaseLeases(lease()).ok());
      EXPECT_EQ(m.service->ActiveLeaseCount(), 0u);
      EventCounter done;
      client->ReleaseLeasesAsync(lease(), [&](absl::Status s) {
        EXPECT_TRUE(s.ok()) << s;
        done.Add();
      });
      ASSERT_TRUE(done.AwaitAtLeast(1));
      EXPECT_EQ(m.service->ActiveLeaseCount(), 0u);
    }
    EXPECT_EQ(m.metrics.GetCounter("mc_master_rpc_requests_total", "", {{"rpc", "ReleaseLeases"}})
                  .Value(),
              4u);
    // 4 lookups over the lane either way; the 4 releases too, unless the master is older.
    EXPECT_EQ(Calls("lane") - lane_calls, old ? 4u : 8u);
    EXPECT_EQ(Calls("grpc_unserved") - unserved, old ? 1u : 0u)
        << "asked once, then sent over gRPC at once";
    EXPECT_EQ(relay != nullptr ? relay->refused() : 0, old ? 1 : 0);
    client.reset();
  }
}

}  // namespace
}  // namespace mc::client
