// TcpDataServer's defences: accept() failures back off (no spin) and mark the data plane
// unhealthy, connections are capped per peer, idle and stalled connections are closed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics.h"
#include "tests/fakes/await.h"
#include "transfer/tcp/server.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer {
namespace {

using tcp::TcpDataServer;
using tcp::TcpDataServerOptions;

class Limits : public ::testing::Test {
 protected:
  void StartServer(TcpDataServerOptions options) {
    memory_.resize(1 << 20);
    table_.Add(5, memory_.data(), memory_.size());
    options.listen_address = "127.0.0.1:0";
    options.metrics = &metrics_;
    server_ = std::make_unique<TcpDataServer>(options, table_);
    ASSERT_TRUE(server_->Start().ok());
    port_ = std::stoi(server_->endpoint().substr(server_->endpoint().rfind(':') + 1));
  }
  // A blocking socket, not yet connected.
  static int NewSocket() { return ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); }
  bool Connect(int fd) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  // True when the server closes `fd` within `ms`.
  static bool ClosedWithin(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return false;
    char c;
    return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
  }

  MetricsRegistry metrics_;
  std::vector<char> memory_;
  SegmentTable table_;
  std::unique_ptr<TcpDataServer> server_;
  int port_ = 0;
};

// The issue: at the fd limit the accept loop spun at 99% CPU and /healthz still said ok.
TEST_F(Limits, AcceptFailuresBackOffAndMarkTheDataPlaneUnhealthy) {
  TcpDataServerOptions o;
  o.max_accept_backoff_ms = 200;
  StartServer(o);
  EXPECT_TRUE(server_->Health().ok());
  const int client = NewSocket();
  ASSERT_GE(client, 0);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 512);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> hogs;
  for (int fd; (fd = ::dup(client)) >= 0;) hogs.push_back(fd);
  ASSERT_EQ(errno, EMFILE);
  const auto connected = std::chrono::steady_clock::now();
  ASSERT_TRUE(Connect(client)) << "the kernel queues it; accept() then fails with EMFILE";
  ASSERT_TRUE(WaitFor([&] { return server_->accept_errors() >= 3; }));
  // Backing off 10 then 20 ms puts the third failure 30 ms or more after the first; a spin
  // reaches it within microseconds (a slow machine only makes the time longer).
  EXPECT_GE(std::chrono::steady_clock::now() - connected, std::chrono::milliseconds(30))
      << "accept loop spinning";
  absl::Status health = server_->Health();
  EXPECT_FALSE(health.ok());
  EXPECT_NE(health.message().find("accept"), std::string_view::npos) << health;
  EXPECT_NE(metrics_.RenderPrometheus().find("mc_dataplane_accept_errors_total"),
            std::string::npos);
  for (int fd : hogs) ::close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_TRUE(WaitFor([&] { return server_->connection_count() == 1; }))
      << "the queued connection is accepted once fds are free";
  EXPECT_TRUE(server_->Health().ok());
  ::close(client);
}

TEST_F(Limits, ConnectionsBeyondThePerPeerCapAreClosed) {
  TcpDataServerOptions o;
  o.max_connections_per_peer = 2;
  StartServer(o);
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    fds.push_back(NewSocket());
    ASSERT_TRUE(Connect(fds.back()));
  }
  EXPECT_TRUE(ClosedWithin(fds[2], 3000));
  // The server accepts in order: the third one's rejection proves it took the first two.
  EXPECT_EQ(server_->connection_count(), 2u);
  EXPECT_FALSE(ClosedWithin(fds[0], 0));
  EXPECT_EQ(server_->rejected_connections(), 1u);
  ::close(fds[0]);
  EXPECT_TRUE(WaitFor([&] { return server_->connection_count() == 1; }));
  fds[0] = NewSocket();
  ASSERT_TRUE(Connect(fds[0]));
  EXPECT_TRUE(WaitFor([&] { return server_->connection_count() == 2; }))
      << "room again once one closed";
  EXPECT_FALSE(ClosedWithin(fds[0], 0));
  EXPECT_EQ(server_->rejected_connections(), 1u);
  for (int fd : fds) ::close(fd);
}

TEST_F(Limits, IdleAndStalledConnectionsAreClosed) {
  TcpDataServerOptions o;
  o.idle_timeout_ms = 200;
  o.io_timeout_ms = 200;
  StartServer(o);
  const int idle = NewSocket();
  ASSERT_TRUE(Connect(idle));
  const int stalled = NewSocket();
  ASSERT_TRUE(Connect(stalled));
  const char half[4] = {1, 2, 3, 4};  // a header never completed
  ASSERT_EQ(::send(stalled, half, sizeof(half), MSG_NOSIGNAL), 4);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(ClosedWithin(idle, 5000));
  EXPECT_TRUE(ClosedWithin(stalled, 5000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(WaitFor([&] { return server_->connection_count() == 0; }));
  ::close(idle);
  ::close(stalled);
}

}  // namespace
}  // namespace mc::transfer
