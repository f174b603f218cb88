// Store service access control: who may call the Store service, and as whom.
//
// Two ways in. The Unix socket (and its fd side channel) is authorized by the socket file's mode
// and group (--unix_socket_mode, --unix_socket_group): whoever can connect may call. The TCP
// listener (--listen) needs the shared token of --store_token_file in each call's metadata
// (`authorization: Bearer <token>` or `x-mc-store-token: <token>`), compared in constant time,
// unless --store_tcp_auth=false. A refused call answers UNAUTHENTICATED and is counted in
// mc_store_auth_failures_total{reason}.
//
// The caller's identity ("owner") for buffers, leases and per-caller limits is its session token
// (`x-mc-owner` metadata, handed out by the fd side channel, see client/buffers/fd_channel.h);
// without one, the anonymous bucket of its transport ("anon:unix", or "anon:<ip>" over TCP). A
// token that names no live session is refused (session lost: the daemon restarted). This file also
// holds the small helpers for the socket file's mode and group, and for tokens. Thread-safe.
#pragma once

#include <sys/types.h>
#include <sys/un.h>

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace mc::client {

// 32 hex digits from getrandom(2): 128 bits nobody can guess.
absl::StatusOr<std::string> RandomHexToken();

// True when a == b, in time that depends on their lengths only.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The token in `path`: the file must be a regular file that neither group nor others may read
// or write, and hold at least kMinStoreTokenLength characters once surrounding whitespace is
// trimmed. Errors name the file and what is wrong.
inline constexpr size_t kMinStoreTokenLength = 32;
absl::StatusOr<std::string> LoadStoreToken(const std::string& path);

// "0660", "660", "0o660" -> 0660; at most 0777, no setuid/sticky bits.
absl::StatusOr<mode_t> ParseSocketMode(std::string_view text);
// A group name, or a decimal gid; it must exist.
absl::StatusOr<gid_t> ParseGroup(std::string_view text);
// chmod(path, mode) and, with a group, chown(path, -1, group): for a socket just bound.
absl::Status ApplySocketPermissions(const std::string& path, mode_t mode,
                                    std::optional<gid_t> group);
// Binds `fd` (a Unix socket) to `addr`, replacing a stale socket file, with nobody able to
// connect before `mode` and `group` are applied (umask 0177 around bind), then listens.
absl::Status BindPrivateSocket(int fd, const sockaddr_un& addr, mode_t mode,
                               std::optional<gid_t> group);

// Whether an owner token names a live session (the fd side channel answers), and the account
// its resources count against: every session of one uid shares one account ("uid:N"), so a
// caller cannot multiply its share by opening sessions. An owner that is no session (the
// anonymous buckets) is its own account.
class CallerSessions {
 public:
  virtual ~CallerSessions() = default;
  virtual bool IsLive(std::string_view owner) const = 0;
  virtual std::string AccountOf(std::string_view owner) const { return std::string(owner); }
  // The peer uid (SO_PEERCRED) of a live session; none when the owner is no live session (or
  // nothing knows the uid). The fast channel's ATTACH requires it to equal its own peer's uid.
  virtual std::optional<uid_t> UidOf(std::string_view owner) const {
    (void)owner;
    return std::nullopt;
  }
};

struct StoreAuthOptions {
  std::string token;     // required over TCP unless tcp_auth is false; empty = none set
  bool tcp_auth = true;  // --store_tcp_auth
};

class StoreAuth {
 public:
  // `metrics` is borrowed and must outlive this object.
  StoreAuth(StoreAuthOptions options, MetricsRegistry& metrics);

  // peer: grpc::ServerContext::peer() ("unix:..." over the Unix socket, "ipv4:..." over TCP).
  // The token headers as received (empty when absent). UNAUTHENTICATED (counted) when refused.
  absl::Status Check(std::string_view peer, std::string_view authorization,
                     std::string_view store_token_header) const;

  // The caller's owner key: `owner_header` when `sessions` says it is live; the anonymous bucket
  // of `peer` when there is no header (or nothing to check it against). A header that names no
  // live session is FAILED_PRECONDITION, its message starting with kSessionLost: the daemon
  // restarted, or the session ended, so the buffer ids and leases the caller holds mean nothing
  // here (it must open a new fd session and register its buffers again). Silently treating it
  // as anonymous turned every later call into per-item INVALID_ARGUMENT storms.
  static constexpr std::string_view kSessionLost = "session lost:";
  static absl::StatusOr<std::string> OwnerOf(std::string_view peer, std::string_view owner_header,
                                             const CallerSessions* sessions);
  static bool OverUnixSocket(std::string_view peer);

 private:
  void CountFailure(const char* reason) const;

  const StoreAuthOptions options_;
  MetricsRegistry& metrics_;
};

}  // namespace mc::client
