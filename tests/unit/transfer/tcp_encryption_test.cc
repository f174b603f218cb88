// The encrypted data plane (transfer/tcp/sealed_records.h, docs/security.md "The data plane"):
// the record layer alone, then a real server and transfer engine with a man in the middle (a
// relay between them that parses records and flips, drops, replays, reorders or truncates them).
// Every attack must fail closed: the transfer fails, the connection closes, nothing is
// acknowledged; the honest path must keep working for large and odd sizes, both directions.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/capability.h"
#include "common/checksum.h"
#include "common/metrics.h"
#include "common/status.h"
#include "tests/fakes/await.h"
#include "tests/unit/transfer/tcp_server_fixture.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/handshake.h"
#include "transfer/tcp/sealed_records.h"
#include "transfer/tcp/server.h"
#include "transfer/tcp/socket_util.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer {
namespace {

using auth::Right;
using tcp::DirectionKey;
using tcp::HandshakeFailure;
using tcp::kMaxRecordBytes;
using tcp::kRecordOverhead;
using tcp::RecordOpener;
using tcp::RecordSealer;

// ---- The record layer --------------------------------------------------------------------

DirectionKey Key(char c) {
  auth::Mac base{};
  base.fill(static_cast<uint8_t>(c));
  return tcp::DeriveSessionKeys(base).to_server;
}

std::string SealOne(RecordSealer& sealer, const std::string& plain) {
  std::string out(plain.size() + kRecordOverhead, '\0');
  const iovec v{const_cast<char*>(plain.data()), plain.size()};
  EXPECT_TRUE(sealer.Seal(&v, 1, plain.size(), reinterpret_cast<uint8_t*>(out.data())).ok());
  return out;
}

// Opens `record` (prefix || body || tag) in place; the plaintext or an error.
absl::StatusOr<std::string> OpenOne(RecordOpener& opener, std::string record) {
  size_t n = 0;
  const auto* bytes = reinterpret_cast<const uint8_t*>(record.data());
  if (record.size() < kRecordOverhead) return McError(Code::kTransferFailed, "short");
  absl::Status s = RecordOpener::BodyLength(bytes, kMaxRecordBytes, &n);
  if (!s.ok()) return s;
  if (record.size() != n + kRecordOverhead) return McError(Code::kTransferFailed, "size");
  const iovec v{record.data() + tcp::kRecordPrefixSize, n};
  s = opener.Open(bytes, &v, 1, bytes + tcp::kRecordPrefixSize + n);
  if (!s.ok()) return s;
  return record.substr(tcp::kRecordPrefixSize, n);
}

std::string Pattern(size_t n, uint32_t seed = 1) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u + seed) >> 13);
  return s;
}

TEST(SealedRecords, RoundTripsSizesAndScatteredInput) {
  RecordSealer sealer(Key('a'));
  RecordOpener opener(Key('a'));
  for (size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{48}, size_t{4097}, size_t{65537},
                   kMaxRecordBytes}) {
    const std::string plain = Pattern(n, static_cast<uint32_t>(n));
    // Scattered over three iovecs of uneven sizes.
    const size_t a = n / 3, b = n / 2;
    iovec iov[3] = {{const_cast<char*>(plain.data()), a},
                    {const_cast<char*>(plain.data()) + a, b - a},
                    {const_cast<char*>(plain.data()) + b, n - b}};
    std::string record(n + kRecordOverhead, '\0');
    ASSERT_TRUE(sealer.Seal(iov, 3, n, reinterpret_cast<uint8_t*>(record.data())).ok());
    if (n >= 16) {
      EXPECT_EQ(record.find(plain.substr(0, 16)), std::string::npos);
    }
    absl::StatusOr<std::string> opened = OpenOne(opener, record);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(*opened, plain);
  }
  EXPECT_EQ(sealer.counter(), 7u);
  EXPECT_EQ(opener.counter(), 7u);
}

TEST(SealedRecords, EveryFlippedBitFailsTheTag) {
  const std::string plain = Pattern(300);
  for (size_t at :
       {size_t{0}, size_t{3}, size_t{4}, size_t{150}, size_t{303}, size_t{304}, size_t{319}}) {
    RecordSealer sealer(Key('a'));
    RecordOpener opener(Key('a'));
    std::string record = SealOne(sealer, plain);
    record[at] = static_cast<char>(record[at] ^ 0x01);
    EXPECT_FALSE(OpenOne(opener, record).ok()) << "flipped byte " << at;
  }
}

TEST(SealedRecords, ReplayReorderAndDropFail) {
  RecordSealer sealer(Key('a'));
  const std::string r0 = SealOne(sealer, "first record");
  const std::string r1 = SealOne(sealer, "second record");
  const std::string r2 = SealOne(sealer, "third record");
  {  // replay: r0 twice
    RecordOpener opener(Key('a'));
    ASSERT_TRUE(OpenOne(opener, r0).ok());
    EXPECT_FALSE(OpenOne(opener, r0).ok());
  }
  {  // reorder: r1 first
    RecordOpener opener(Key('a'));
    EXPECT_FALSE(OpenOne(opener, r1).ok());
  }
  {  // drop: r0 then r2
    RecordOpener opener(Key('a'));
    ASSERT_TRUE(OpenOne(opener, r0).ok());
    EXPECT_FALSE(OpenOne(opener, r2).ok());
  }
}

TEST(SealedRecords, DirectionsAndConnectionsHaveTheirOwnKeys) {
  auth::Mac base{};
  base.fill(7);
  const tcp::SessionKeys keys = tcp::DeriveSessionKeys(base);
  EXPECT_NE(keys.to_server.key, keys.to_requester.key);
  EXPECT_NE(keys.to_server.nonce_prefix, keys.to_requester.nonce_prefix);
  RecordSealer up(keys.to_server);
  const std::string record = SealOne(up, "reflected back at its sender");
  RecordOpener down(keys.to_requester);  // a reflected record: the other direction's key
  EXPECT_FALSE(OpenOne(down, record).ok());
  RecordOpener other(Key('b'));  // another connection's key
  EXPECT_FALSE(OpenOne(other, record).ok());
}

TEST(SealedRecords, CounterNeverWraps) {
  RecordSealer sealer(Key('a'));
  sealer.set_counter_for_test(UINT64_MAX - 1);
  RecordOpener opener(Key('a'));
  opener.set_counter_for_test(UINT64_MAX - 1);
  ASSERT_TRUE(OpenOne(opener, SealOne(sealer, "last")).ok());
  std::string out(4 + kRecordOverhead, '\0');
  const iovec v{const_cast<char*>("more"), 4};
  EXPECT_FALSE(sealer.Seal(&v, 1, 4, reinterpret_cast<uint8_t*>(out.data())).ok());
  EXPECT_FALSE(opener
                   .Open(reinterpret_cast<const uint8_t*>(out.data()), &v, 1,
                         reinterpret_cast<const uint8_t*>(out.data()))
                   .ok());
}

TEST(SealedRecords, ImpossibleLengthsAreRefused) {
  uint8_t prefix[4] = {0, 0, 0, 0};
  size_t n = 0;
  EXPECT_FALSE(RecordOpener::BodyLength(prefix, kMaxRecordBytes, &n).ok());
  const uint32_t big = kMaxRecordBytes + 1;
  std::memcpy(prefix, &big, 4);
  EXPECT_FALSE(RecordOpener::BodyLength(prefix, kMaxRecordBytes, &n).ok());
}

// ---- A man in the middle -----------------------------------------------------------------

// The handshake's frames, forwarded one by one (each side waits for the other's).
constexpr size_t kUpHandshake[] = {48 + 32, 48 + 32};    // Nc; the requester's MAC
constexpr size_t kDownHandshake[] = {48 + 32 + 32, 48};  // Ns || the server's MAC; verdict

enum class Dir { kUp, kDown };  // up: requester -> server

// Forwards connections to `target`; after the handshake, hands each direction's records (prefix
// || body || tag, as read) to `policy`, which returns what to forward instead (nothing = drop,
// twice = replay...) or sets *cut to close both sockets. Everything forwarded is kept in wire().
class Relay {
 public:
  using Policy =
      std::function<std::vector<std::string>(Dir, uint64_t index, std::string record, bool* cut)>;
  Relay(std::string target, Policy policy)
      : target_(std::move(target)), policy_(std::move(policy)) {
    std::string bound;
    listen_ = *tcp::ListenTcp("127.0.0.1:0", {}, &bound);
    endpoint_ = bound;
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~Relay() {
    stopping_ = true;
    ::shutdown(listen_.get(), SHUT_RDWR);
    accept_thread_.join();
    {
      absl::MutexLock lock(&mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : pumps_) t.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  std::string wire() {
    absl::MutexLock lock(&mu_);
    return wire_;
  }

 private:
  void AcceptLoop() {
    while (!stopping_) {
      const int client = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      absl::StatusOr<tcp::UniqueFd> server = tcp::ConnectTcp(target_, {}, 0);
      if (!server.ok()) {
        ::close(client);
        continue;
      }
      const int s = server->release();
      const int flags = fcntl(s, F_GETFL, 0);
      fcntl(s, F_SETFL, flags & ~O_NONBLOCK);
      absl::MutexLock lock(&mu_);
      fds_.push_back(client);
      fds_.push_back(s);
      pumps_.emplace_back([this, client, s] { Pump(client, s, Dir::kUp); });
      pumps_.emplace_back([this, client, s] { Pump(s, client, Dir::kDown); });
    }
  }
  static bool ReadN(int fd, std::string& out, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    return tcp::RecvAll(fd, out.data() + at, n).ok();
  }
  bool Forward(int to, const std::string& bytes) {
    {
      absl::MutexLock lock(&mu_);
      wire_ += bytes;
    }
    return ::send(to, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  void Pump(int from, int to, Dir dir) {
    bool ok = true;
    for (size_t n : dir == Dir::kUp ? kUpHandshake : kDownHandshake) {
      std::string frame;
      ok = ok && ReadN(from, frame, n) && Forward(to, frame);
    }
    if (ok) {
      for (uint64_t index = 0;; ++index) {
        std::string record;
        if (!ReadN(from, record, tcp::kRecordPrefixSize)) break;
        uint32_t n = 0;
        std::memcpy(&n, record.data(), 4);
        if (n > kMaxRecordBytes || !ReadN(from, record, n + tcp::kRecordTagSize)) break;
        bool cut = false;
        bool ok = true;
        for (const std::string& out : policy_(dir, index, std::move(record), &cut)) {
          ok = ok && Forward(to, out);
        }
        if (cut || !ok) break;
      }
    }
    ::shutdown(to, SHUT_RDWR);
    ::shutdown(from, SHUT_RDWR);
  }

  const std::string target_;
  const Policy policy_;
  tcp::UniqueFd listen_;
  std::string endpoint_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
  std::string wire_ ABSL_GUARDED_BY(mu_);
};

Relay::Policy Honest() {
  return [](Dir, uint64_t, std::string r, bool*) { return std::vector<std::string>{r}; };
}

using testing::kSegment;

constexpr uint64_t kSegmentBytes = 8 << 20;

class EncryptedTest : public testing::TcpServerFixture {
 protected:
  EncryptedTest() : TcpServerFixture(kSegmentBytes) {}
  void StartServer(bool require = true, auth::ClusterKeysPtr keys = nullptr) {
    tcp::TcpDataServerOptions o = ServerOptions(std::move(keys));
    o.require_encryption = require;
    server_ = std::make_unique<tcp::TcpDataServer>(o, table_);
    ASSERT_TRUE(server_->Start().ok());
  }
  std::unique_ptr<TransferEngine> Engine(bool encrypt = true, auth::ClusterKeysPtr keys = nullptr,
                                         uint64_t frame_bytes = 4 << 20) {
    TransferEngineOptions o = EngineOptions(keys != nullptr ? keys : keys_, frame_bytes);
    o.tcp.encryption = encrypt;
    o.tcp.connections_per_peer = 1;
    return std::make_unique<TransferEngine>(o, local_table_);
  }
  TransferResult Submit(TransferEngine& engine, const std::string& endpoint, Direction op,
                        std::string& buf, uint64_t offset, bool hashed = false) {
    TransferRequest r{op, {{buf.data(), buf.size()}}, endpoint, SegmentRange{kSegment, offset}};
    r.capability =
        Cap(op == Direction::kRead ? Right::kRead : Right::kWrite, kSegment, offset, buf.size());
    if (hashed) r.proof = Proof::kDeliveredBytes;
    return engine.Submit({&r, 1})[0];
  }
};

TEST_F(EncryptedTest, LargeAndOddSizesBothWaysAndNothingInPlaintextOnTheWire) {
  StartServer();
  Relay relay(server_->endpoint(), Honest());
  auto engine = Engine(true, nullptr, /*frame_bytes=*/1 << 20);
  uint64_t offset = 0;
  for (size_t n : {size_t{1}, size_t{4095}, size_t{64} << 10, (size_t{3} << 20) + 12345}) {
    std::string out = Pattern(n, static_cast<uint32_t>(n) + 3);
    TransferResult w = Submit(*engine, relay.endpoint(), Direction::kWrite, out, offset);
    ASSERT_TRUE(w.status.ok()) << n << ": " << w.status;
    EXPECT_EQ(std::memcmp(memory_.data() + offset, out.data(), n), 0);
    std::string in(n, '\0');
    TransferResult r = Submit(*engine, relay.endpoint(), Direction::kRead, in, offset, true);
    ASSERT_TRUE(r.status.ok()) << n << ": " << r.status;
    EXPECT_EQ(in, out);
    EXPECT_EQ(r.checksum, Checksum(out));
    if (n == (size_t{64} << 10)) {
      // Not one 32-byte window of the pattern crossed the wire in clear, either way.
      const std::string wire = relay.wire();
      EXPECT_GT(wire.size(), 2 * n);
      for (size_t at = 0; at + 32 <= n; at += 4096) {
        EXPECT_EQ(wire.find(out.substr(at, 32)), std::string::npos) << "at " << at;
      }
    }
    offset += n;
  }
  EXPECT_GE(server_->encrypted_connections(), 1u);
  EXPECT_EQ(server_->tampered_connections(), 0u);
}

TEST_F(EncryptedTest, PlaintextRequesterIsRefusedByAServerThatRequiresEncryption) {
  StartServer(/*require=*/true);
  auto engine = Engine(/*encrypt=*/false);
  std::string in(4096, '\0');
  EXPECT_FALSE(Submit(*engine, server_->endpoint(), Direction::kRead, in, 0).status.ok());
  EXPECT_TRUE(WaitFor([&] { return server_->auth_failures(HandshakeFailure::kPlaintext) == 1; }));
}

TEST_F(EncryptedTest, AServerThatDoesNotRequireItFollowsTheWish) {
  StartServer(/*require=*/false);
  std::string out = Pattern(10000);
  auto plain = Engine(/*encrypt=*/false);
  ASSERT_TRUE(Submit(*plain, server_->endpoint(), Direction::kWrite, out, 0).status.ok());
  auto sealed = Engine(/*encrypt=*/true);
  std::string in(out.size(), '\0');
  ASSERT_TRUE(Submit(*sealed, server_->endpoint(), Direction::kRead, in, 0).status.ok());
  EXPECT_EQ(in, out);
  EXPECT_EQ(server_->encrypted_connections(), 1u);
}

TEST_F(EncryptedTest, RotationDerivesKeysFromTheServersSigningSecret) {
  const std::string a(40, 'a'), b(40, 'b');
  StartServer(true, *auth::ClusterKeys::FromSecrets({a, b}));           // signs with a
  auto engine = Engine(true, *auth::ClusterKeys::FromSecrets({b, a}));  // signs with b
  std::string out = Pattern(300000);
  ASSERT_TRUE(Submit(*engine, server_->endpoint(), Direction::kWrite, out, 0).status.ok());
  std::string in(out.size(), '\0');
  ASSERT_TRUE(Submit(*engine, server_->endpoint(), Direction::kRead, in, 0).status.ok());
  EXPECT_EQ(in, out);
}

// The attacks. `index` counts a direction's records on one connection: up, a WRITE of 1 MiB is
// its header record (0) then four payload records (1..4); down, a READ's response header is
// record 0 and its payload records 1..4.
struct Attack {
  const char* name;
  Dir dir;
  Direction op;
  Relay::Policy policy;
};

std::string Flip(std::string r, size_t at) {
  r[at] = static_cast<char>(r[at] ^ 0x40);
  return r;
}

std::vector<Attack> Attacks() {
  using V = std::vector<std::string>;
  auto on = [](Dir d, uint64_t i, std::function<V(std::string, bool*)> f) -> Relay::Policy {
    return [d, i, f](Dir dir, uint64_t index, std::string r, bool* cut) {
      if (dir == d && index == i) return f(std::move(r), cut);
      return V{r};
    };
  };
  auto held = std::make_shared<std::string>();
  auto reorder = [held](Dir d) -> Relay::Policy {
    return [d, held](Dir dir, uint64_t index, std::string r, bool*) {
      if (dir != d || (index != 1 && index != 2)) return V{r};
      if (index == 1) {
        *held = r;
        return V{};
      }
      return V{r, *held};
    };
  };
  std::vector<Attack> out;
  for (Dir d : {Dir::kUp, Dir::kDown}) {
    const Direction op = d == Dir::kUp ? Direction::kWrite : Direction::kRead;
    out.push_back({"flip payload byte", d, op,
                   on(d, 2, [](std::string r, bool*) { return V{Flip(r, 1000)}; })});
    out.push_back({"flip header record", d, op,
                   on(d, 0, [](std::string r, bool*) { return V{Flip(r, 10)}; })});
    out.push_back({"flip tag", d, op,
                   on(d, 1, [](std::string r, bool*) { return V{Flip(r, r.size() - 1)}; })});
    out.push_back(
        {"flip length", d, op, on(d, 1, [](std::string r, bool*) { return V{Flip(r, 1)}; })});
    out.push_back({"replay a record", d, op, on(d, 1, [](std::string r, bool*) {
                     return V{r, r};
                   })});
    out.push_back({"drop a record", d, op, on(d, 1, [](std::string, bool*) { return V{}; })});
    out.push_back({"reorder records", d, op, reorder(d)});
    out.push_back({"truncate mid-payload", d, op, on(d, 2, [](std::string r, bool* cut) {
                     *cut = true;
                     return V{r.substr(0, r.size() / 2)};
                   })});
  }
  return out;
}

TEST_F(EncryptedTest, EveryAttackOnTheWireFailsClosed) {
  StartServer();
  uint64_t expect_tampered = 0;
  for (const Attack& attack : Attacks()) {
    SCOPED_TRACE(std::string(attack.name) + (attack.dir == Dir::kUp ? " (up)" : " (down)"));
    std::fill(memory_.begin(), memory_.end(), 'M');
    Relay relay(server_->endpoint(), attack.policy);
    auto engine = Engine();
    std::string buf = attack.op == Direction::kWrite ? Pattern(1 << 20) : std::string(1 << 20, 0);
    TransferResult r =
        Submit(*engine, relay.endpoint(), attack.op, buf, 0, attack.op == Direction::kRead);
    EXPECT_FALSE(r.status.ok());
    EXPECT_FALSE(r.checksum.has_value());
    if (attack.op == Direction::kRead) {
      // Nothing opened after the attack: the bytes at and past the attacked record were never
      // authenticated (a failed get's buffer holds no usable data either way).
      EXPECT_NE(buf, std::string(memory_.data(), buf.size()));
    }
    const bool server_sees_it =
        attack.dir == Dir::kUp && std::string(attack.name) != "truncate mid-payload";
    if (server_sees_it) {
      ++expect_tampered;
      EXPECT_TRUE(WaitFor([&] { return server_->tampered_connections() == expect_tampered; }));
    }
    // The server's connection ends either way.
    EXPECT_TRUE(WaitFor([&] { return server_->connection_count() == 0; }));
  }
}

}  // namespace
}  // namespace mc::transfer
