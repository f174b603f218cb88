// Client registration, liveness, unregistration and the cleanup of a dropped client.
#include "master/client_lifecycle.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "master/peer_names.h"

namespace mc::master {
namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("master");
  return log;
}

// No SSD tier is this large (4 PiB); keeps the cluster's disk totals far from 2^64.
constexpr uint64_t kMaxDiskCapacity = 1ull << 52;

}  // namespace

ClientLifecycle::ClientLifecycle(MasterTables& tables, PutCoordinator& puts, ObjectReports& reports)
    : options_(tables.options),
      epoch_(tables.epoch),
      clock_(tables.clock),
      table_(tables.table),
      segments_(tables.segments),
      clients_(tables.clients),
      offload_queue_(tables.offload_queue),
      membership_mu_(tables.membership_mu),
      puts_(puts),
      reports_(reports),
      clients_expired_(tables.metrics.GetCounter("mc_clients_expired_total",
                                                 "Clients dropped for missed heartbeats")),
      registrations_refused_(tables.metrics.GetCounter(
          "mc_master_registrations_refused_total",
          "Registrations refused: their client id has a live session that they did not prove "
          "to be theirs (client_takeover_after_ms not yet passed), or the master's table of "
          "(client id, data endpoint) pairs is full")),
      unreachable_dropped_(tables.metrics.GetCounter(
          "mc_master_clients_dropped_total",
          "Clients dropped before their heartbeat TTL because a reader found them unreachable "
          "and the master confirmed they are gone",
          {{"reason", "unreachable"}})) {}

absl::StatusOr<Registration> ClientLifecycle::RegisterClient(
    const ClientInfo& info, const std::vector<uint64_t>& segment_sizes,
    const RegistrationAuth& auth, bool will_report_objects) {
  CheckedSum client_capacity;
  MC_RETURN_IF_ERROR(CheckRegistration(info, segment_sizes, &client_capacity));
  bool replaced = false;
  absl::MutexLock membership(&membership_mu_);
  std::optional<ClientInfo> live = clients_.Get(info.client_id);
  MC_RETURN_IF_ERROR(CheckTakeover(info, auth, live));
  MC_RETURN_IF_ERROR(InternPeerNames(info));
  if (live) CleanupClient(info.client_id);
  // Registrations are serialized by membership_mu_, so the total cannot change under us.
  CheckedSum total(segments_.Stats().capacity);
  total.Add(client_capacity.value());
  if (!client_capacity.ok() || !total.ok()) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("client ", info.client_id,
                                "'s segments would overflow the cluster's capacity total"));
  }
  // The segments first: a registration that would exhaust this run's segment ids is refused
  // with nothing changed (its previous session, if any, is gone already, as on any re-register).
  absl::StatusOr<std::vector<uint64_t>> ids = segments_.AddClientSegments(
      info.client_id, info.endpoint, segment_sizes, will_report_objects);
  if (!ids.ok()) {
    Log().error("registration of client {} refused: {}", info.client_id, ids.status().ToString());
    return ids.status();
  }
  Registration reg;
  ClientInfo entry = clients_.Register(info, &replaced);
  reg.session = entry.session;
  reg.token = std::move(entry.token);
  reg.epoch = epoch_;
  reg.segment_ids = std::move(*ids);
  if (will_report_objects) reports_.BeginReport(info.client_id, reg.session);
  Log().info("client {} registered (host {}, data {}, {} segment(s), session {}{}{})",
             info.client_id, info.host, info.endpoint, segment_sizes.size(), reg.session,
             replaced ? ", replacing its previous session" : "",
             will_report_objects ? ", segments held until it reports its objects" : "");
  return reg;
}

absl::Status ClientLifecycle::CheckRegistration(const ClientInfo& info,
                                                const std::vector<uint64_t>& segment_sizes,
                                                CheckedSum* capacity) const {
  if (info.client_id.empty()) return McError(Code::kInvalidArgument, "empty client id");
  if (segment_sizes.size() > options_.max_segments_per_client) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat(segment_sizes.size(), " segments exceed the limit of ",
                                options_.max_segments_per_client, " per client"));
  }
  const uint64_t min_size = std::max(options_.min_segment_size, options_.alignment);
  for (uint64_t size : segment_sizes) {
    if (size < min_size || size > options_.max_segment_size) {
      return McError(Code::kInvalidArgument, absl::StrCat("segment of ", size, " bytes outside ",
                                                          min_size, "..", options_.max_segment_size,
                                                          " (--min_segment_size, "
                                                          "--max_segment_size)"));
    }
    capacity->Add(size);
  }
  if (info.disk_capacity > kMaxDiskCapacity || info.disk_used > kMaxDiskCapacity) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("disk capacity ", info.disk_capacity, " / used ", info.disk_used,
                                " bytes above the limit of ", kMaxDiskCapacity));
  }
  if (!segment_sizes.empty() && info.endpoint.empty()) {
    return McError(Code::kInvalidArgument, "a client with segments needs a data endpoint");
  }
  return absl::OkStatus();
}

absl::Status ClientLifecycle::CheckTakeover(const ClientInfo& info, const RegistrationAuth& auth,
                                            const std::optional<ClientInfo>& live) {
  if (live && auth.bound && !auth::ConstantTimeEqual(auth.previous_token, live->token)) {
    // Registrations are serialized here, so the session checked is the one replaced below.
    const int64_t silent_ms = clock_.NowMs() - live->last_heartbeat_ms;
    if (silent_ms < options_.client_takeover_after_ms) {
      registrations_refused_.Inc();
      MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
                   "registration of client {} refused: a live session holds the id (last "
                   "heartbeat {} ms ago); allowed once it is silent for {} ms",
                   info.client_id, silent_ms, options_.client_takeover_after_ms);
      return McError(Code::kUnavailable,
                     absl::StrCat("client id '", info.client_id,
                                  "' is held by a live session (last heartbeat ", silent_ms,
                                  " ms ago); a new daemon with this id may register once that "
                                  "session has been silent for ",
                                  options_.client_takeover_after_ms, " ms: retry"));
    }
    Log().warn("client {}: a new registration takes over its session, silent for {} ms",
               info.client_id, silent_ms);
  }
  return absl::OkStatus();
}

absl::Status ClientLifecycle::InternPeerNames(const ClientInfo& info) {
  // Its replicas and its puts name it by index (PeerNames): a full table refuses the
  // registration here, with nothing changed, rather than failing inside a later put.
  for (const std::string_view endpoint : {std::string_view(info.endpoint), std::string_view()}) {
    if (absl::StatusOr<uint32_t> peer = PeerNames::Instance().TryIntern(info.client_id, endpoint);
        !peer.ok()) {
      registrations_refused_.Inc();
      Log().error("registration of client {} refused: {}", info.client_id,
                  peer.status().ToString());
      return peer.status();
    }
  }
  return absl::OkStatus();
}

bool ClientLifecycle::Heartbeat(const std::string& client_id, uint64_t session, uint64_t disk_used,
                                std::vector<ReplicaRef>* forgotten, bool* more_forgotten) {
  if (!clients_.Heartbeat(client_id, session, disk_used)) return false;
  // A registration between the check and the take would hand the new session's first forgotten
  // ranges to the old one, whose daemon is gone: they name segments the new one never knew.
  if (forgotten != nullptr) {
    *forgotten = segments_.TakeForgotten(client_id, options_.forget_batch, more_forgotten);
  }
  return true;
}

absl::Status ClientLifecycle::UnregisterClient(const std::string& client_id, uint64_t session) {
  absl::MutexLock membership(&membership_mu_);
  if (!clients_.Unregister(client_id, session)) {
    return McError(Code::kNotFound, absl::StrCat("unknown client session ", client_id));
  }
  CleanupClient(client_id);
  Log().info("client {} unregistered", client_id);
  return absl::OkStatus();
}

absl::Status ClientLifecycle::DropUnreachable(const std::string& reporter,
                                              const std::string& holder) {
  if (holder.empty() || holder == reporter) {
    return McError(Code::kInvalidArgument, "an unreachable holder names another client");
  }
  absl::MutexLock membership(&membership_mu_);
  if (!clients_.IsAlive(holder)) return McError(Code::kNotFound, "no such client (dropped)");
  // Two and a half heartbeat intervals of silence (one lost heartbeat is no proof), or its
  // endpoint taken by a newer registration.
  const int64_t silent_ms = options_.heartbeat_interval_ms * 5 / 2;
  std::optional<ClientInfo> gone = clients_.TakeIfGone(holder, silent_ms);
  if (!gone) {
    return McError(Code::kNotReady,
                   absl::StrCat("client ", holder, " still heartbeats: not dropped"));
  }
  Log().warn("client {} reported unreachable by {} and silent (or replaced): dropping it", holder,
             reporter);
  unreachable_dropped_.Inc();
  CleanupClient(holder);
  return absl::OkStatus();
}

void ClientLifecycle::CleanupClient(const std::string& client_id) {
  segments_.RemoveClient(client_id);  // its ranges need no Free: the segments are gone
  reports_.DropReport(client_id);
  offload_queue_.DropClient(client_id);
  std::vector<MemoryLocation> to_free;
  size_t objects_lost = 0;
  size_t puts_revoked = 0;
  table_.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    for (auto it = shard.objects.begin(); it != shard.objects.end();) {
      const Object& object = it->second;
      bool dead_writer =
          object.state == ObjectState::kPending && object.writer_client() == client_id;
      shard.RemoveReplicas(object, [&](const StoredReplica& r) {
        if (r.client_id() == client_id) return true;
        if (dead_writer && r.tier == ReplicaTier::kMemory) to_free.push_back(r.location());
        return dead_writer;
      });
      const Object::Promotion* promotion = object.promotion();
      if (promotion && (promotion->writer == client_id || object.replicas.empty() ||
                        promotion->location.client_id == client_id)) {
        puts_.DropPromotion(shard, object, &to_free);
      }
      // No replica left: a dead writer's put (all dropped above), or the last replica was on the
      // dead client. A pending put so lost is revoked: its writer's PutEnd answers NOT_FOUND, even
      // once the key is put again.
      if (object.replicas.empty()) {
        if (object.state == ObjectState::kPending) {
          puts_.ForgetPending(object);
          ++puts_revoked;
        } else {
          ++objects_lost;
        }
        shard.Erase(it++);
      } else {
        ++it;
      }
    }
  });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  Log().warn("client {} dropped: {} object(s) lost their last replica, {} pending put(s) revoked",
             client_id, objects_lost, puts_revoked);
}

void ClientLifecycle::ExpireClients() {
  absl::MutexLock membership(&membership_mu_);
  for (const ClientInfo& dead : clients_.TakeExpired()) {
    Log().warn("client {} missed heartbeats for {} ms; dropping it", dead.client_id,
               options_.client_ttl_ms);
    clients_expired_.Inc();
    CleanupClient(dead.client_id);
  }
}

}  // namespace mc::master
