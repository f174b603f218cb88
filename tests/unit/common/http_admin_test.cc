// AdminServer: request parsing and routing, and its defences against slow or numerous clients
// (the issue: eight slow clients made /healthz time out, and a liveness probe would restart).
#include "common/http_admin.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "gtest/gtest.h"
#include "tests/fakes/await.h"

namespace mc {
namespace {

int ConnectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Sends `request` on a new connection and reads the whole answer (bounded by `ms`).
std::string Exchange(int port, const std::string& request, int ms = 3000) {
  const int fd = ConnectTo(port);
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

int PortOf(const std::string& hostport) {
  return std::stoi(hostport.substr(hostport.rfind(':') + 1));
}

TEST(HttpParse, RequestHeads) {
  HttpRequestHead h;
  EXPECT_EQ(ParseHttpRequestHead("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", 8192, &h),
            HttpParse::kComplete);
  EXPECT_EQ(h.method, "GET");
  EXPECT_EQ(h.path, "/metrics");
  EXPECT_EQ(ParseHttpRequestHead("GET /metrics HTTP/1.1\r\nHost:", 8192, &h),
            HttpParse::kIncomplete);
  EXPECT_EQ(ParseHttpRequestHead("GET metrics HTTP/1.1\r\n\r\n", 8192, &h), HttpParse::kBad);
  EXPECT_EQ(ParseHttpRequestHead("GET /a HTTP/2\r\n\r\n", 8192, &h), HttpParse::kBad);
  EXPECT_EQ(ParseHttpRequestHead("get /a HTTP/1.1\r\n\r\n", 8192, &h), HttpParse::kBad);
  EXPECT_EQ(ParseHttpRequestHead("GET /a\x01 HTTP/1.1\r\n\r\n", 8192, &h), HttpParse::kBad);
  EXPECT_EQ(ParseHttpRequestHead(std::string(9000, 'x'), 8192, &h), HttpParse::kTooLarge);
  EXPECT_EQ(ParseHttpRequestHead("", 8192, &h), HttpParse::kIncomplete);
}

TEST(AdminServer, RoutesAndStatusCodes) {
  AdminServer server({});
  server.Handle("/metrics", "text/plain", [] { return std::string("m 1\n"); });
  server.HandleReply("/healthz", "text/plain", [] { return AdminServer::Reply{503, "no\n"}; });
  EXPECT_NE(server.Respond("GET /metrics HTTP/1.1\r\n\r\n").find("200 OK"), std::string::npos);
  EXPECT_NE(server.Respond("GET /metrics HTTP/1.1\r\n\r\n").find("\r\n\r\nm 1\n"),
            std::string::npos);
  EXPECT_NE(server.Respond("GET /healthz HTTP/1.0\r\n\r\n").find("503"), std::string::npos);
  EXPECT_NE(server.Respond("GET /nope HTTP/1.1\r\n\r\n").find("404"), std::string::npos);
  EXPECT_NE(server.Respond("POST /metrics HTTP/1.1\r\n\r\n").find("405"), std::string::npos);
  EXPECT_NE(server.Respond("garbage\r\n\r\n").find("400"), std::string::npos);
  const std::string head = server.Respond("HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_NE(head.find("Content-Length: 4"), std::string::npos);
  EXPECT_EQ(head.find("m 1"), std::string::npos);
}

TEST(AdminServer, SlowClientsDoNotStarveHealthz) {
  MetricsRegistry metrics;
  AdminServerOptions o;
  o.request_timeout_ms = 500;
  o.max_connections_per_peer = 32;
  o.metrics = &metrics;
  AdminServer server(o);
  server.Handle("/healthz", "text/plain", [] { return std::string("ok\n"); });
  auto bound = server.Start();
  ASSERT_TRUE(bound.ok()) << bound.status();
  const int port = PortOf(*bound);
  // Sixteen slow-loris clients: each sent part of a request and stalls.
  std::vector<int> slow;
  for (int i = 0; i < 16; ++i) {
    slow.push_back(ConnectTo(port));
    ASSERT_EQ(::send(slow.back(), "GET /hea", 8, MSG_NOSIGNAL), 8);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string got = Exchange(port, "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(400));
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
  EXPECT_NE(got.find("ok\n"), std::string::npos);
  // The slow ones are cut off at the request timeout.
  for (int fd : slow) {
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 3000), 1);
    char c;
    EXPECT_LE(::recv(fd, &c, 1, 0), 0);
    ::close(fd);
  }
  EXPECT_EQ(server.timed_out_connections(), 16u);
  EXPECT_NE(metrics.RenderPrometheus().find("mc_http_connections_timed_out_total 16"),
            std::string::npos);
  server.Stop();
}

TEST(AdminServer, ConnectionsBeyondThePerPeerCapGet503) {
  AdminServerOptions o;
  o.max_connections_per_peer = 2;
  AdminServer server(o);
  server.Handle("/healthz", "text/plain", [] { return std::string("ok\n"); });
  auto bound = server.Start();
  ASSERT_TRUE(bound.ok());
  const int port = PortOf(*bound);
  const int a = ConnectTo(port);
  const int b = ConnectTo(port);
  // The loop accepts in the order the kernel queued the connections: both before the third.
  const std::string got = Exchange(port, "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_NE(got.find("503"), std::string::npos) << got;
  EXPECT_EQ(server.rejected_connections(), 1u);
  ::close(a);
  ::close(b);
  // Once they are gone, requests are served again.
  std::string again;
  EXPECT_TRUE(WaitFor([&] {
    again = Exchange(port, "GET /healthz HTTP/1.1\r\n\r\n");
    return again.find("200 OK") != std::string::npos;
  })) << again;
}

}  // namespace
}  // namespace mc
