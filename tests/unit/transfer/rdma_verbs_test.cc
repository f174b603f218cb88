// The rdma transport over real verbs: two endpoints in one process, each with its own device
// context (so two sets of queue pairs talking through the device, e.g. Soft-RoCE rxe0 in the
// VM of tools/run-in-rxe-vm.sh), moving bytes both ways, verified byte for byte. Skipped when no
// verbs device with an active port exists (MC_RDMA_DEVICE, MC_RDMA_GID_INDEX choose one), unless
// MC_REQUIRE_RDMA=1 (then it fails).
// ctest label `rdma`: deploy/test.sh runs it inside the VM.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "common/auth.h"
#include "common/capability.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/status.h"
#include "tests/fakes/in_process_rdma_connector.h"
#include "transfer/rdma/handshake.h"
#include "transfer/rdma/rdma_transport.h"
#include "transfer/rdma/verbs.h"
#include "transfer/tcp/server.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer::rdma {
namespace {

class NoConnector final : public RdmaConnector {
 public:
  absl::StatusOr<PeerHandshake> Connect(const std::string&, std::span<const QpAddress>,
                                        std::span<const uint32_t>) override {
    return McError(Code::kUnavailable, "no peers");
  }
};

std::string Env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

absl::StatusOr<std::unique_ptr<VerbsDevice>> Open() {
  return OpenVerbsDevice(Env("MC_RDMA_DEVICE", ""), 1,
                         std::atoi(Env("MC_RDMA_GID_INDEX", "1").c_str()));
}

TEST(RdmaVerbs, TwoEndpointsMoveBytesBothWays) {
  auto server_dev = Open();
  if (!server_dev.ok()) {
    ASSERT_NE(Env("MC_REQUIRE_RDMA", "0"), "1")
        << "no usable verbs device: " << server_dev.status();
    GTEST_SKIP() << "no usable verbs device: " << server_dev.status();
  }
  auto client_dev = Open();
  ASSERT_TRUE(client_dev.ok()) << client_dev.status();
  std::printf("device %s max_sge %u max_qp_wr %u mtu %u\n",
              (*server_dev)->attributes().name.c_str(), (*server_dev)->attributes().max_sge,
              (*server_dev)->attributes().max_qp_wr, (*server_dev)->attributes().active_mtu);

  NoConnector none;
  InProcessRdmaConnector connector;
  RdmaTransportOptions options;
  options.max_wr_bytes = 64 << 10;
  options.send_queue_depth = 16;
  RdmaTransport server(options, *std::move(server_dev), none);
  connector.AddPeer("server:1", &server);
  RdmaTransport client(options, *std::move(client_dev), connector);

  constexpr uint64_t kBytes = 4 << 20;
  std::vector<char> segment(kBytes), local(kBytes), back(kBytes);
  std::mt19937_64 rng(17);
  for (auto& c : segment) c = static_cast<char>(rng());
  for (auto& c : local) c = static_cast<char>(rng());
  ASSERT_TRUE(server.ExportSegment(3, segment.data(), kBytes).ok());
  ASSERT_TRUE(client.RegisterMemory(local.data(), kBytes, MemoryAccess::kLocal).ok());
  ASSERT_TRUE(client.RegisterMemory(back.data(), kBytes, MemoryAccess::kLocal).ok());

  // WRITE the first half of `local` (in 13 uneven pieces) to the segment's second half.
  std::vector<LocalBuffer> pieces;
  uint64_t at = 0;
  for (int i = 0; at < kBytes / 2; ++i) {
    const uint64_t len = std::min<uint64_t>(kBytes / 2 - at, 40000 + i * 7919);
    pieces.push_back({local.data() + at, len});
    at += len;
  }
  TransferRequest write{Direction::kWrite, pieces, "server:1", SegmentRange{3, kBytes / 2}};
  // READ the segment's first half into `back`, with a checksum.
  TransferRequest read{
      Direction::kRead, {{back.data(), kBytes / 2}}, "server:1", SegmentRange{3, 0}};
  read.proof = Proof::kDeliveredBytes;
  std::vector<const TransferRequest*> batch = {&write, &read};
  std::vector<TransferResult> results(2);
  client.Submit(batch, results, 0);
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  ASSERT_TRUE(results[1].status.ok()) << results[1].status;
  EXPECT_EQ(results[0].bytes, kBytes / 2);
  EXPECT_EQ(results[1].bytes, kBytes / 2);
  EXPECT_EQ(0, std::memcmp(segment.data() + kBytes / 2, local.data(), kBytes / 2));
  EXPECT_EQ(0, std::memcmp(back.data(), segment.data(), kBytes / 2));
  ASSERT_TRUE(results[1].checksum.has_value());
  EXPECT_EQ(*results[1].checksum, Checksum(segment.data(), kBytes / 2));

  // Many small requests in one batch, spread over the queue pairs.
  std::vector<TransferRequest> many;
  for (int i = 0; i < 64; ++i) {
    many.push_back({Direction::kRead,
                    {{back.data() + i * 4096, 4096}},
                    "server:1",
                    SegmentRange{3, static_cast<uint64_t>(i) * 8192}});
  }
  std::vector<const TransferRequest*> ptrs;
  for (auto& r : many) ptrs.push_back(&r);
  std::vector<TransferResult> many_results(many.size());
  client.Submit(ptrs, many_results, 0);
  for (size_t i = 0; i < many.size(); ++i) {
    ASSERT_TRUE(many_results[i].status.ok()) << i << ": " << many_results[i].status;
    ASSERT_EQ(0, std::memcmp(back.data() + i * 4096, segment.data() + i * 8192, 4096)) << i;
  }

  // An rkey-violating range is refused by the transport before any WR; a stale rkey (segment
  // unexported) fails on the wire and the queue pair is re-established for the next request.
  TransferRequest outside{
      Direction::kRead, {{back.data(), 4096}}, "server:1", SegmentRange{3, kBytes - 100}};
  std::vector<const TransferRequest*> one = {&outside};
  std::vector<TransferResult> one_result(1);
  client.Submit(one, one_result, 0);
  EXPECT_EQ(ToCode(one_result[0].status), Code::kInvalidArgument) << one_result[0].status;

  std::vector<char> other(1 << 20, 'z');
  ASSERT_TRUE(server.ExportSegment(4, other.data(), other.size()).ok());
  TransferRequest from4{Direction::kRead, {{back.data(), 4096}}, "server:1", SegmentRange{4, 0}};
  one = {&from4};
  client.Submit(one, one_result, 0);  // learns segment 4's rkey
  ASSERT_TRUE(one_result[0].status.ok()) << one_result[0].status;
  server.UnexportSegment(4);  // its rkey is now invalid
  std::memset(back.data(), 0, 4096);
  client.Submit(one, one_result, 0);
  EXPECT_FALSE(one_result[0].status.ok()) << "read through a deregistered rkey";
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(back[i], 0);
  one = {&read};
  for (int i = 0; i < 4; ++i) {  // every queue pair works again
    client.Submit(one, one_result, 0);
    ASSERT_TRUE(one_result[0].status.ok()) << one_result[0].status;
  }
}

}  // namespace
}  // namespace mc::transfer::rdma

namespace mc::transfer::rdma {
namespace {

// The daemons' wiring over real verbs: engine B serves a segment and answers kRdmaConnect on
// its tcp data-plane server; engine A (transport auto) connects through that frame, moves bytes
// over rdma, and the metrics say rdma carried them. With cluster keys, as the daemons run: the
// setup rides an authenticated connection (docs/security-data.md).
TEST(RdmaVerbs, EnginesConnectOverTheDataPlaneAndUseRdma) {
  if (!Open().ok()) {
    ASSERT_NE(Env("MC_REQUIRE_RDMA", "0"), "1") << "no usable verbs device";
    GTEST_SKIP() << "no usable verbs device";
  }
  TransferEngineOptions o;
  o.rdma.device = Env("MC_RDMA_DEVICE", "");
  o.rdma.gid_index = std::atoi(Env("MC_RDMA_GID_INDEX", "1").c_str());
  o.tcp.receive_threads = 0;
  auto keys = *auth::ClusterKeys::FromSecrets({std::string(40, 'r')});
  o.tcp.cluster_keys = keys;
  auth::CapabilityVerifier verifier({}, RealClock::Get());
  const std::string owner_key(32, 'o');  // as the master would have given B
  verifier.SetKey(owner_key);
  verifier.SetMasterClock(RealClock::Get().NowMs(), RealClock::Get().NowMs());

  SegmentTable b_table;
  tcp::TcpDataServerOptions server_opts;
  server_opts.listen_address = "127.0.0.1:0";
  server_opts.cluster_keys = keys;
  server_opts.capabilities = &verifier;
  tcp::TcpDataServer server(server_opts, b_table);
  EngineDataOps engine_ops;  // answers the rdma setup once B is attached
  ASSERT_TRUE(engine_ops.RegisterWith(server).ok());
  ASSERT_TRUE(server.Start().ok());
  TransferEngineOptions bo = o;
  bo.local_endpoint = server.endpoint();
  TransferEngine b(bo, b_table);
  ASSERT_TRUE(b.NeedsLocalRegistration()) << "an rdma transport";
  std::vector<char> segment(2 << 20);
  std::mt19937_64 rng(3);
  for (auto& c : segment) c = static_cast<char>(rng());
  ASSERT_TRUE(b.RegisterMemory(segment.data(), segment.size(), MemoryAccess::kRemote).ok());
  b_table.Add(11, segment.data(), segment.size());
  engine_ops.Attach(&b);

  MetricsRegistry metrics;
  SegmentTable a_table;
  TransferEngineOptions ao = o;
  ao.local_endpoint = "127.0.0.1:1";
  ao.metrics = &metrics;
  TransferEngine a(ao, a_table);
  std::vector<char> buf(1 << 20);
  ASSERT_TRUE(a.RegisterMemory(buf.data(), buf.size(), MemoryAccess::kLocal).ok());
  std::vector<TransferRequest> reqs(1);
  reqs[0] = {Direction::kRead, {{buf.data(), 1 << 20}}, server.endpoint(), SegmentRange{11, 4096}};
  reqs[0].proof = Proof::kDeliveredBytes;
  auto r = a.Submit(reqs);
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(0, std::memcmp(buf.data(), segment.data() + 4096, 1 << 20));
  EXPECT_EQ(*r[0].checksum, Checksum(segment.data() + 4096, 1 << 20));
  for (auto& c : buf) c = static_cast<char>(rng());
  reqs[0] = {
      Direction::kWrite, {{buf.data(), 1 << 20}}, server.endpoint(), SegmentRange{11, 1 << 20}};
  r = a.Submit(reqs);
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(0, std::memcmp(buf.data(), segment.data() + (1 << 20), 1 << 20));
  EXPECT_EQ(
      metrics.GetCounter("mc_transfer_bytes_total", "", {{"transport", "rdma"}, {"op", "read"}})
          .Value(),
      1u << 20);
  EXPECT_EQ(
      metrics.GetCounter("mc_transfer_bytes_total", "", {{"transport", "rdma"}, {"op", "write"}})
          .Value(),
      1u << 20);
  EXPECT_EQ(
      metrics.GetCounter("mc_transfer_bytes_total", "", {{"transport", "tcp"}, {"op", "read"}})
          .Value(),
      0u);
  // The same segment over tcp (a buffer not registered with rdma) reads the same bytes, with the
  // capability tcp frames need.
  std::vector<char> plain(4096);
  reqs[0] = {
      Direction::kRead, {{plain.data(), 4096}}, server.endpoint(), SegmentRange{11, 1 << 20}};
  const auth::CapabilityBytes cap = auth::MintCapability(
      auth::OwnerKey(owner_key),
      {auth::Right::kRead, 0, 11, 1 << 20, 4096, 1, RealClock::Get().NowMs() + 60'000});
  reqs[0].capability.assign(reinterpret_cast<const char*>(cap.data()), cap.size());
  r = a.Submit(reqs);
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(0, std::memcmp(plain.data(), buf.data(), 4096));
  EXPECT_EQ(
      metrics.GetCounter("mc_transfer_bytes_total", "", {{"transport", "tcp"}, {"op", "read"}})
          .Value(),
      4096u);
  server.Stop();
}

// GPUDirect RDMA's registration on a real device: a dma-buf MR of an fd that is not a dma-buf
// (a memfd; no GPU here) must fail cleanly through ibv_reg_dmabuf_mr, leave no region behind,
// and the transport must refuse requests on that range (the cuda transport then stages).
TEST(RdmaVerbs, ADmaBufRegistrationTheDeviceRefusesLeavesNothingBehind) {
  auto dev = Open();
  if (!dev.ok()) {
    ASSERT_NE(Env("MC_REQUIRE_RDMA", "0"), "1") << "no usable verbs device: " << dev.status();
    GTEST_SKIP() << "no usable verbs device: " << dev.status();
  }
  const int fd = memfd_create("not-a-dmabuf", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  absl::StatusOr<MemoryRegion> mr =
      (*dev)->RegisterDmaBuf(fd, 0, 1 << 16, 0x7f0000000000, MemoryAccess::kLocal);
  std::printf("ibv_reg_dmabuf_mr of a memfd on %s: %s\n", (*dev)->attributes().name.c_str(),
              mr.ok() ? "registered" : mr.status().ToString().c_str());
  ASSERT_FALSE(mr.ok()) << "a memfd is not a dma-buf";
  EXPECT_NE(mr.status().message().find("ibv_reg_dmabuf_mr"), std::string::npos);

  NoConnector none;
  RdmaTransport transport(RdmaTransportOptions{}, *std::move(dev), none);
  EXPECT_FALSE(transport.RegisterDeviceMemory(0x7f0000000000, 1 << 16, fd).ok());
  EXPECT_EQ(transport.local_regions_for_test(), 0u);
  TransferRequest r;
  r.direction = Direction::kRead;
  r.local = {LocalBuffer{reinterpret_cast<char*>(0x7f0000000000), 4096}};
  r.endpoint = "peer:1";
  EXPECT_FALSE(transport.LocalBuffersRegistered(r));
  close(fd);
}

}  // namespace
}  // namespace mc::transfer::rdma
