#include "master/client_registry.h"

#include <chrono>

#include "common/auth.h"
#include "common/checked_math.h"
#include "common/master_credentials.h"

namespace mc::master {

uint64_t ClientRegistry::NewSession() {
  uint64_t session = 0;
  while (session == 0) session = auth::RandomU64();
  return session;
}

ClientInfo ClientRegistry::Register(const ClientInfo& info, bool* replaced) {
  ClientInfo entry = info;
  entry.token = auth::RandomBytes(auth::kSessionTokenSize);
  absl::MutexLock lock(&mu_);
  auto old = clients_.find(entry.client_id);
  do {  // a new number, also unlike the session it replaces
    entry.session = NewSession();
  } while (old != clients_.end() && old->second.session == entry.session);
  entry.last_heartbeat_ms = clock_.NowMs();
  entry.registered_ms = entry.last_heartbeat_ms;
  auto [it, inserted] = clients_.insert_or_assign(entry.client_id, entry);
  (void)it;
  if (replaced != nullptr) *replaced = !inserted;
  return entry;
}

std::optional<uint64_t> ClientRegistry::SessionOf(const std::string& client_id,
                                                  std::string_view token) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end() || !auth::ConstantTimeEqual(it->second.token, token)) {
    return std::nullopt;
  }
  return it->second.session;
}

bool ClientRegistry::Heartbeat(const std::string& client_id, uint64_t session,
                               uint64_t disk_used) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end() || it->second.session != session) return false;
  it->second.last_heartbeat_ms = clock_.NowMs();
  it->second.disk_used = disk_used;
  return true;
}

bool ClientRegistry::Unregister(const std::string& client_id, uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end() || it->second.session != session) return false;
  clients_.erase(it);
  return true;
}

bool ClientRegistry::IsAlive(const std::string& client_id) const {
  absl::MutexLock lock(&mu_);
  return clients_.contains(client_id);
}

std::optional<ClientInfo> ClientRegistry::Get(const std::string& client_id) const {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) return std::nullopt;
  return it->second;
}

std::vector<ClientInfo> ClientRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<ClientInfo> out;
  for (const auto& [id, info] : clients_) out.push_back(info);
  return out;
}

size_t ClientRegistry::Count() const {
  absl::MutexLock lock(&mu_);
  return clients_.size();
}

uint64_t ClientRegistry::DiskCapacity() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [id, info] : clients_) total = SaturatingAdd(total, info.disk_capacity);
  return total;
}

uint64_t ClientRegistry::DiskUsed() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [id, info] : clients_) total = SaturatingAdd(total, info.disk_used);
  return total;
}

std::vector<ClientInfo> ClientRegistry::TakeExpired() {
  absl::MutexLock lock(&mu_);
  int64_t now = clock_.NowMs();
  std::vector<ClientInfo> expired;
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (now - it->second.last_heartbeat_ms > ttl_ms_) {
      expired.push_back(it->second);
      clients_.erase(it++);
    } else {
      ++it;
    }
  }
  return expired;
}

std::optional<ClientInfo> ClientRegistry::TakeIfGone(const std::string& client_id,
                                                     int64_t silent_ms) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) return std::nullopt;
  const ClientInfo& holder = it->second;
  bool gone = clock_.NowMs() - holder.last_heartbeat_ms >= silent_ms;
  for (const auto& [id, other] : clients_) {
    if (gone) break;
    gone = id != client_id && !holder.endpoint.empty() && other.endpoint == holder.endpoint &&
           other.registered_ms >= holder.registered_ms;
  }
  if (!gone) return std::nullopt;
  ClientInfo taken = std::move(it->second);
  clients_.erase(it);
  return taken;
}

}  // namespace mc::master
