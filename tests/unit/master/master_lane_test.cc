// The master lane (master/master_lane.h) against a real mc-master in-process on loopback, with
// raw frames: its answers equal gRPC's, it authenticates exactly like gRPC (no, wrong or expired
// session; another client's request; calls it does not serve), a standby names its leader,
// malformed frames are answered or closed while others are served, and the connection bound
// (a connection over it is greeted "full") and idle timeout hold, with every connection thread
// gone afterwards; with TLS a plaintext client is refused before any frame is read.
#include "master/master_lane.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/master_credentials.h"
#include "gtest/gtest.h"
#include "master/leader_election.h"
#include "master/master_server.h"
#include "master/metadata_service.h"
#include "proto/lane_tls.h"
#include "proto/master_lane_frame.h"
#include "proto/protobuf_log.h"
#include "tests/fakes/await.h"
#include "tests/fakes/test_certs.h"

namespace mc::master {
namespace {

namespace v1 = mcstore::v1;

lane::ReadExactly Reader(int fd);

// A blocking loopback connection to `port` from `source` (a 127.x.y.z address in host order),
// 5 s timeouts, nothing read yet.
int ConnectRaw(int port, uint32_t source = INADDR_LOOPBACK) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(source);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// ConnectRaw, and the lane's "ready" greeting read.
int Connect(int port) {
  const int fd = ConnectRaw(port);
  absl::StatusOr<uint32_t> idle_ms = lane::ReadGreeting(Reader(fd));
  EXPECT_TRUE(idle_ms.ok()) << idle_ms.status();
  return fd;
}

void Send(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// Reads `fd` through a plaintext lane::Stream, as the daemon does.
lane::ReadExactly Reader(int fd) {
  auto stream = std::make_shared<lane::Stream>(fd, nullptr);
  return [stream](char* dst, size_t n) { return stream->ReadExactly(dst, n); };
}

// True when the peer closed the connection within the timeout: EOF, or a reset (a close with
// bytes of ours still unread).
bool Closed(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// One call over the lane; `*leader` gets a standby's leader.
template <typename Req, typename Resp>
grpc::Status LaneCall(int fd, uint32_t method, const std::string& credential, const Req& req,
                      Resp* resp, std::string* leader = nullptr) {
  std::string frame;
  lane::AppendRequest(method, 77, credential, req, &frame);
  Send(fd, frame);
  lane::Reply reply;
  absl::Status s = lane::ReadReply(Reader(fd), 1 << 20, &reply);
  if (!s.ok()) return grpc::Status(grpc::StatusCode::DATA_LOSS, std::string(s.message()));
  EXPECT_EQ(reply.call_id, 77u);
  if (leader != nullptr) *leader = reply.leader;
  if (reply.code == 0) {
    EXPECT_TRUE(resp->ParseFromString(reply.body));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(reply.code), reply.message);
}

v1::PutStartRequest PutStartOf(const std::string& client, const std::string& key) {
  v1::PutStartRequest req;
  req.set_client_id(client);
  auto* item = req.add_items();
  item->set_key(key);
  item->set_size(100);
  return req;
}

class MasterLaneTest : public ::testing::Test {
 protected:
  void SetUp() override { SetLogLevel("error"); }

  void Start(MasterServerOptions opts = {}) {
    opts.listen = "127.0.0.1:0";
    opts.http = "";
    server_ = std::make_unique<MasterServer>(opts);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_NE(server_->lane_port(), 0);
    stub_ = v1::Master::NewStub(
        grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials()));
  }
  // Registers `id` over gRPC (with `proof` when authenticated); returns the answer.
  v1::RegisterClientResponse Register(const std::string& id, const std::string& proof = "") {
    v1::RegisterClientRequest reg;
    reg.set_client_id(id);
    reg.set_data_endpoint("127.0.0.1:1");
    reg.add_segments()->set_size(1 << 20);
    grpc::ClientContext ctx;
    if (!proof.empty()) ctx.AddMetadata(auth::kProofHeader, proof);
    v1::RegisterClientResponse resp;
    grpc::Status s = stub_->RegisterClient(&ctx, reg, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  uint64_t Counted(const std::string& name, const Labels& labels) {
    return server_->metrics().GetCounter(name, "", labels).Value();
  }

  std::unique_ptr<MasterServer> server_;
  std::unique_ptr<v1::Master::Stub> stub_;
};

TEST_F(MasterLaneTest, AnswersEqualGrpcsAndCountAsTheSameRpcs) {
  Start();
  const v1::RegisterClientResponse reg = Register("c1");
  EXPECT_EQ(reg.lane_port(), static_cast<uint32_t>(server_->lane_port()));
  const int fd = Connect(server_->lane_port());
  v1::PutStartResponse started;
  ASSERT_TRUE(LaneCall(fd, lane::kPutStart, "", PutStartOf("c1", "k"), &started).ok());
  ASSERT_EQ(started.results(0).code(), v1::OK);
  v1::PutEndRequest end;
  end.set_client_id("c1");
  end.add_items()->set_key("k");
  end.mutable_items(0)->set_generation(started.results(0).generation());
  v1::PutEndResponse ended;
  ASSERT_TRUE(LaneCall(fd, lane::kPutEnd, "", end, &ended).ok());
  ASSERT_EQ(ended.results(0).code(), v1::OK);

  v1::GetReplicasRequest get;
  get.set_client_id("c1");
  get.add_keys("k");
  get.add_keys("missing");
  get.set_no_lease(true);
  v1::GetReplicasResponse over_lane, over_grpc;
  ASSERT_TRUE(LaneCall(fd, lane::kGetReplicas, "", get, &over_lane).ok());
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetReplicas(&ctx, get, &over_grpc).ok());
  EXPECT_EQ(over_lane.SerializeAsString(), over_grpc.SerializeAsString());
  EXPECT_EQ(over_lane.results(0).code(), v1::OK);
  EXPECT_EQ(over_lane.results(1).code(), v1::NOT_FOUND);

  v1::ExistRequest exist;
  exist.add_keys("k");
  exist.add_keys("missing");
  v1::ExistResponse exist_lane, exist_grpc;
  ASSERT_TRUE(LaneCall(fd, lane::kExist, "", exist, &exist_lane).ok());
  grpc::ClientContext ctx2;
  ASSERT_TRUE(stub_->Exist(&ctx2, exist, &exist_grpc).ok());
  EXPECT_EQ(exist_lane.SerializeAsString(), exist_grpc.SerializeAsString());

  // A lease released over the lane, another over gRPC: the same answers, no lease left.
  v1::GetReplicasRequest leased;
  leased.set_client_id("c1");
  leased.add_keys("k");
  v1::ReleaseLeasesResponse released_lane, released_grpc;
  for (v1::ReleaseLeasesResponse* released : {&released_lane, &released_grpc}) {
    v1::GetReplicasResponse got;
    ASSERT_TRUE(LaneCall(fd, lane::kGetReplicas, "", leased, &got).ok());
    ASSERT_EQ(server_->service().ActiveLeaseCount(), 1u);
    v1::ReleaseLeasesRequest release;
    release.set_lease_id(got.lease_id());
    release.add_keys("k");
    if (released == &released_lane) {
      ASSERT_TRUE(LaneCall(fd, lane::kReleaseLeases, "", release, released).ok());
    } else {
      grpc::ClientContext release_ctx;
      ASSERT_TRUE(stub_->ReleaseLeases(&release_ctx, release, released).ok());
    }
    EXPECT_EQ(server_->service().ActiveLeaseCount(), 0u);
  }
  EXPECT_EQ(released_lane.SerializeAsString(), released_grpc.SerializeAsString());
  EXPECT_EQ(released_lane.released(), 1u);

  // A revoke of a put never started, then a remove: the same per-item answers as gRPC's.
  v1::PutRevokeRequest revoke;
  revoke.set_client_id("c1");
  revoke.add_items()->set_key("never");
  v1::PutRevokeResponse revoked_lane, revoked_grpc;
  ASSERT_TRUE(LaneCall(fd, lane::kPutRevoke, "", revoke, &revoked_lane).ok());
  grpc::ClientContext ctx3;
  ASSERT_TRUE(stub_->PutRevoke(&ctx3, revoke, &revoked_grpc).ok());
  EXPECT_EQ(revoked_lane.SerializeAsString(), revoked_grpc.SerializeAsString());
  v1::RemoveRequest remove;
  remove.add_keys("k");
  v1::RemoveResponse removed;
  ASSERT_TRUE(LaneCall(fd, lane::kRemove, "", remove, &removed).ok());
  EXPECT_EQ(removed.results(0).code(), v1::OK);
  EXPECT_FALSE(server_->service().Exist({"k"})[0]);

  // The per-RPC metrics are gRPC's: GetReplicas and ReleaseLeases counted over both paths.
  EXPECT_EQ(Counted("mc_master_rpc_requests_total", {{"rpc", "GetReplicas"}}), 4u);
  EXPECT_EQ(Counted("mc_master_rpc_requests_total", {{"rpc", "ReleaseLeases"}}), 2u);
  EXPECT_EQ(Counted("mc_master_rpc_requests_total", {{"rpc", "PutStart"}}), 1u);
  close(fd);
}

TEST_F(MasterLaneTest, TheBatchLimitIsGrpcs) {
  MasterServerOptions opts;
  opts.max_batch_items = 2;
  Start(opts);
  Register("c1");
  const int fd = Connect(server_->lane_port());
  v1::ExistRequest exist;
  for (int i = 0; i < 3; ++i) exist.add_keys(absl::StrCat("k", i));
  v1::ExistResponse resp;
  EXPECT_EQ(LaneCall(fd, lane::kExist, "", exist, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Counted("mc_master_rpc_failures_total", {{"rpc", "Exist"}}), 1u);
  close(fd);
}

TEST_F(MasterLaneTest, WithAuthenticationOnlyTheCallersOwnLiveSessionIsServed) {
  const auth::ClusterKeysPtr keys = *auth::ClusterKeys::FromSecrets({std::string(64, 's')});
  MasterServerOptions opts;
  opts.cluster_keys = keys;
  Start(opts);
  v1::HelloResponse hello;
  grpc::ClientContext hctx;
  ASSERT_TRUE(stub_->Hello(&hctx, v1::HelloRequest(), &hello).ok());
  const v1::RegisterClientResponse reg =
      Register("c1", auth::MakeProof(*keys, auth::ProofRole::kRegister, "c1", "127.0.0.1:1",
                                     auth::UnixNowMs(), hello.run_id()));
  const std::string mine = auth::MakeSessionCredential("c1", reg.session_token());
  const std::string forged = auth::MakeSessionCredential("c1", std::string(16, 'x'));
  const int fd = Connect(server_->lane_port());
  v1::PutStartResponse resp;
  EXPECT_EQ(LaneCall(fd, lane::kPutStart, "", PutStartOf("c1", "a"), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(LaneCall(fd, lane::kPutStart, forged, PutStartOf("c1", "a"), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(LaneCall(fd, lane::kPutStart, "junk", PutStartOf("c1", "a"), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(LaneCall(fd, lane::kPutStart, mine, PutStartOf("c2", "a"), &resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(server_->service().KeyCount(), 0u) << "refused calls change nothing";
  ASSERT_TRUE(LaneCall(fd, lane::kPutStart, mine, PutStartOf("c1", "a"), &resp).ok());
  EXPECT_EQ(resp.results(0).code(), v1::OK);
  EXPECT_EQ(Counted("mc_master_auth_failures_total", {{"reason", "wrong_client"}}), 1u);
  // RegisterClient is not served over the lane, with or without a proof.
  v1::RegisterClientRequest again;
  again.set_client_id("c3");
  v1::RegisterClientResponse again_resp;
  EXPECT_EQ(LaneCall(fd, lane::kRegisterClient, mine, again, &again_resp).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(server_->service().Clients().size(), 1u);
  // An ended session: refused like over gRPC.
  ASSERT_TRUE(server_->service().UnregisterClient("c1", reg.session()).ok());
  EXPECT_EQ(LaneCall(fd, lane::kPutStart, mine, PutStartOf("c1", "b"), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  close(fd);
}

TEST_F(MasterLaneTest, MalformedFramesAreAnsweredOrClosedAndOthersAreStillServed) {
  Start();
  Register("c1");
  const int port = server_->lane_port();
  const std::string good = [] {
    std::string f;
    lane::AppendRequest(lane::kExist, 1, "", v1::ExistRequest(), &f);
    return f;
  }();
  lane::Reply reply;
  {  // bad magic: answered, then closed
    const int fd = Connect(port);
    std::string bad = good.substr(0, 20);  // the fixed head only: nothing left unread
    bad[0] = 'X';
    Send(fd, bad);
    ASSERT_TRUE(lane::ReadReply(Reader(fd), 1 << 20, &reply).ok());
    EXPECT_EQ(reply.code, static_cast<uint32_t>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_TRUE(Closed(fd));
    close(fd);
  }
  for (size_t at : {size_t{16}, good.size() - 4}) {  // a huge credential, then a huge body
    const int fd = Connect(port);
    std::string bad = good.substr(0, at);
    bad += std::string("\xff\xff\xff\x7f", 4);
    Send(fd, bad);
    ASSERT_TRUE(lane::ReadReply(Reader(fd), 1 << 20, &reply).ok());
    EXPECT_NE(reply.code, 0u);
    EXPECT_TRUE(Closed(fd));
    close(fd);
  }
  {  // truncated: the master closes once the peer does, without an answer
    const int fd = Connect(port);
    Send(fd, good.substr(0, 10));
    shutdown(fd, SHUT_WR);
    EXPECT_TRUE(Closed(fd));
    close(fd);
  }
  {  // an unknown method and a garbage body: answered, and the connection serves on
    const int fd = Connect(port);
    v1::ExistResponse resp;
    EXPECT_EQ(LaneCall(fd, 999, "", v1::ExistRequest(), &resp).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
    std::string garbage;
    lane::AppendRequest(lane::kGetReplicas, 77, "", v1::ExistRequest(), &garbage);
    garbage.resize(garbage.size() - 4);
    garbage += std::string("\x04\x00\x00\x00\xff\xff\xff\xff", 8);
    Send(fd, garbage);
    ASSERT_TRUE(lane::ReadReply(Reader(fd), 1 << 20, &reply).ok());
    EXPECT_EQ(reply.code, static_cast<uint32_t>(grpc::StatusCode::INVALID_ARGUMENT));
    v1::ExistRequest exist;
    exist.add_keys("k");
    ASSERT_TRUE(LaneCall(fd, lane::kExist, "", exist, &resp).ok());
    EXPECT_EQ(resp.exists_size(), 1);
    close(fd);
  }
  EXPECT_EQ(Counted("mc_master_lane_refused_total", {{"reason", "malformed"}}), 3u);
  EXPECT_TRUE(WaitFor([&] { return server_->lane()->ConnectionsForTest() == 0; }));
}

TEST_F(MasterLaneTest, ConnectionsAreBoundedAndIdleOnesClosed) {
  MasterServerOptions opts;
  opts.lane_max_connections = 2;
  opts.lane_idle_timeout_ms = 1000;  // long enough that the third arrives before it
  Start(opts);
  Register("c1");
  v1::ExistResponse resp;
  const int a = ConnectRaw(server_->lane_port());
  EXPECT_EQ(*lane::ReadGreeting(Reader(a)), 1000u) << "ready, naming the idle timeout";
  const int b = Connect(server_->lane_port());
  ASSERT_TRUE(LaneCall(a, lane::kExist, "", v1::ExistRequest(), &resp).ok());
  ASSERT_TRUE(LaneCall(b, lane::kExist, "", v1::ExistRequest(), &resp).ok());
  const int c = ConnectRaw(server_->lane_port());
  EXPECT_EQ(lane::ReadGreeting(Reader(c)).status().message(), "the master lane is full");
  EXPECT_TRUE(Closed(c)) << "over the bound: accepted, greeted \"full\" and closed at once";
  EXPECT_EQ(Counted("mc_master_lane_refused_total", {{"reason", "max_connections"}}), 1u);
  EXPECT_EQ(server_->lane()->ConnectionsForTest(), 2u);
  // Silent past the idle timeout: closed by the master; the threads end.
  EXPECT_TRUE(Closed(a));
  EXPECT_TRUE(Closed(b));
  EXPECT_TRUE(WaitFor([&] { return server_->lane()->ConnectionsForTest() == 0; }));
  EXPECT_EQ(Counted("mc_master_lane_refused_total", {{"reason", "idle"}}), 2u);
  for (int fd : {a, b, c}) close(fd);
}

TEST_F(MasterLaneTest, OneAddressOverItsBoundIsRefusedWhileAnotherConnects) {
  MasterServerOptions opts;
  opts.lane_max_connections = 8;
  opts.lane_max_connections_per_address = 2;
  Start(opts);
  const int port = server_->lane_port();
  const uint32_t other = (127u << 24) | 2;  // 127.0.0.2
  const int a = Connect(port);
  const int b = Connect(port);
  const int c = ConnectRaw(port);
  EXPECT_EQ(lane::ReadGreeting(Reader(c)).status().message(), "the master lane is full");
  EXPECT_TRUE(Closed(c));
  EXPECT_EQ(Counted("mc_master_lane_refused_total", {{"reason", "per_address"}}), 1u);
  EXPECT_EQ(Counted("mc_master_lane_refused_total", {{"reason", "max_connections"}}), 0u);
  const int d = ConnectRaw(port, other);
  EXPECT_TRUE(lane::ReadGreeting(Reader(d)).ok()) << "another address still connects";
  EXPECT_EQ(server_->lane()->ConnectionsForTest(), 3u);
  // One of the first address's connections ends: it has room again.
  close(a);
  EXPECT_TRUE(WaitFor([&] { return server_->lane()->ConnectionsForTest() == 2; }));
  const int e = Connect(port);
  v1::ExistResponse resp;
  EXPECT_TRUE(LaneCall(e, lane::kExist, "", v1::ExistRequest(), &resp).ok());
  EXPECT_EQ(Counted("mc_master_lane_refused_total", {{"reason", "per_address"}}), 1u);
  for (int fd : {b, c, d, e}) close(fd);
  EXPECT_TRUE(WaitFor([&] { return server_->lane()->ConnectionsForTest() == 0; }));
}

TEST_F(MasterLaneTest, NonUtf8StringsAreRefusedWithoutALogLinePerFrame) {
  RouteProtobufLogs();  // as the daemons do
  Start();
  Register("c1");
  const ProtobufLogStats before = ProtobufLogStatsNow();
  v1::GetReplicasRequest get;
  get.set_client_id(std::string("\xff\xfe", 2));  // not UTF-8: protobuf refuses to parse it
  get.add_keys("k");
  constexpr uint64_t kFrames = 50;
  const int fd = Connect(server_->lane_port());
  for (uint64_t i = 0; i < kFrames; ++i) {
    v1::GetReplicasResponse resp;
    EXPECT_EQ(LaneCall(fd, lane::kGetReplicas, "", get, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  for (int i = 0; i < 5; ++i) {  // gRPC refuses it too
    grpc::ClientContext ctx;
    v1::GetReplicasResponse resp;
    EXPECT_FALSE(stub_->GetReplicas(&ctx, get, &resp).ok());
  }
  const ProtobufLogStats after = ProtobufLogStatsNow();
  EXPECT_GE(after.messages - before.messages, kFrames + 5) << "each one reported and counted";
  EXPECT_LE(after.logged - before.logged, 1u) << "at most one line per 10 s";
  EXPECT_EQ(Counted("mc_master_rpc_requests_total", {{"rpc", "GetReplicas"}}), 0u)
      << "refused before the handler";
  close(fd);
}

class StandbyGate final : public LeaderGate {
 public:
  bool Serving() const override { return false; }
  std::string LeaderAddress() const override { return "10.9.8.7:50051"; }
};

TEST_F(MasterLaneTest, AStandbyRefusesNamingItsLeader) {
  MetricsRegistry metrics;
  MetadataService service(MasterOptions{}, RealClock::Get(), metrics);
  MasterGrpcService grpc_service(service, metrics, 1000);
  StandbyGate gate;
  grpc_service.SetLeaderGate(&gate);
  MasterLane lane({.listen = "127.0.0.1:0"}, grpc_service, metrics);
  absl::StatusOr<int> port = lane.Start();
  ASSERT_TRUE(port.ok());
  const int fd = Connect(*port);
  v1::ExistResponse resp;
  std::string leader;
  grpc::Status s = LaneCall(fd, lane::kExist, "", v1::ExistRequest(), &resp, &leader);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(leader, "10.9.8.7:50051");
  lane.Stop();  // with the connection still open: closed, its thread joined
  EXPECT_TRUE(Closed(fd));
  EXPECT_EQ(lane.ConnectionsForTest(), 0u);
  close(fd);
}

TEST_F(MasterLaneTest, NotOpenedWhenOff) {
  MasterServerOptions opts;
  opts.listen = "127.0.0.1:0";
  opts.http = "";
  opts.lane = false;
  MasterServer server(opts);
  ASSERT_TRUE(server.Start().ok());
  EXPECT_EQ(server.lane_port(), 0);
  EXPECT_EQ(server.lane(), nullptr);
}

// Everything the peer sends until it closes (bounded by the 5 s receive timeout).
std::string ReadToEnd(int fd) {
  std::string all;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return all;
    all.append(buf, static_cast<size_t>(n));
  }
}

TEST_F(MasterLaneTest, WithTlsAPlaintextClientIsRefusedAndNothingIsServed) {
  char tmpl[] = "/tmp/mc-lane-tls-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(tls_test::WriteSelfSignedCert(dir, "master"));
  MasterServerOptions opts;
  opts.tls = {.cert_file = dir + "/master.pem", .key_file = dir + "/master.key"};
  opts.grpc_handshake_timeout_ms = 300;
  opts.listen = "127.0.0.1:0";
  opts.http = "";
  server_ = std::make_unique<MasterServer>(opts);
  ASSERT_TRUE(server_->Start().ok());
  ASSERT_NE(server_->lane_port(), 0) << "the lane serves TLS beside gRPC's";
  const auto exists = [&] {
    return server_->metrics()
        .GetCounter("mc_master_rpc_requests_total", "", {{"rpc", "Exist"}})
        .Value();
  };
  {  // a plaintext request frame: no TLS ClientHello, the handshake fails
    const int fd = ConnectRaw(server_->lane_port());
    std::string frame;
    lane::AppendRequest(lane::kExist, 1, "", v1::ExistRequest(), &frame);
    Send(fd, frame);
    const std::string got = ReadToEnd(fd);
    EXPECT_NE(got.substr(0, 4), "MCG1") << "no greeting, no answer in plaintext";
    EXPECT_NE(got.substr(0, 4), "MCM1");
    close(fd);
  }
  {  // a silent plaintext client: closed after the handshake timeout
    const int fd = ConnectRaw(server_->lane_port());
    EXPECT_EQ(ReadToEnd(fd), "");
    close(fd);
  }
  EXPECT_TRUE(WaitFor([&] {
    return Counted("mc_master_lane_refused_total", {{"reason", "handshake"}}) == 2u;
  }));
  EXPECT_EQ(exists(), 0u);
  EXPECT_TRUE(WaitFor([&] { return server_->lane()->ConnectionsForTest() == 0; }));
  std::filesystem::remove_all(dir);
}

// Both ends keep a connection's buffers up to lane::kKeepBufferBytes and free a larger one.
TEST(LaneTrimBuffer, KeepsUpToTheBoundAndFreesALargerBuffer) {
  std::string kept;
  kept.reserve(lane::kKeepBufferBytes);
  const size_t capacity = kept.capacity();
  lane::TrimBuffer(kept);
  EXPECT_EQ(kept.capacity(), capacity);
  std::string grown(lane::kKeepBufferBytes + 1, 'x');
  lane::TrimBuffer(grown);
  EXPECT_TRUE(grown.empty());
  EXPECT_LT(grown.capacity(), lane::kKeepBufferBytes);
}

}  // namespace
}  // namespace mc::master
