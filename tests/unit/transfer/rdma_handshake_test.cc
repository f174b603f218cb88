// The rdma connection-setup codec (transfer/rdma/handshake.h) and the engine's choice of
// transport with a fake verbs device behind it.
#include "transfer/rdma/handshake.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "common/auth.h"
#include "common/capability.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/status.h"
#include "tests/fakes/fake_verbs.h"
#include "tests/fakes/in_process_rdma_connector.h"
#include "transfer/tcp/peer_exchange.h"
#include "transfer/tcp/server.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer::rdma {
namespace {

QpAddress Address(uint32_t qpn) {
  QpAddress a;
  for (int i = 0; i < 16; ++i) a.gid[i] = static_cast<uint8_t>(i * 3 + qpn);
  a.lid = 7;
  a.qpn = qpn;
  a.psn = qpn * 11;
  a.mtu = 4096;
  return a;
}

TEST(RdmaHandshake, RequestRoundTrips) {
  std::vector<QpAddress> qps = {Address(1), Address(2)};
  std::vector<uint32_t> retired = {9};
  auto decoded = DecodeConnectRequest(EncodeConnectRequest(qps, retired));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->qps.size(), 2u);
  EXPECT_EQ(decoded->qps[1].qpn, 2u);
  EXPECT_EQ(decoded->qps[1].psn, 22u);
  EXPECT_EQ(decoded->qps[1].gid, qps[1].gid);
  EXPECT_EQ(decoded->qps[0].lid, 7);
  EXPECT_EQ(decoded->retired, retired);
}

TEST(RdmaHandshake, ResponseRoundTrips) {
  PeerHandshake h;
  h.qps = {Address(5)};
  h.segments[3] = {0x7f0000000000, 1 << 20, 0x1234};
  h.segments[4] = {0x7f1000000000, 2 << 20, 0x5678};
  auto decoded = DecodeHandshake(EncodeHandshake(h));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->qps.size(), 1u);
  EXPECT_EQ(decoded->qps[0].mtu, 4096u);
  ASSERT_EQ(decoded->segments.size(), 2u);
  EXPECT_EQ(decoded->segments[4].rkey, 0x5678u);
  EXPECT_EQ(decoded->segments[3].length, 1u << 20);
}

TEST(RdmaHandshake, MalformedInputIsRejected) {
  std::string good = EncodeConnectRequest(std::vector<QpAddress>{Address(1)}, {});
  EXPECT_FALSE(DecodeConnectRequest(good.substr(0, good.size() - 1)).ok());
  EXPECT_FALSE(DecodeConnectRequest(good + "x").ok());
  EXPECT_FALSE(DecodeConnectRequest("").ok());
  std::string huge = good;
  huge[0] = static_cast<char>(0xff);  // qp count 255 > kMaxHandshakeQps
  EXPECT_FALSE(DecodeConnectRequest(huge).ok());

  PeerHandshake h;
  h.segments[1] = {UINT64_MAX - 10, 100, 1};  // wraps the address space
  EXPECT_FALSE(DecodeHandshake(EncodeHandshake(h)).ok());
  std::string resp = EncodeHandshake(PeerHandshake{});
  resp[4] = static_cast<char>(0xff);
  resp[5] = static_cast<char>(0xff);
  resp[6] = static_cast<char>(0xff);  // segment count far above the limit
  EXPECT_FALSE(DecodeHandshake(resp).ok());
  // Random bytes never crash the decoders.
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2000; ++i) {
    std::string junk(rng() % 200, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    (void)DecodeConnectRequest(junk);
    (void)DecodeHandshake(junk);
  }
}

// Two engines whose rdma transports share a fake verbs network.
class EngineOverFakeRdma : public ::testing::Test {
 protected:
  std::unique_ptr<TransferEngine> MakeEngine(const std::string& endpoint, SegmentTable& table,
                                             const std::string& transport, MetricsRegistry* metrics,
                                             bool in_process = true) {
    TransferEngineOptions o;
    o.local_endpoint = endpoint;
    o.transport = transport;
    o.metrics = metrics;
    o.tcp.receive_threads = 0;
    o.rdma.connector = in_process ? &connector_ : nullptr;  // null: over the tcp data plane
    o.rdma.device_factory = [this] {
      DeviceAttributes attr;
      attr.name = "fake0";
      attr.max_sge = 4;
      attr.max_qp_wr = 64;
      return std::make_unique<FakeVerbsDevice>(network_, attr);
    };
    return std::make_unique<TransferEngine>(o, table);
  }

  FakeVerbsNetwork network_;
  InProcessRdmaConnector connector_;
};

TEST_F(EngineOverFakeRdma, RdmaCarriesReadsAndWritesToPeersThatAnswer) {
  SegmentTable server_table, client_table;
  MetricsRegistry metrics;
  auto server = MakeEngine("127.0.0.1:3", server_table, "auto", nullptr);
  ASSERT_TRUE(server->NeedsLocalRegistration()) << "an rdma transport";
  std::vector<char> segment(1 << 16, 'q');
  ASSERT_TRUE(server->RegisterMemory(segment.data(), segment.size(), MemoryAccess::kRemote).ok());
  server_table.Add(42, segment.data(), segment.size());
  connector_.AddPeer("127.0.0.1:3", server.get());  // through its data-plane op
  auto client = MakeEngine("127.0.0.1:4", client_table, "auto", &metrics);

  std::vector<char> buf(8192, 'w');
  ASSERT_TRUE(client->RegisterMemory(buf.data(), buf.size(), MemoryAccess::kLocal).ok());
  std::vector<TransferRequest> reqs(2);
  reqs[0] = {Direction::kWrite, {{buf.data(), 4096}}, "127.0.0.1:3", SegmentRange{42, 100}};
  reqs[1] = {Direction::kRead, {{buf.data() + 4096, 4096}}, "127.0.0.1:3", SegmentRange{42, 0}};
  auto results = client->Submit(reqs);
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  ASSERT_TRUE(results[1].status.ok()) << results[1].status;
  EXPECT_EQ(std::string(segment.data() + 100, 4096), std::string(4096, 'w'));
  EXPECT_EQ(std::string(buf.data() + 4096, 100), std::string(100, 'q'));
  auto& rdma_read =
      metrics.GetCounter("mc_transfer_bytes_total", "", {{"transport", "rdma"}, {"op", "read"}});
  auto& rdma_write =
      metrics.GetCounter("mc_transfer_bytes_total", "", {{"transport", "rdma"}, {"op", "write"}});
  EXPECT_EQ(rdma_read.Value(), 4096u);
  EXPECT_EQ(rdma_write.Value(), 4096u);

  // Unregistered local memory, a peer without rdma and an SSD record go to tcp (which fails here:
  // nobody listens at these endpoints; what matters is which transport counted the error).
  std::vector<char> plain(4096);
  std::vector<TransferRequest> tcp_reqs(3);
  tcp_reqs[0] = {Direction::kRead, {{plain.data(), 4096}}, "127.0.0.1:3", SegmentRange{42, 0}};
  tcp_reqs[1] = {Direction::kRead, {{buf.data(), 4096}}, "127.0.0.1:1", SegmentRange{42, 0}};
  tcp_reqs[2] = {Direction::kRead, {{buf.data(), 4096}}, "127.0.0.1:3", DiskRecord{42, 0, 0}};
  auto tcp_results = client->Submit(tcp_reqs);
  for (const auto& r : tcp_results) EXPECT_FALSE(r.status.ok());
  auto& tcp_errors = metrics.GetCounter("mc_transfer_errors_total", "", {{"transport", "tcp"}});
  auto& rdma_errors = metrics.GetCounter("mc_transfer_errors_total", "", {{"transport", "rdma"}});
  EXPECT_EQ(tcp_errors.Value(), 3u);
  EXPECT_EQ(rdma_errors.Value(), 0u);
}

// The production setup path without a NIC: the client engine's rdma setup rides a real tcp
// data-plane connection (TcpPeerExchange) to the server's data server, which hands it to the
// server engine (EngineDataOps); the bytes then move over the fake verbs.
TEST_F(EngineOverFakeRdma, TheSetupRidesTheTcpDataPlane) {
  SegmentTable server_table, client_table;
  MetricsRegistry server_metrics, metrics;
  tcp::TcpDataServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.metrics = &server_metrics;
  tcp::TcpDataServer data_server(so, server_table);
  EngineDataOps engine_ops;
  ASSERT_TRUE(engine_ops.RegisterWith(data_server).ok());
  ASSERT_TRUE(data_server.Start().ok());
  auto server = MakeEngine(data_server.endpoint(), server_table, "auto", nullptr, false);
  std::vector<char> segment(1 << 16, 'q');
  ASSERT_TRUE(server->RegisterMemory(segment.data(), segment.size(), MemoryAccess::kRemote).ok());
  server_table.Add(42, segment.data(), segment.size());
  engine_ops.Attach(server.get());

  auto client = MakeEngine("127.0.0.1:4", client_table, "rdma", &metrics, false);
  std::vector<char> buf(4096, 'w');
  ASSERT_TRUE(client->RegisterMemory(buf.data(), buf.size(), MemoryAccess::kLocal).ok());
  std::vector<TransferRequest> reqs = {
      {Direction::kRead, {{buf.data(), 4096}}, data_server.endpoint(), SegmentRange{42, 0}}};
  auto results = client->Submit(reqs);
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(std::string(buf.data(), 4096), std::string(4096, 'q'));
  EXPECT_EQ(
      metrics.GetCounter("mc_transfer_bytes_total", "", {{"transport", "rdma"}, {"op", "read"}})
          .Value(),
      4096u);
  EXPECT_EQ(connector_.connects(), 0) << "not the in-process connector";
  data_server.Stop();
  engine_ops.Attach(nullptr);
}

TEST_F(EngineOverFakeRdma, TransportFlagForcesEither) {
  SegmentTable table;
  auto tcp_only = MakeEngine("127.0.0.1:4", table, "tcp", nullptr);
  EXPECT_FALSE(tcp_only->NeedsLocalRegistration()) << "no rdma transport";
  EXPECT_TRUE(tcp_only->status().ok());

  TransferEngineOptions o;
  o.transport = "rdma";
  o.rdma.device_factory = [] { return std::unique_ptr<VerbsDevice>(); };  // no device
  TransferEngine forced(o, table);
  EXPECT_FALSE(forced.NeedsLocalRegistration()) << "no rdma transport";
  EXPECT_FALSE(forced.status().ok());
}

}  // namespace
}  // namespace mc::transfer::rdma

namespace mc::transfer::rdma {
namespace {

// With cluster keys, the rdma setup (which hands out rkeys) is served only on a connection that
// passed the AUTH handshake: a connector without the secret is closed before kRdmaConnect is
// read; one with it reaches the handler (which answers UNAVAILABLE here: no rdma device).
TEST(RdmaHandshake, SetupNeedsTheAuthenticatedConnection) {
  auto keys = *auth::ClusterKeys::FromSecrets({std::string(40, 's')});
  auth::CapabilityVerifier verifier({}, RealClock::Get());
  SegmentTable table;
  MetricsRegistry metrics;
  tcp::TcpDataServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.metrics = &metrics;
  o.cluster_keys = keys;
  o.capabilities = &verifier;
  tcp::TcpDataServer server(o, table);
  ASSERT_TRUE(server
                  .RegisterOpHandler(DataOp::kRdmaConnect,
                                     [](const DataRequest& r, RequestStream& s) {
                                       return RefuseDataOp(r, s);  // no rdma here
                                     })
                  .ok());
  ASSERT_TRUE(server.Start().ok());
  tcp::TcpPeerExchange anonymous_exchange(2000);
  DataPlaneRdmaConnector anonymous(anonymous_exchange);
  EXPECT_FALSE(anonymous.Connect(server.endpoint(), {}, {}).ok());
  EXPECT_EQ(server.auth_failures(tcp::HandshakeFailure::kNoHandshake), 1u);
  tcp::TcpPeerExchange member_exchange(2000, keys);
  DataPlaneRdmaConnector member(member_exchange);
  auto answer = member.Connect(server.endpoint(), {}, {});
  EXPECT_EQ(ToCode(answer.status()), Code::kUnavailable) << answer.status();
  EXPECT_EQ(server.auth_failures(tcp::HandshakeFailure::kNoHandshake), 1u);
}

}  // namespace
}  // namespace mc::transfer::rdma
