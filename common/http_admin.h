// The HTTP admin endpoint both daemons serve: /metrics, /status, /healthz and whatever else a
// daemon registers. Handlers are plain functions returning a body (and optionally a status
// code); they run on the server's one event-loop thread, must be thread-safe and quick.
// Start() binds (port 0 picks a free one) and serves in the background; Stop() (or the
// destructor) ends serving and joins.
//
// Built for hostile peers, since a liveness probe that times out restarts the daemon (and loses
// its memory): one non-blocking event loop, so a slow client costs an fd, never a thread; one
// request per connection (Connection: close); the whole request must arrive and the response
// leave within request_timeout_ms; at most max_connections open: when that many are, a new one
// closes the OLDEST connection whose request has not fully arrived yet (a probe sends its request
// at once, a flood of silent or dripping sockets cannot keep /healthz from being answered);
// at most max_connections_per_peer from one IP address (beyond: 503 and close); request heads
// above max_request_bytes get 431.
// accept() failures (EMFILE...) back off instead of spinning and are counted.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"

namespace mc {

class MetricsRegistry;
class Counter;

struct AdminServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = any free port
  int max_connections = 64;
  int max_connections_per_peer = 16;
  int64_t request_timeout_ms = 2000;
  size_t max_request_bytes = 8192;
  int64_t max_accept_backoff_ms = 1000;
  MetricsRegistry* metrics = nullptr;  // optional: mc_http_* counters
};

// One parsed request head ("GET /path?query HTTP/1.1" and headers).
struct HttpRequestHead {
  std::string method;
  std::string path;  // without the query string
};
enum class HttpParse { kComplete, kIncomplete, kBad, kTooLarge };
// Parses the head at the start of `data` (pure; exposed for tests and the fuzzer).
HttpParse ParseHttpRequestHead(std::string_view data, size_t max_bytes, HttpRequestHead* out);

class AdminServer {
 public:
  using Handler = std::function<std::string()>;
  struct Reply {
    int status = 200;
    std::string body;
  };
  using ReplyHandler = std::function<Reply()>;

  explicit AdminServer(AdminServerOptions options);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Registers GET (and HEAD) `path`; call before Start().
  void Handle(const std::string& path, const std::string& content_type, Handler handler);
  // The same with a status code (e.g. /healthz answering 503).
  void HandleReply(const std::string& path, const std::string& content_type, ReplyHandler handler);

  // Binds and starts serving; returns "HOST:PORT" actually bound.
  absl::StatusOr<std::string> Start();
  void Stop();

  // The full response (status line, headers, body) to the request head in `request`; pure
  // apart from the handlers it calls. Exposed for tests and the fuzzer.
  std::string Respond(std::string_view request) const;

  uint64_t accept_errors() const { return accept_errors_.load(); }
  uint64_t rejected_connections() const { return rejected_.load(); }
  uint64_t evicted_connections() const { return evicted_.load(); }
  uint64_t timed_out_connections() const { return timed_out_.load(); }

 private:
  struct Route {
    std::string content_type;
    ReplyHandler handler;
  };
  class Connections;  // the serving thread's state and steps (http_admin.cc)
  void Loop();

  const AdminServerOptions options_;
  std::map<std::string, Route> routes_;  // fixed once started
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<uint64_t> accept_errors_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> evicted_{0};
  std::atomic<uint64_t> timed_out_{0};
  Counter* accept_errors_metric_ = nullptr;
  Counter* rejected_metric_ = nullptr;
  Counter* evicted_metric_ = nullptr;
  Counter* timed_out_metric_ = nullptr;
};

}  // namespace mc
