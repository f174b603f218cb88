// Client lifecycle, the put lifecycle and maintenance. Lookups, leases, removal and DISK
// replicas are in metadata_service_read.cc.
#include "master/metadata_service.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/checked_math.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/util.h"

namespace mc::master {
namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("master");
  return log;
}

// No SSD tier is this large (4 PiB); keeps the cluster's disk totals far from 2^64.
constexpr uint64_t kMaxDiskCapacity = 1ull << 52;

}  // namespace

MetadataService::MetadataService(MasterOptions options, const Clock& clock,
                                 MetricsRegistry& metrics)
    : tables_(std::move(options), clock, metrics),
      options_(tables_.options),
      epoch_(tables_.epoch),
      clock_(tables_.clock),
      table_(tables_.table),
      segments_(tables_.segments),
      clients_(tables_.clients),
      evictor_(tables_.evictor),
      offload_queue_(tables_.offload_queue),
      planner_(tables_.planner),
      membership_mu_(tables_.membership_mu),
      puts_(tables_, disputed_, [this] { tiering_.KickPlanner(); }),
      reads_(tables_, puts_),
      tiering_(tables_, puts_),
      reports_(tables_, puts_, disputed_),
      clients_expired_(
          metrics.GetCounter("mc_clients_expired_total", "Clients dropped for missed heartbeats")),
      corrupt_lost_(metrics.GetCounter(
          "mc_objects_lost_total",
          "Acknowledged objects dropped with their last copy, by reason (every tier that could "
          "hold them was full, failing or absent)",
          {{"reason", "corrupt"}})),
      registrations_refused_(metrics.GetCounter(
          "mc_master_registrations_refused_total",
          "Registrations refused: their client id has a live session that they did not prove "
          "to be theirs (client_takeover_after_ms not yet passed), or the master's table of "
          "(client id, data endpoint) pairs is full")),
      corrupt_memory_replicas_(metrics.GetCounter(
          "mc_replicas_dropped_total",
          "Replicas dropped because they failed verification when read, by tier and reason",
          {{"tier", "memory"}, {"reason", "corrupt"}})),
      unreachable_dropped_(metrics.GetCounter(
          "mc_master_clients_dropped_total",
          "Clients dropped before their heartbeat TTL because a reader found them unreachable "
          "and the master confirmed they are gone",
          {{"reason", "unreachable"}})),
      fault_reports_refused_(metrics.GetCounter(
          "mc_master_fault_reports_refused_total",
          "Replica fault reports not acted on: no lease held on the object, or the holder still "
          "heartbeats")) {
  metrics
      .GetGauge("mc_master_epoch",
                "This master run's epoch (the high 32 bits of every segment id it assigns)")
      .Set(epoch_);
  Log().info("master epoch {:08x} (segment ids {:08x}00000001 and up)", epoch_, epoch_);
}

absl::StatusOr<Registration> MetadataService::RegisterClient(
    const ClientInfo& info, const std::vector<uint64_t>& segment_sizes,
    const RegistrationAuth& auth, bool will_report_objects) {
  if (info.client_id.empty()) return McError(Code::kInvalidArgument, "empty client id");
  if (segment_sizes.size() > options_.max_segments_per_client) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat(segment_sizes.size(), " segments exceed the limit of ",
                                options_.max_segments_per_client, " per client"));
  }
  const uint64_t min_size = std::max(options_.min_segment_size, options_.alignment);
  CheckedSum client_capacity;
  for (uint64_t size : segment_sizes) {
    if (size < min_size || size > options_.max_segment_size) {
      return McError(Code::kInvalidArgument, absl::StrCat("segment of ", size, " bytes outside ",
                                                          min_size, "..", options_.max_segment_size,
                                                          " (--min_segment_size, "
                                                          "--max_segment_size)"));
    }
    client_capacity.Add(size);
  }
  if (info.disk_capacity > kMaxDiskCapacity || info.disk_used > kMaxDiskCapacity) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("disk capacity ", info.disk_capacity, " / used ", info.disk_used,
                                " bytes above the limit of ", kMaxDiskCapacity));
  }
  if (!segment_sizes.empty() && info.endpoint.empty()) {
    return McError(Code::kInvalidArgument, "a client with segments needs a data endpoint");
  }
  bool replaced = false;
  absl::MutexLock membership(&membership_mu_);
  std::optional<ClientInfo> live = clients_.Get(info.client_id);
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

bool MetadataService::Heartbeat(const std::string& client_id, uint64_t session, uint64_t disk_used,
                                std::vector<ReplicaRef>* forgotten, bool* more_forgotten) {
  if (!clients_.Heartbeat(client_id, session, disk_used)) return false;
  // A registration between the check and the take would hand the new session's first forgotten
  // ranges to the old one, whose daemon is gone: they name segments the new one never knew.
  if (forgotten != nullptr) {
    *forgotten = segments_.TakeForgotten(client_id, options_.forget_batch, more_forgotten);
  }
  return true;
}

absl::Status MetadataService::UnregisterClient(const std::string& client_id, uint64_t session) {
  absl::MutexLock membership(&membership_mu_);
  if (!clients_.Unregister(client_id, session)) {
    return McError(Code::kNotFound, absl::StrCat("unknown client session ", client_id));
  }
  CleanupClient(client_id);
  Log().info("client {} unregistered", client_id);
  return absl::OkStatus();
}

void MetadataService::CleanupClient(const std::string& client_id) {
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

std::vector<PutStartOutcome> MetadataService::PutStart(const std::string& client_id,
                                                       const std::vector<PutStartItem>& items,
                                                       uint32_t replicas,
                                                       const std::vector<std::string>& avoid) {
  return puts_.PutStart(client_id, items, replicas, avoid);
}

std::vector<absl::Status> MetadataService::PutEnd(const std::string& client_id,
                                                  const std::vector<PutEndItem>& items) {
  return puts_.PutEnd(client_id, items);
}

std::vector<absl::Status> MetadataService::PutRevoke(const std::string& client_id,
                                                     const std::vector<PutRevokeItem>& items) {
  return puts_.PutRevoke(client_id, items);
}

void MetadataService::RunMaintenance() {
  {
    absl::MutexLock membership(&membership_mu_);
    for (const ClientInfo& dead : clients_.TakeExpired()) {
      Log().warn("client {} missed heartbeats for {} ms; dropping it", dead.client_id,
                 options_.client_ttl_ms);
      clients_expired_.Inc();
      CleanupClient(dead.client_id);
    }
  }
  reports_.ReleaseTimedOutReports();
  puts_.RevokeTimedOutPuts();
  reads_.SweepLeases();
  FreeDeferred();
  tiering_.RunMaintenance();
}

size_t MetadataService::KeyCount() {
  size_t n = 0;
  table_.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    n += shard.objects.size();
  });
  return n;
}

size_t MetadataService::TransientCountForTest() {
  size_t n = 0;
  table_.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    for (auto it = shard.objects.begin(); it != shard.objects.end(); ++it) {
      n += it->second.has_transient() ? 1 : 0;
    }
  });
  return n;
}

MasterSnapshot MetadataService::Snapshot() {
  MasterSnapshot snap;
  SegmentStats seg = segments_.Stats();
  snap.mem_used = seg.used;
  snap.mem_capacity = seg.capacity;
  snap.keys = KeyCount();
  snap.clients = clients_.Count();
  snap.disk_used = clients_.DiskUsed();
  snap.disk_capacity = clients_.DiskCapacity();
  snap.eviction = evictor_.Stats();
  snap.lost_ssd_reclaimed = tiering_.LostSsdReclaimed();
  return snap;
}

std::string MetadataService::StatusLine() {
  MasterSnapshot s = Snapshot();
  double pct = s.mem_capacity == 0 ? 0.0 : 100.0 * s.mem_used / s.mem_capacity;
  return absl::StrFormat(
      "Mem Storage: %s / %s (%.1f%%) | Keys: %d | Clients: %d | Eviction: "
      "Success/Attempts=%d/%d | SSD Storage: %s / %s | Lost: %d (evicted unpersisted %d, SSD "
      "reclaimed %d) | Epoch: %08x",
      FormatBytes(s.mem_used), FormatBytes(s.mem_capacity), pct, s.keys, s.clients,
      s.eviction.successes, s.eviction.attempts, FormatBytes(s.disk_used),
      FormatBytes(s.disk_capacity), s.eviction.evicted_unpersisted + s.lost_ssd_reclaimed,
      s.eviction.evicted_unpersisted, s.lost_ssd_reclaimed, epoch_);
}

}  // namespace mc::master
