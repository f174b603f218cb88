// ClientRegistry: which mc-client daemons are alive, by heartbeat.
//
// A client registers (id, host, data endpoint) and receives a session: a random 64-bit number
// that changes on every registration, and a random 128-bit token, the bearer credential of its
// later calls (docs/security.md). Heartbeats name the session, so a heartbeat from a
// forgotten or replaced session answers "unknown" and the client registers again. SessionOf()
// maps a presented token to its session in constant time. TakeExpired() removes and returns the
// clients silent for longer than the TTL; cleaning up what they owned is the caller's job.
// Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace mc::master {

struct ClientInfo {
  std::string client_id;
  std::string host;
  std::string endpoint;
  uint64_t session = 0;
  std::string token;  // kSessionTokenSize random bytes; never leaves the master but to its owner
  uint64_t disk_capacity = 0;
  uint64_t disk_used = 0;
  int64_t last_heartbeat_ms = 0;
  int64_t registered_ms = 0;
};

class ClientRegistry {
 public:
  ClientRegistry(const Clock& clock, int64_t ttl_ms) : clock_(clock), ttl_ms_(ttl_ms) {}

  // Registers or replaces the client; returns its new entry (session and token set). `replaced`
  // tells whether a previous session of the same id existed (its state must then be dropped by
  // the caller).
  ClientInfo Register(const ClientInfo& info, bool* replaced);
  // The session whose token is `token`, if `client_id` has a live one. Constant time in the
  // token bytes.
  std::optional<uint64_t> SessionOf(const std::string& client_id, std::string_view token) const;
  // False when the (id, session) pair is unknown.
  bool Heartbeat(const std::string& client_id, uint64_t session, uint64_t disk_used);
  bool Unregister(const std::string& client_id, uint64_t session);
  bool IsAlive(const std::string& client_id) const;
  std::optional<ClientInfo> Get(const std::string& client_id) const;
  std::vector<ClientInfo> List() const;
  size_t Count() const;
  uint64_t DiskCapacity() const;
  uint64_t DiskUsed() const;

  // Removes and returns the clients whose last heartbeat is older than the TTL.
  std::vector<ClientInfo> TakeExpired();
  // Removes and returns `client_id` if it is certainly gone although its TTL has not passed:
  // silent for `silent_ms` or longer, or its data endpoint registered since by another client
  // (a daemon restarted under a new id on the same address). nullopt otherwise (unknown, or
  // still heartbeating).
  std::optional<ClientInfo> TakeIfGone(const std::string& client_id, int64_t silent_ms);

  int64_t ttl_ms() const { return ttl_ms_; }

  // A random session number, never 0 (CSPRNG: not guessable, and a restarted master reissues
  // an old one with probability 2^-64).
  static uint64_t NewSession();

 private:
  const Clock& clock_;
  const int64_t ttl_ms_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, ClientInfo> clients_ ABSL_GUARDED_BY(mu_);

};

}  // namespace mc::master
