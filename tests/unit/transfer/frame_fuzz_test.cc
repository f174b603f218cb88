// Seeded random and mutated frames, thrown at the decoder and at a live TcpDataServer.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/capability.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "tests/unit/transfer/transfer_test_util.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/handshake.h"
#include "transfer/tcp/server.h"
#include "transfer/tcp/socket_util.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer::tcp {
namespace {

constexpr uint64_t kSegmentBytes = 4096;

// The segment of LiveServerSurvivesRandomFrames. That server has no capabilities, so random READ
// and WRITE frames on different connections may cover the same bytes at once: a race on the
// segment's bytes is that test's input, not a bug (in the product, leases and capabilities never
// grant a write over a range being read). A named global so that tests/tsan.supp can suppress
// races on exactly these bytes and nothing else.
char g_unauthenticated_fuzz_segment[kSegmentBytes];

// A valid request, then (mostly) a few random byte/bit mutations or pure noise.
std::vector<uint8_t> RandomFrame(std::mt19937_64& rng) {
  FrameHeader h = MakeRequest(rng() % 2 ? FrameOp::kRead : FrameOp::kWrite, rng(), rng() % 3,
                              rng() % (2 * kSegmentBytes), rng() % 64);
  FrameBytes b = EncodeFrameHeader(h);
  std::vector<uint8_t> out(b.begin(), b.end());
  switch (rng() % 4) {
    case 0:  // noise
      for (auto& x : out) x = static_cast<uint8_t>(rng());
      break;
    case 1:  // a few bytes replaced
      for (int i = 0, n = 1 + rng() % 4; i < n; ++i) out[rng() % out.size()] = rng();
      break;
    case 2:  // one bit flipped
      out[rng() % out.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    default:  // valid header, perhaps with a random (possibly huge) length
      if (rng() % 2) {
        h.length = rng() >> (rng() % 64);
        EncodeFrameHeader(h, out.data());
      }
  }
  // The capability block of a data op: random bytes (a forgery) or zeros (none).
  const bool zeros = rng() % 2 == 0;
  for (size_t i = 0; i < kCapabilityBlockSize; ++i) {
    out.push_back(zeros ? 0 : static_cast<uint8_t>(rng()));
  }
  return out;
}

TEST(FrameFuzz, DecoderNeverAcceptsGarbage) {
  std::mt19937_64 rng(42);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> f = RandomFrame(rng);
    auto h = DecodeFrameHeader(f.data(), kFrameHeaderSize, 1 << 20);
    if (!h.ok()) continue;
    ++accepted;
    EXPECT_EQ(h->magic, kFrameMagic);
    EXPECT_EQ(h->version, kFrameVersion);
    EXPECT_GE(h->base_op(), 1);
    EXPECT_LE(h->base_op(), kMaxFrameOp);
    EXPECT_LE(h->length, 1u << 20);
  }
  EXPECT_GT(accepted, 0);
}

// Sends `frames` random frames (plus random payload bytes) on one connection, reading whatever
// comes back, then half-closes and drains until the server closes.
void Barrage(const std::string& endpoint, uint64_t seed, int frames,
             const auth::ClusterKeys* keys = nullptr) {
  auto fd = ConnectTcp(endpoint, {}, RealClock::Get().NowMs() + 5000);
  if (!fd.ok()) return;
  if (keys != nullptr && !ClientHandshake(fd->get(), *keys, RealClock::Get().NowMs() + 5000).ok()) {
    ADD_FAILURE() << "handshake failed";
    return;
  }
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out;
  for (int i = 0; i < frames; ++i) {
    std::vector<uint8_t> f = RandomFrame(rng);
    out.insert(out.end(), f.begin(), f.end());
    for (int k = 0, n = rng() % 3 == 0 ? rng() % 80 : 0; k < n; ++k) out.push_back(rng());
  }
  size_t sent = 0;
  char sink[8192];
  const int64_t give_up = RealClock::Get().NowMs() + 5000;
  bool shut = false;
  while (RealClock::Get().NowMs() < give_up) {
    if (sent == out.size() && !shut) {
      ::shutdown(fd->get(), SHUT_WR);
      shut = true;
    }
    pollfd p{fd->get(), static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (p.revents & POLLIN || p.revents & (POLLERR | POLLHUP)) {
      const ssize_t n = ::recv(fd->get(), sink, sizeof(sink), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return;  // server closed: done
    }
    if (!shut && (p.revents & POLLOUT)) {
      const ssize_t n =
          ::send(fd->get(), out.data() + sent, out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN) return;
      if (n > 0) sent += n;
    }
  }
}

TEST(FrameFuzz, LiveServerSurvivesRandomFrames) {
  char* const memory = g_unauthenticated_fuzz_segment;
  SegmentTable table;
  table.Add(1, memory, kSegmentBytes);
  MetricsRegistry metrics;
  TcpDataServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics = &metrics;
  options.max_frame_length = 1 << 20;
  TcpDataServer server(options, table);
  ASSERT_TRUE(server.Start().ok());

  const auto start = std::chrono::steady_clock::now();
  constexpr int kThreads = 4, kConnsPerThread = 500, kFramesPerConn = 10;  // 20k frames
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int c = 0; c < kConnsPerThread; ++c) {
        if (testing::SecondsSince(start) > 15) return;  // bounded in time
        Barrage(server.endpoint(), t * 100000 + c, kFramesPerConn);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(server.malformed_frames(), 100u)
      << "frames sent: " << kThreads * kConnsPerThread * kFramesPerConn;
  std::printf("malformed frames counted: %lu\n",
              static_cast<unsigned long>(server.malformed_frames()));
  EXPECT_EQ(metrics.GetCounter("mc_dataplane_malformed_frames_total", "").Value(),
            server.malformed_frames());

  // Still serving: a valid write then read through the engine.
  std::fill(memory, memory + kSegmentBytes, 0);
  TransferEngine engine(TransferEngineOptions{}, table);
  std::vector<char> src = testing::Pattern(kSegmentBytes, 5), dst(kSegmentBytes);
  std::vector<TransferRequest> w = {
      testing::Request(Direction::kWrite, testing::Split(src, 2), server.endpoint(), 1, 0)};
  ASSERT_TRUE(engine.Submit(w, RealClock::Get().NowMs() + 5000)[0].status.ok());
  std::vector<TransferRequest> r = {
      testing::Request(Direction::kRead, testing::Split(dst, 3), server.endpoint(), 1, 0)};
  auto res = engine.Submit(r, RealClock::Get().NowMs() + 5000);
  ASSERT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_TRUE(dst == src);
  server.Stop();
}

// A member that passed the handshake and then sends junk and forged capabilities: every frame is
// refused or closes its connection, and no byte of the segment changes.
TEST(FrameFuzz, AuthenticatedServerRefusesRandomFramesAfterTheHandshake) {
  std::vector<char> memory(kSegmentBytes, 'S');
  SegmentTable table;
  table.Add(1, memory.data(), memory.size());
  MetricsRegistry metrics;
  auto keys = *auth::ClusterKeys::FromSecrets({std::string(40, 'k')});
  auth::CapabilityVerifier verifier({}, RealClock::Get());
  verifier.SetKey(std::string(32, 'o'));
  TcpDataServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics = &metrics;
  options.max_frame_length = 1 << 20;
  options.cluster_keys = keys;
  options.capabilities = &verifier;
  TcpDataServer server(options, table);
  ASSERT_TRUE(server.Start().ok());
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int c = 0; c < 200; ++c) {
        if (testing::SecondsSince(start) > 10) return;
        Barrage(server.endpoint(), 7'000'000 + t * 100000 + c, 10, keys.get());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(server.malformed_frames(), 10u);
  uint64_t denied = 0;
  for (int d = 1; d < static_cast<int>(auth::Denial::kCount); ++d) {
    denied += server.capability_denials(static_cast<auth::Denial>(d));
  }
  EXPECT_GT(denied, 10u);
  EXPECT_TRUE(std::all_of(memory.begin(), memory.end(), [](char c) { return c == 'S'; }));
  server.Stop();
}

}  // namespace
}  // namespace mc::transfer::tcp
