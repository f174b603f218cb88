// The authenticated data plane (docs/security.md): the connection handshake and the capability
// check on every READ/WRITE/READ_DISK frame. One test per attack: each must be refused, counted,
// and leave the segment's bytes untouched; the honest path must keep working.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/capability.h"
#include "common/metrics.h"
#include "common/status.h"
#include "tests/fakes/await.h"
#include "tests/unit/transfer/tcp_server_fixture.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/handshake.h"
#include "transfer/tcp/server.h"
#include "transfer/tcp/socket_util.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer {
namespace {

using auth::CapabilityBytes;
using auth::Right;
using tcp::FrameHeader;
using tcp::FrameOp;
using tcp::HandshakeFailure;

using testing::kMasterNow;
using testing::kSegment;

constexpr uint64_t kSegmentBytes = 4 << 20;

std::string Secret(char c) { return std::string(40, c); }

class AuthTest : public testing::TcpServerFixture {
 protected:
  AuthTest() : TcpServerFixture(kSegmentBytes) {}
  void StartServer(int64_t handshake_timeout_ms = 5000) {
    tcp::TcpDataServerOptions o = ServerOptions();
    o.handshake_timeout_ms = handshake_timeout_ms;
    server_ = std::make_unique<tcp::TcpDataServer>(o, table_);
    ASSERT_TRUE(server_
                    ->RegisterOpHandler(DataOp::kReadDisk,
                                        [this](const DataRequest&, RequestStream& s) {
                                          ++disk_reads_;
                                          return s.Respond(Code::kNotFound);
                                        })
                    .ok());
    ASSERT_TRUE(server_->Start().ok());
    port_ = std::stoi(server_->endpoint().substr(server_->endpoint().rfind(':') + 1));
  }
  std::unique_ptr<TransferEngine> Engine(auth::ClusterKeysPtr keys,
                                         uint64_t frame_bytes = 4 << 20) {
    return std::make_unique<TransferEngine>(EngineOptions(std::move(keys), frame_bytes),
                                            local_table_);
  }
  TransferResult Submit(TransferEngine& engine, Direction op, std::vector<char>& buf,
                        uint64_t offset, std::string cap, uint64_t segment = kSegment) {
    TransferRequest r{
        op, {{buf.data(), buf.size()}}, server_->endpoint(), SegmentRange{segment, offset}};
    r.capability = std::move(cap);
    return engine.Submit({&r, 1})[0];
  }
  // A raw blocking socket to the server.
  int Raw() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    return fd;
  }
  static void SendFrame(int fd, FrameHeader h, const std::string& cap, const std::string& payload) {
    std::string bytes(tcp::kFrameHeaderSize, '\0');
    tcp::EncodeFrameHeader(h, reinterpret_cast<uint8_t*>(bytes.data()));
    bytes += cap;
    bytes += payload;
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // True when the server closes `fd` within `ms` (any bytes before EOF are read and dropped).
  static bool ClosedWithin(int fd, int ms, size_t* got = nullptr) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    char buf[4096];
    size_t total = 0;
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n <= 0) {
        if (got != nullptr) *got = total;
        return true;
      }
      total += static_cast<size_t>(n);
    }
    if (got != nullptr) *got = total;
    return false;
  }
  uint64_t Denied(auth::Denial d) const { return server_->capability_denials(d); }
  uint64_t AuthFailed(HandshakeFailure f) const { return server_->auth_failures(f); }

  int port_ = 0;
  int disk_reads_ = 0;
};

TEST_F(AuthTest, GrantedReadAndWriteWork) {
  StartServer();
  auto engine = Engine(keys_, /*frame_bytes=*/64 << 10);  // a 1 MiB object is 16 frames
  std::vector<char> out(1 << 20, 'w');
  EXPECT_TRUE(
      Submit(*engine, Direction::kWrite, out, 4096, Cap(Right::kWrite, kSegment, 4096, out.size()))
          .status.ok());
  std::vector<char> in(1 << 20, 0);
  TransferResult r =
      Submit(*engine, Direction::kRead, in, 4096, Cap(Right::kRead, kSegment, 4096, in.size()));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(in, out);
  for (int d = 1; d < static_cast<int>(auth::Denial::kCount); ++d) {
    EXPECT_EQ(Denied(static_cast<auth::Denial>(d)), 0u);
  }
}

// Attack 1: one raw READ frame for the whole segment, no handshake.
TEST_F(AuthTest, ReadFrameWithoutHandshakeClosesTheConnection) {
  StartServer();
  const int fd = Raw();
  SendFrame(fd, tcp::MakeRequest(FrameOp::kRead, 1, kSegment, 0, kSegmentBytes),
            std::string(tcp::kCapabilityBlockSize, '\0'), "");
  size_t got = 0;
  EXPECT_TRUE(ClosedWithin(fd, 2000, &got));
  EXPECT_EQ(got, 0u);  // not one byte of the segment
  ::close(fd);
  EXPECT_EQ(AuthFailed(HandshakeFailure::kNoHandshake), 1u);
}

TEST_F(AuthTest, RdmaConnectBeforeTheHandshakeClosesTheConnection) {
  StartServer();
  const int fd = Raw();
  SendFrame(fd, tcp::MakeRequest(FrameOp::kRdmaConnect, 1, 0, 0, 8), "", std::string(8, '\0'));
  size_t got = 0;
  EXPECT_TRUE(ClosedWithin(fd, 2000, &got));
  EXPECT_EQ(got, 0u);
  ::close(fd);
  EXPECT_EQ(AuthFailed(HandshakeFailure::kNoHandshake), 1u);
}

TEST_F(AuthTest, AnotherClusterSecretFailsTheHandshake) {
  StartServer();
  auto engine = Engine(*auth::ClusterKeys::FromSecrets({Secret('x')}));
  std::vector<char> in(4096);
  TransferResult r = Submit(*engine, Direction::kRead, in, 0, Cap(Right::kRead, kSegment, 0, 4096));
  EXPECT_FALSE(r.status.ok());
  // The requester sees the server's proof fail and leaves; or proves and is refused.
  const int fd = Raw();
  const std::string nc(32, 'n');
  SendFrame(fd, tcp::MakeRequest(FrameOp::kAuth, 1, 0, 0, 32), "", nc);
  uint8_t reply[tcp::kFrameHeaderSize + 64];
  ASSERT_TRUE(tcp::RecvAllBy(fd, reply, sizeof(reply), RealClock::Get().NowMs() + 2000).ok());
  SendFrame(fd, tcp::MakeRequest(FrameOp::kAuth, 2, 0, 1, 32), "", std::string(32, 'f'));
  uint8_t verdict[tcp::kFrameHeaderSize];
  ASSERT_TRUE(tcp::RecvAllBy(fd, verdict, sizeof(verdict), RealClock::Get().NowMs() + 2000).ok());
  auto h = tcp::DecodeFrameHeader(verdict, sizeof(verdict));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->code, static_cast<uint32_t>(Code::kPermissionDenied));
  EXPECT_TRUE(ClosedWithin(fd, 2000));
  ::close(fd);
  EXPECT_EQ(AuthFailed(HandshakeFailure::kBadMac), 1u);
}

TEST_F(AuthTest, SlowHandshakeIsCutOffAtItsDeadline) {
  StartServer(/*handshake_timeout_ms=*/300);
  const int fd = Raw();
  // One byte now and then: each recv is quick, the whole never finishes.
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  for (int i = 0; i < 20 && !closed; ++i) {
    (void)::send(fd, "M", 1, MSG_NOSIGNAL);
    closed = ClosedWithin(fd, 100);
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  ::close(fd);
  EXPECT_EQ(AuthFailed(HandshakeFailure::kTimeout), 1u);
}

// Attack 2: a member forges a capability (its own key, or a widened one).
TEST_F(AuthTest, ForgedCapabilityIsRefusedAndTheConnectionStaysUsable) {
  StartServer();
  auto engine = Engine(keys_);
  std::vector<char> in(kSegmentBytes);
  TransferResult r = Submit(
      *engine, Direction::kRead, in, 0,
      Cap(Right::kRead, kSegment, 0, kSegmentBytes, kMasterNow + 1000, std::string(32, 'f')));
  EXPECT_EQ(ToCode(r.status), Code::kPermissionDenied) << r.status;
  std::string widened = Cap(Right::kRead, kSegment, 0, 4096);
  widened[24] = 0x7f;
  std::vector<char> small(4096 * 2);
  EXPECT_EQ(ToCode(Submit(*engine, Direction::kRead, small, 0, widened).status),
            Code::kPermissionDenied);
  EXPECT_EQ(Denied(auth::Denial::kBadMac), 2u);
  std::vector<char> ok(4096);
  EXPECT_TRUE(
      Submit(*engine, Direction::kRead, ok, 0, Cap(Right::kRead, kSegment, 0, 4096)).status.ok());
}

TEST_F(AuthTest, FrameWithoutCapabilityIsRefused) {
  StartServer();
  auto engine = Engine(keys_);
  std::vector<char> in(4096);
  EXPECT_EQ(ToCode(Submit(*engine, Direction::kRead, in, 0, "").status), Code::kPermissionDenied);
  EXPECT_EQ(Denied(auth::Denial::kMalformed), 1u);
}

// Attack 3: a valid capability for key A used for key B's range, or on another segment.
TEST_F(AuthTest, CapabilityForOneRangeDoesNotReachAnother) {
  table_.Add(6, memory_.data(), memory_.size());  // a second segment of the same owner
  StartServer();
  auto engine = Engine(keys_);
  const std::string key_a = Cap(Right::kRead, kSegment, 0, 4096);
  std::vector<char> in(4096);
  EXPECT_EQ(ToCode(Submit(*engine, Direction::kRead, in, 8192, key_a).status),
            Code::kPermissionDenied);
  EXPECT_EQ(ToCode(Submit(*engine, Direction::kRead, in, 0, key_a, /*segment=*/6).status),
            Code::kPermissionDenied);
  std::vector<char> more(8192);
  EXPECT_EQ(ToCode(Submit(*engine, Direction::kRead, more, 0, key_a).status),
            Code::kPermissionDenied);
  EXPECT_EQ(Denied(auth::Denial::kOutOfRange), 3u);
}

// Attack 4: a capability of a removed key (its lease ended) replayed later.
TEST_F(AuthTest, ExpiredCapabilityIsRefused) {
  StartServer();
  auto engine = Engine(keys_);
  const std::string cap = Cap(Right::kRead, kSegment, 0, 4096, kMasterNow + 100);
  std::vector<char> in(4096);
  EXPECT_TRUE(Submit(*engine, Direction::kRead, in, 0, cap).status.ok());
  clock_.AdvanceMs(151);  // past expiry + the 50 ms allowance
  EXPECT_EQ(ToCode(Submit(*engine, Direction::kRead, in, 0, cap).status), Code::kPermissionDenied);
  EXPECT_EQ(Denied(auth::Denial::kExpired), 1u);
}

// Attack 5: WRITE outside the granted range, with a read grant, or with none.
TEST_F(AuthTest, WriteOutsideItsGrantTouchesNoByte) {
  StartServer();
  auto engine = Engine(keys_);
  std::vector<char> out(8192, 'X');
  EXPECT_EQ(
      ToCode(
          Submit(*engine, Direction::kWrite, out, 0, Cap(Right::kWrite, kSegment, 0, 4096)).status),
      Code::kPermissionDenied);
  EXPECT_EQ(
      ToCode(
          Submit(*engine, Direction::kWrite, out, 0, Cap(Right::kRead, kSegment, 0, 8192)).status),
      Code::kPermissionDenied);
  EXPECT_EQ(ToCode(Submit(*engine, Direction::kWrite, out, 0, "").status), Code::kPermissionDenied);
  EXPECT_TRUE(SegmentUntouched());
  EXPECT_EQ(Denied(auth::Denial::kOutOfRange), 1u);
  EXPECT_EQ(Denied(auth::Denial::kWrongOp), 1u);
  EXPECT_EQ(Denied(auth::Denial::kMalformed), 1u);
}

// Attack 6: a half-sent WRITE without a grant lands nowhere.
TEST_F(AuthTest, HalfSentWriteWithoutGrantLandsNowhere) {
  StartServer();
  const int fd = Raw();
  ASSERT_TRUE(tcp::ClientHandshake(fd, *keys_, RealClock::Get().NowMs() + 2000).ok());
  SendFrame(fd, tcp::MakeRequest(FrameOp::kWrite, 1, kSegment, 0, 1 << 20),
            Cap(Right::kWrite, kSegment, 1 << 20, 1 << 20), std::string(64 << 10, 'H'));
  // The server judged the frame (its grant names another range), and then saw the connection
  // go: nothing of it can land after this.
  EXPECT_TRUE(WaitFor([&] { return Denied(auth::Denial::kOutOfRange) == 1; }));
  ::close(fd);
  EXPECT_TRUE(WaitFor([&] { return server_->connection_count() == 0; }));
  EXPECT_TRUE(SegmentUntouched());
}

// Attack 7: READ_DISK of a persisted record with a locator learned elsewhere.
TEST_F(AuthTest, ReadDiskNeedsItsOwnCapability) {
  StartServer();
  auto engine = Engine(keys_);
  std::vector<char> in(4096);
  TransferRequest r{
      Direction::kRead, {{in.data(), in.size()}}, server_->endpoint(), DiskRecord{9, 77, 0xabc}};
  EXPECT_EQ(ToCode(engine->Submit({&r, 1})[0].status), Code::kPermissionDenied);
  r.capability = Cap(Right::kRead, 9, 77, 4096);  // a memory read grant is not a disk grant
  EXPECT_EQ(ToCode(engine->Submit({&r, 1})[0].status), Code::kPermissionDenied);
  EXPECT_EQ(disk_reads_, 0);
  const CapabilityBytes b = auth::MintCapability(
      auth::OwnerKey(owner_key_), {Right::kReadDisk, 0xabc, 9, 77, 4096, 9, kMasterNow + 1000});
  r.capability.assign(reinterpret_cast<const char*>(b.data()), b.size());
  EXPECT_EQ(ToCode(engine->Submit({&r, 1})[0].status), Code::kNotFound);  // reached the tier
  EXPECT_EQ(disk_reads_, 1);
}

TEST_F(AuthTest, GarbageAfterTheHandshakeClosesTheConnection) {
  StartServer();
  const int fd = Raw();
  ASSERT_TRUE(tcp::ClientHandshake(fd, *keys_, RealClock::Get().NowMs() + 2000).ok());
  const std::string junk(100, '\x5a');
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), 100);
  EXPECT_TRUE(ClosedWithin(fd, 2000));
  ::close(fd);
  EXPECT_EQ(server_->malformed_frames(), 1u);
}

TEST_F(AuthTest, WithoutKeysThereIsNoHandshakeNorCheck) {
  tcp::TcpDataServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.metrics = &metrics_;
  server_ = std::make_unique<tcp::TcpDataServer>(o, table_);
  ASSERT_TRUE(server_->Start().ok());
  auto engine = Engine(nullptr);
  std::vector<char> in(4096);
  EXPECT_TRUE(Submit(*engine, Direction::kRead, in, 0, "").status.ok());
}

TEST_F(AuthTest, KeysWithoutAVerifierDoNotStart) {
  tcp::TcpDataServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.cluster_keys = keys_;
  tcp::TcpDataServer server(o, table_);
  EXPECT_FALSE(server.Start().ok());
}

}  // namespace
}  // namespace mc::transfer
