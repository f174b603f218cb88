#include "common/http_admin.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status.h"

namespace mc {
namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("http");
  return log;
}

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

std::string Render(int status, const std::string& content_type, const std::string& body,
                   bool head_only) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\nContent-Type: ", content_type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (!head_only) out.append(body);
  return out;
}

bool IsToken(std::string_view s) {
  if (s.empty() || s.size() > 16) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
}

std::string PeerHost(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, host, sizeof(host));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, host,
              sizeof(host));
  }
  return host;
}

}  // namespace

HttpParse ParseHttpRequestHead(std::string_view data, size_t max_bytes, HttpRequestHead* out) {
  const size_t end = data.find("\r\n\r\n");
  if (end == std::string_view::npos) {
    // A bare "\n\n" ends a head too (lenient clients).
    const size_t lf = data.find("\n\n");
    if (lf == std::string_view::npos) {
      return data.size() > max_bytes ? HttpParse::kTooLarge : HttpParse::kIncomplete;
    }
    if (lf > max_bytes) return HttpParse::kTooLarge;
    data = data.substr(0, lf);
  } else {
    if (end > max_bytes) return HttpParse::kTooLarge;
    data = data.substr(0, end);
  }
  const size_t eol = data.find('\n');
  std::string_view line = data.substr(0, eol);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return HttpParse::kBad;
  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return HttpParse::kBad;
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method) || target.empty() || target[0] != '/' ||
      (version != "HTTP/1.1" && version != "HTTP/1.0")) {
    return HttpParse::kBad;
  }
  for (char c : target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return HttpParse::kBad;
  }
  const size_t q = target.find_first_of("?#");
  out->method = std::string(method);
  out->path = std::string(target.substr(0, q));
  return HttpParse::kComplete;
}

AdminServer::AdminServer(AdminServerOptions options) : options_(std::move(options)) {
  if (options_.metrics != nullptr) {
    accept_errors_metric_ = &options_.metrics->GetCounter(
        "mc_http_accept_errors_total", "Admin HTTP accept() failures (each backs off)");
    rejected_metric_ = &options_.metrics->GetCounter(
        "mc_http_connections_rejected_total",
        "Admin HTTP connections refused (503): over the per-peer cap");
    evicted_metric_ = &options_.metrics->GetCounter(
        "mc_http_connections_evicted_total",
        "Admin HTTP connections closed before their request had arrived, to make room for a new "
        "one (the total cap was reached)");
    timed_out_metric_ = &options_.metrics->GetCounter(
        "mc_http_connections_timed_out_total",
        "Admin HTTP connections closed because the request or response outlasted the timeout");
  }
}

AdminServer::~AdminServer() { Stop(); }

void AdminServer::Handle(const std::string& path, const std::string& content_type,
                         Handler handler) {
  routes_[path] = Route{content_type, [h = std::move(handler)] { return Reply{200, h()}; }};
}

void AdminServer::HandleReply(const std::string& path, const std::string& content_type,
                              ReplyHandler handler) {
  routes_[path] = Route{content_type, std::move(handler)};
}

std::string AdminServer::Respond(std::string_view request) const {
  HttpRequestHead head;
  switch (ParseHttpRequestHead(request, options_.max_request_bytes, &head)) {
    case HttpParse::kComplete:
      break;
    case HttpParse::kTooLarge:
      return Render(431, "text/plain", "request head too large\n", false);
    case HttpParse::kIncomplete:
    case HttpParse::kBad:
      return Render(400, "text/plain", "bad request\n", false);
  }
  const bool head_only = head.method == "HEAD";
  if (head.method != "GET" && !head_only) {
    return Render(405, "text/plain", "only GET and HEAD\n", false);
  }
  auto it = routes_.find(head.path);
  if (it == routes_.end()) return Render(404, "text/plain", "not found\n", head_only);
  Reply reply = it->second.handler();
  if (reply.status < 100 || reply.status > 599) reply.status = 500;
  return Render(reply.status, it->second.content_type, reply.body, head_only);
}

absl::StatusOr<std::string> AdminServer::Start() {
  if (listen_fd_ >= 0) return McError(Code::kInternal, "admin HTTP already started");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* ai = nullptr;
  const std::string port = std::to_string(options_.port);
  const char* host = options_.host.empty() ? nullptr : options_.host.c_str();
  if (int rc = getaddrinfo(host, port.c_str(), &hints, &ai); rc != 0) {
    return McError(Code::kUnavailable, absl::StrCat("admin HTTP cannot resolve ", options_.host,
                                                    ": ", gai_strerror(rc)));
  }
  int fd = -1;
  for (addrinfo* a = ai; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  if (fd < 0) {
    return McError(Code::kUnavailable,
                   absl::StrCat("admin HTTP cannot bind ", options_.host, ":", options_.port));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    ::close(fd);
    return McError(Code::kInternal, "eventfd failed");
  }
  listen_fd_ = fd;
  thread_ = std::thread([this] { Loop(); });
  return absl::StrCat(options_.host, ":", bound_port);
}

void AdminServer::Stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    if (::write(wake_fd_, &one, sizeof(one)) < 0) Log().warn("admin HTTP: wake write failed");
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

// Loop()'s state and steps: the open connections (in the order their pollfds follow the wake
// fd's and the listener's), how many each peer holds, and the accept backoff. Lives on the
// serving thread only.
class AdminServer::Connections {
 public:
  explicit Connections(AdminServer& server) : server_(server), options_(server.options_) {}

  // Serves until Stop() wakes the thread (or poll fails), then closes every connection.
  void Run();

 private:
  struct Conn {
    int fd;
    std::string peer;
    int64_t deadline_ms;
    std::string in;
    std::string out;
    size_t sent = 0;
    bool responding = false;
  };

  // Fills fds_: the wake fd, the listener (-1 while accepts back off), then every connection,
  // waiting to read its request or to send its response; returns the poll timeout in ms.
  int64_t PreparePoll(int64_t now, bool accepting);
  // Reads or writes each connection poll found ready (`polled`: poll returned events), and
  // closes those done or past their deadline.
  void ServeConnections(bool polled, int64_t now);
  // One read of the request (answered once its head is complete) or one send of the response;
  // true when the connection is done: closed by the peer, failed, or fully answered.
  bool Step(Conn& c);
  // Accepts a burst of new connections; an accept error backs further accepts off.
  void AcceptNew(int64_t now);
  // Takes connection `fd` from `peer` within the caps (at the total cap, the oldest one still
  // waiting for its request makes room), or answers 503 and closes it.
  void Admit(int fd, std::string peer, int64_t now);
  std::list<Conn>::iterator Close(std::list<Conn>::iterator it);
  static void Count(std::atomic<uint64_t>& a, Counter* m) {
    a.fetch_add(1);
    if (m != nullptr) m->Inc();
  }

  AdminServer& server_;
  const AdminServerOptions& options_;
  std::list<Conn> conns_;
  absl::flat_hash_map<std::string, int> per_peer_;
  std::vector<pollfd> fds_;
  int64_t backoff_ms_ = 0;
  int64_t accept_resume_ms_ = 0;
};

void AdminServer::Loop() { Connections(*this).Run(); }

void AdminServer::Connections::Run() {
  const Clock& clock = RealClock::Get();
  while (true) {
    int64_t now = clock.NowMs();
    const bool accepting = now >= accept_resume_ms_;
    const int64_t timeout = PreparePoll(now, accepting);
    int rc = ::poll(fds_.data(), fds_.size(), static_cast<int>(timeout));
    if (rc < 0 && errno != EINTR) {
      Log().error("admin HTTP poll: {}", std::strerror(errno));
      break;
    }
    if (rc > 0 && fds_[0].revents != 0) break;  // Stop()
    now = clock.NowMs();
    // Connections first, then new ones.
    ServeConnections(rc > 0, now);
    if (accepting && rc > 0 && (fds_[1].revents & POLLIN) != 0) AcceptNew(now);
  }
  while (!conns_.empty()) Close(conns_.begin());
}

int64_t AdminServer::Connections::PreparePoll(int64_t now, bool accepting) {
  fds_.clear();
  fds_.push_back({server_.wake_fd_, POLLIN, 0});
  fds_.push_back({accepting ? server_.listen_fd_ : -1, POLLIN, 0});
  int64_t timeout = accepting ? 1000 : accept_resume_ms_ - now;
  for (const Conn& c : conns_) {
    fds_.push_back({c.fd, static_cast<short>(c.responding ? POLLOUT : POLLIN), 0});
    timeout = std::min(timeout, std::max<int64_t>(c.deadline_ms - now, 0));
  }
  return timeout;
}

void AdminServer::Connections::ServeConnections(bool polled, int64_t now) {
  size_t k = 2;  // the connections' pollfds follow the list's order
  for (auto it = conns_.begin(); it != conns_.end(); ++k) {
    const short ev = polled ? fds_[k].revents : 0;
    bool done = ev != 0 && Step(*it);
    if (!done && now >= it->deadline_ms) {
      Count(server_.timed_out_, server_.timed_out_metric_);
      done = true;
    }
    it = done ? Close(it) : std::next(it);
  }
}

bool AdminServer::Connections::Step(Conn& c) {
  if (c.responding) {
    const ssize_t n =
        ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) c.sent += static_cast<size_t>(n);
    return (n < 0 && errno != EAGAIN && errno != EINTR) || c.sent == c.out.size();
  }
  char buf[4096];
  const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  if (n > 0) {
    c.in.append(buf, static_cast<size_t>(n));
    HttpRequestHead head;
    const HttpParse p = ParseHttpRequestHead(c.in, options_.max_request_bytes, &head);
    if (p != HttpParse::kIncomplete) {
      c.out = server_.Respond(c.in);
      c.in.clear();
      c.responding = true;
    }
  }
  return false;
}

void AdminServer::Connections::AcceptNew(int64_t now) {
  for (int burst = 0; burst < 64; ++burst) {
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    const int fd = ::accept4(server_.listen_fd_, reinterpret_cast<sockaddr*>(&addr), &addr_len,
                             SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EINTR || err == ECONNABORTED) break;
      Count(server_.accept_errors_, server_.accept_errors_metric_);
      backoff_ms_ = std::min<int64_t>(backoff_ms_ == 0 ? 10 : backoff_ms_ * 2,
                                      options_.max_accept_backoff_ms);
      accept_resume_ms_ = now + backoff_ms_;
      MC_LOG_EVERY(std::chrono::seconds(5), Log(), err,
                   "admin HTTP accept failed: {} (backing off {} ms)", std::strerror(err),
                   backoff_ms_);
      break;
    }
    backoff_ms_ = 0;
    Admit(fd, PeerHost(addr), now);
  }
}

void AdminServer::Connections::Admit(int fd, std::string peer, int64_t now) {
  if (static_cast<int>(conns_.size()) >= options_.max_connections &&
      per_peer_[peer] < options_.max_connections_per_peer) {
    // Full: the oldest connection still waiting for its request makes room (otherwise a few
    // addresses fill the cap and /healthz goes unanswered).
    auto oldest =
        std::find_if(conns_.begin(), conns_.end(), [](const Conn& c) { return !c.responding; });
    if (oldest != conns_.end()) {
      Count(server_.evicted_, server_.evicted_metric_);
      MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
                   "admin HTTP at its cap ({}): the oldest waiting connection, from {}, "
                   "closed for a new one from {}",
                   options_.max_connections, oldest->peer, peer);
      Close(oldest);
    }
  }
  int& from_peer = per_peer_[peer];
  if (static_cast<int>(conns_.size()) >= options_.max_connections ||
      from_peer >= options_.max_connections_per_peer) {
    if (from_peer == 0) per_peer_.erase(peer);
    Count(server_.rejected_, server_.rejected_metric_);
    const std::string busy = Render(503, "text/plain", "too many connections\n", false);
    (void)!::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(fd);
    MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
                 "admin HTTP connection from {} refused: {} open, caps {} / {} per peer", peer,
                 conns_.size(), options_.max_connections, options_.max_connections_per_peer);
    return;
  }
  ++from_peer;
  conns_.push_back(Conn{fd, std::move(peer), now + options_.request_timeout_ms, {}, {}, 0, false});
}

std::list<AdminServer::Connections::Conn>::iterator AdminServer::Connections::Close(
    std::list<Conn>::iterator it) {
  ::close(it->fd);
  auto p = per_peer_.find(it->peer);
  if (p != per_peer_.end() && --p->second <= 0) per_peer_.erase(p);
  return conns_.erase(it);
}

}  // namespace mc
