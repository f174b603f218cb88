#include "transfer/tcp/connection_pool.h"

#include <poll.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "transfer/tcp/handshake.h"

namespace mc::transfer::tcp {
namespace {

// An idle connection must have nothing to read: readable means EOF, an error or stray bytes.
bool StillHealthy(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  return ::poll(&pfd, 1, 0) == 0;
}

}  // namespace

absl::StatusOr<std::vector<PeerConnection>> ConnectionPool::Acquire(const std::string& endpoint,
                                                                    int count,
                                                                    int64_t deadline_ms) {
  std::vector<PeerConnection> out;
  std::vector<PeerConnection> stale;  // closed outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(endpoint);
    while (it != idle_.end() && !it->second.empty() && static_cast<int>(out.size()) < count) {
      PeerConnection conn = std::move(it->second.back());
      it->second.pop_back();
      if (StillHealthy(conn.fd.get())) {
        out.push_back(std::move(conn));
      } else {
        stale.push_back(std::move(conn));
      }
    }
  }
  while (static_cast<int>(out.size()) < count) {
    absl::StatusOr<UniqueFd> fd = ConnectTcp(endpoint, options_.socket_buffers, deadline_ms);
    SessionKeys session;
    const bool encrypt = options_.cluster_keys != nullptr && options_.encrypt;
    if (fd.ok() && options_.cluster_keys != nullptr) {
      int64_t by = RealClock::Get().NowMs() + options_.handshake_timeout_ms;
      if (deadline_ms != 0) by = std::min(by, deadline_ms);
      if (absl::Status s =
              ClientHandshake(fd->get(), *options_.cluster_keys, by, encrypt ? &session : nullptr);
          !s.ok()) {
        fd = McError(ToCode(s), absl::StrCat("data-plane handshake with ", endpoint, ": ",
                                             std::string(s.message())));
      }
    }
    if (!fd.ok()) {
      if (out.empty()) return fd.status();
      break;  // go on with the connections we have
    }
    PeerConnection conn;
    conn.endpoint = endpoint;
    conn.fd = std::move(*fd);
    if (encrypt) {
      conn.sealer = std::make_unique<RecordSealer>(session.to_server);
      conn.opener = std::make_unique<RecordOpener>(session.to_requester);
    }
    out.push_back(std::move(conn));
  }
  return out;
}

void ConnectionPool::Release(PeerConnection conn) {
  absl::MutexLock lock(&mu_);
  std::vector<PeerConnection>& idle = idle_[conn.endpoint];
  if (static_cast<int>(idle.size()) < options_.connections_per_peer) {
    idle.push_back(std::move(conn));
  }  // else: closed by conn's destructor
}

size_t ConnectionPool::IdleCountForTest(const std::string& endpoint) const {
  absl::MutexLock lock(&mu_);
  auto it = idle_.find(endpoint);
  return it == idle_.end() ? 0 : it->second.size();
}

}  // namespace mc::transfer::tcp
