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

// Generations start at the wall clock (ms << 20), so a restarted master never reuses one.
uint64_t InitialGeneration() {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(now).count())
         << 20;
}

}  // namespace

// A client the master does not know is most often transient: the master restarted and the
// client has not re-registered yet (it does within a heartbeat). UNAVAILABLE, with a hint.
absl::Status UnknownClient(const std::string& client_id) {
  return McError(Code::kUnavailable,
                 absl::StrCat("unknown client '", client_id,
                              "' (the master restarted or dropped it; retry after the client "
                              "re-registers, within a heartbeat interval)"));
}

namespace {

// No SSD tier is this large (4 PiB); keeps the cluster's disk totals far from 2^64.
constexpr uint64_t kMaxDiskCapacity = 1ull << 52;

// The run's epoch: `configured`, or random and nonzero (CSPRNG, like sessions: two runs share
// one with probability 2^-32).
uint32_t PickEpoch(uint32_t configured) {
  while (configured == 0) configured = static_cast<uint32_t>(ClientRegistry::NewSession());
  return configured;
}

}  // namespace

MetadataService::MetadataService(MasterOptions options, const Clock& clock,
                                 MetricsRegistry& metrics)
    : options_(std::move(options)),
      epoch_(PickEpoch(options_.epoch)),
      clock_(clock),
      metrics_(metrics),
      table_(options_.shards),
      segments_(SegmentManagerOptions{
          .alignment = options_.alignment,
          .epoch = epoch_,
          .forget_queue_limit = options_.forget_queue_limit,
          .forget_dropped = &metrics.GetCounter(
              "mc_master_forget_dropped_total",
              "Freed ranges dropped from a client's forget queue past --forget_queue_limit (the "
              "owner's index keeps them, and a later report may restore them)"),
          .first_segment_counter = 1}),
      clients_(clock, options_.client_ttl_ms),
      evictor_(
          table_, segments_, clock, metrics, options_.eviction,
          [this](const std::string& id) { return DiskCapable(id); },
          options_.offload.task_timeout_ms),
      planner_(
          table_, segments_, offload_queue_,
          [this](const std::string& id) { return DiskCapable(id); }, clock, metrics,
          options_.offload),
      next_generation_(InitialGeneration()),
      leases_granted_(metrics.GetCounter("mc_leases_granted_total", "Read leases granted")),
      leases_expired_(
          metrics.GetCounter("mc_leases_expired_total", "Read leases that ended by expiry")),
      leases_released_(
          metrics.GetCounter("mc_leases_released_total", "Read leases released by readers")),
      puts_timed_out_(
          metrics.GetCounter("mc_puts_timed_out_total", "Pending puts revoked by put timeout")),
      clients_expired_(
          metrics.GetCounter("mc_clients_expired_total", "Clients dropped for missed heartbeats")),
      no_space_(metrics.GetCounter("mc_put_no_space_total", "Puts answered NO_SPACE")),
      write_back_waits_(metrics.GetCounter(
          "mc_put_write_back_waits_total",
          "PutStart items answered NO_SPACE with write_back_pending: memory is full of objects "
          "whose write-back to SSD has not ended (the client retries them)")),
      disk_reclaimed_lost_(metrics.GetCounter(
          "mc_objects_lost_total",
          "Acknowledged objects dropped with their last copy, by reason (every tier that could "
          "hold them was full, failing or absent)",
          {{"reason", "ssd_reclaimed"}})),
      offload_failures_(metrics.GetCounter(
          "mc_offload_failures_reported_total",
          "OFFLOAD tasks clients reported they could not persist (tier full or failing)")),
      corrupt_records_(metrics.GetCounter(
          "mc_disk_replicas_corrupt_total",
          "DISK replicas dropped because their record failed verification when read")),
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
      lease_releases_refused_(metrics.GetCounter(
          "mc_master_lease_releases_refused_total",
          "Lease releases that named another caller's lease (nothing released)")),
      disk_reports_refused_(metrics.GetCounter(
          "mc_master_disk_reports_refused_total",
          "Recovered DISK records refused because the master knows the key with another "
          "generation, length or checksum (the known object is kept)")),
      reported_restored_(metrics.GetCounter(
          "mc_master_objects_reported_total",
          "Objects clients reported holding (ReportObjects), by result: restored (the master "
          "knew no such key), joined (a replica added to the known object), refused",
          {{"result", "restored"}})),
      reported_joined_(metrics.GetCounter(
          "mc_master_objects_reported_total",
          "Objects clients reported holding (ReportObjects), by result: restored (the master "
          "knew no such key), joined (a replica added to the known object), refused",
          {{"result", "joined"}})),
      reported_refused_(metrics.GetCounter(
          "mc_master_objects_reported_total",
          "Objects clients reported holding (ReportObjects), by result: restored (the master "
          "knew no such key), joined (a replica added to the known object), refused",
          {{"result", "refused"}})),
      reported_conflicts_(metrics.GetCounter(
          "mc_master_report_conflicts_total",
          "Reports (ReportObjects) that differed from another owner's report of the same key: "
          "the key was dropped and is refused to further reports (docs/security.md)")),
      reports_timed_out_(metrics.GetCounter(
          "mc_master_object_reports_timed_out_total",
          "Object reports whose last chunk did not arrive within --object_report_timeout_ms "
          "(the client's segments were released for placement anyway)")),
      corrupt_memory_replicas_(metrics.GetCounter(
          "mc_replicas_dropped_total",
          "Replicas dropped because they failed verification when read, by tier and reason",
          {{"tier", "memory"}, {"reason", "corrupt"}})),
      corrupt_disk_replicas_(metrics.GetCounter(
          "mc_replicas_dropped_total",
          "Replicas dropped because they failed verification when read, by tier and reason",
          {{"tier", "disk"}, {"reason", "corrupt"}})),
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

bool MetadataService::DiskCapable(const std::string& client_id) const {
  std::optional<ClientInfo> info = clients_.Get(client_id);
  return info.has_value() && info->disk_capacity > 0;
}

uint64_t MetadataService::NextGeneration() {
  uint64_t g = next_generation_.load();
  // Never hands out 0 ("never reserved") nor anything at or past kGenerationLimit, and never
  // wraps: once exhausted, every call answers 0 and the put fails.
  while (g < kGenerationLimit && !next_generation_.compare_exchange_weak(g, g + 1)) {
  }
  return g < kGenerationLimit ? g : 0;
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
  if (will_report_objects) {
    absl::MutexLock lock(&report_mu_);
    reports_[info.client_id] = ReportState{.session = reg.session, .start_ms = clock_.NowMs()};
  }
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
  {
    absl::MutexLock lock(&report_mu_);
    reports_.erase(client_id);
  }
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
        DropPromotion(shard, object, &to_free);
      }
      // No replica left: a dead writer's put (all dropped above), or the last replica was on the
      // dead client. A pending put so lost is revoked: its writer's PutEnd answers NOT_FOUND, even
      // once the key is put again.
      if (object.replicas.empty()) {
        if (object.state == ObjectState::kPending) {
          pending_.Remove(object.put_start_ms() + options_.put_timeout_ms, object.generation);
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

absl::StatusOr<std::vector<MemoryLocation>> MetadataService::PlaceWithEviction(
    uint64_t size, uint32_t replicas, const std::string& writer, bool persisted_only, bool* final,
    bool* write_back_pending, const std::vector<std::string>& avoid) {
  auto placed = segments_.Place(size, replicas, writer, avoid);
  if (!placed.ok()) {
    // An object no segment (or too few clients' segments) can ever hold: evicting would empty
    // memory for nothing.
    // Clients whose segments are held while they report their objects: eviction cannot open
    // those, and the answer changes once the reports end (a retry, not a final NO_SPACE).
    bool wait_for_held = false;
    // Clients the writer asked to avoid (they refused it) count as absent: evicting others'
    // objects cannot make room on them.
    absl::Status possible = segments_.CouldEverPlace(size, replicas, &wait_for_held, avoid);
    if (!possible.ok()) {
      if (final != nullptr) *final = !wait_for_held;
      return possible;
    }
  }
  // Each round asks for twice the bytes of the previous one: LRU victims are scattered, so under
  // fragmentation freeing just `size` bytes per round may never open one range that fits.
  uint64_t ask = CheckedSum().AddProduct(size, replicas).ok() ? size * replicas : UINT64_MAX;
  uint64_t waiting = 0;
  for (int round = 0; !placed.ok() && round < options_.sync_eviction_rounds; ++round) {
    EvictResult r = evictor_.EvictBytes(ask, persisted_only);
    waiting = r.waiting_write_back;
    if (r.freed == 0) break;
    placed = segments_.Place(size, replicas, writer, avoid);
    if (ask <= (UINT64_MAX >> 1)) ask <<= 1;
  }
  if (!placed.ok() && waiting > 0 && !persisted_only) {
    // Memory is full of objects whose last copy may leave it only once written back: the writer
    // waits for the offloads (planned now, not at the next maintenance pass) and retries.
    if (write_back_pending != nullptr) *write_back_pending = true;
    KickPlanner();
    return McError(Code::kNoSpace,
                   absl::StrCat("memory is full: ", waiting,
                                " byte(s) wait for their write-back to an SSD tier before they "
                                "may leave memory; retry shortly"));
  }
  return placed;
}

std::vector<PutStartOutcome> MetadataService::PutStart(const std::string& client_id,
                                                       const std::vector<PutStartItem>& items,
                                                       uint32_t replicas,
                                                       const std::vector<std::string>& avoid) {
  std::vector<PutStartOutcome> out(items.size());
  if (replicas == 0) replicas = 1;
  bool known_client = clients_.IsAlive(client_id);
  std::vector<std::string_view> keys;
  for (size_t i = 0; i < items.size(); ++i) {
    keys.push_back(items[i].key);
    absl::Status& s = out[i].status;
    s = ValidateKey(items[i].key);
    if (!s.ok()) continue;
    if (!known_client) {
      s = UnknownClient(client_id);
    } else if (items[i].size == 0 || items[i].size > options_.max_object_size) {
      s = McError(Code::kInvalidArgument,
                  absl::StrCat("size ", items[i].size, " outside 1..", options_.max_object_size));
    } else if (replicas > options_.max_replicas) {
      s = McError(Code::kInvalidArgument,
                  absl::StrCat(replicas, " replicas exceed the limit of ", options_.max_replicas));
    }
  }
  // Every item of an unknown client failed above. Returning here also keeps a caller's made-up
  // client ids out of PeerNames, which interns only registered clients' pairs.
  if (!known_client) return out;
  // Phase 1: reserve each key as a PENDING object (ALREADY_EXISTS if stored or being stored).
  int64_t now = clock_.NowMs();
  const uint32_t writer = PeerNames::Instance().Intern(client_id, "");
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      if (!out[i].status.ok()) continue;
      std::string key(items[i].key);
      if (shard.objects.contains(key)) {
        out[i].status = McError(Code::kAlreadyExists, "key is stored or being stored");
        continue;
      }
      const uint64_t generation = NextGeneration();
      if (generation == 0) {
        out[i].status = McError(Code::kInternal,
                                "generation numbers exhausted (a recovered record carried one "
                                "near the limit); restart the master after removing it");
        continue;
      }
      Object object;
      object.size = items[i].size;
      object.generation = generation;
      object.writer = writer;
      shard.BeginPut(shard.Insert(key, std::move(object)), now, replicas);
      out[i].generation = generation;
      pending_.Add(now + options_.put_timeout_ms, out[i].generation, std::move(key));
    }
  });
  // Phase 2: place replicas with no shard lock held (eviction takes shard locks).
  std::vector<std::vector<MemoryLocation>> placed(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (!out[i].status.ok()) continue;
    auto p = PlaceWithEviction(items[i].size, replicas, client_id, /*persisted_only=*/false,
                               &out[i].no_space_final, &out[i].write_back_pending, avoid);
    if (p.ok()) {
      placed[i] = std::move(*p);
    } else {
      out[i].status = p.status();
      (out[i].write_back_pending ? write_back_waits_ : no_space_).Inc();
    }
  }
  // Phase 3: attach the replicas, or drop the reservation of a key that got none.
  std::vector<MemoryLocation> to_free;
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      if (out[i].generation == 0) continue;  // never reserved
      auto it = shard.objects.find(AsKey(items[i].key));
      bool ours = it != shard.objects.end() && it->second.generation == out[i].generation;
      if (!out[i].status.ok() || !ours) {
        if (ours) {
          pending_.Remove(now + options_.put_timeout_ms, out[i].generation);
          shard.Erase(it);
        }
        if (out[i].status.ok()) {
          out[i].status = McError(Code::kUnavailable, "put was revoked while being placed");
        }
        to_free.insert(to_free.end(), placed[i].begin(), placed[i].end());
        out[i].generation = 0;
        continue;
      }
      for (MemoryLocation& loc : placed[i]) {
        loc.generation = out[i].generation;
        Replica replica{ReplicaTier::kMemory, std::move(loc)};
        shard.AddReplica(it->second, StoredReplica::Of(replica));
        out[i].replicas.push_back(std::move(replica));
      }
    }
  });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

std::vector<absl::Status> MetadataService::PutEnd(const std::string& client_id,
                                                  const std::vector<PutEndItem>& items) {
  std::vector<MemoryLocation> to_free;
  std::vector<absl::Status> out =
      ForEachItem(items, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
        shard.mu.AssertHeld();
        auto it = shard.objects.find(AsKey(items[i].key));
        // Generations are never reused, so a put whose generation the key no longer holds is
        // gone: revoked (its replica's client died, or it timed out) and the key put again
        // since. Another writer's put is answered the same way, and neither answer tells the
        // key's current generation: a put is ended or revoked only by the client that started
        // it (PutRevoke answers the same).
        if (it == shard.objects.end() || it->second.generation != items[i].generation ||
            it->second.writer_client() != client_id) {
          return McError(Code::kNotFound,
                         "no pending put of this key and generation by this client (revoked "
                         "or timed out?)");
        }
        const Object& object = it->second;
        if (object.state == ObjectState::kComplete) {
          if (object.checksum != items[i].checksum) {
            return McError(Code::kInvalidArgument, "put already ended with another checksum");
          }
          return absl::OkStatus();
        }
        // A replica's holder was dropped while the put was pending (its replica went with it):
        // never answer OK for fewer replicas than asked. The put fails; the caller may retry.
        const size_t held = static_cast<size_t>(
            std::count_if(object.replicas.begin(), object.replicas.end(),
                          [](const StoredReplica& r) { return r.tier == ReplicaTier::kMemory; }));
        if (held < object.replicas_asked()) {
          pending_.Remove(object.put_start_ms() + options_.put_timeout_ms, object.generation);
          for (const StoredReplica& r : object.replicas) {
            if (r.tier == ReplicaTier::kMemory) to_free.push_back(r.location());
          }
          const uint32_t asked = object.replicas_asked();
          shard.Erase(it);
          return McError(
              Code::kUnavailable,
              absl::StrCat("only ", held, " of ", asked,
                           " replicas remain: a replica's client was lost during the put; "
                           "the put is revoked, retry it"));
        }
        pending_.Remove(object.put_start_ms() + options_.put_timeout_ms, object.generation);
        shard.CompletePut(object, items[i].checksum);
        ForgetDisputed(items[i].key);  // a put of this run vouches for the key again
        return absl::OkStatus();
      });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

std::vector<absl::Status> MetadataService::PutRevoke(const std::string& client_id,
                                                     const std::vector<PutRevokeItem>& items) {
  std::vector<MemoryLocation> to_free;
  std::vector<absl::Status> out =
      ForEachItem(items, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
        shard.mu.AssertHeld();
        auto it = shard.objects.find(AsKey(items[i].key));
        if (it == shard.objects.end() || it->second.generation != items[i].generation ||
            it->second.writer_client() != client_id) {
          return McError(Code::kNotFound, "no pending put of this generation by this client");
        }
        const Object& object = it->second;
        if (object.state != ObjectState::kPending) {
          return McError(Code::kInvalidArgument, "the put has ended: remove the key instead");
        }
        for (const StoredReplica& r : object.replicas) {
          if (r.tier == ReplicaTier::kMemory) to_free.push_back(r.location());
        }
        pending_.Remove(object.put_start_ms() + options_.put_timeout_ms, object.generation);
        shard.Erase(it);
        return absl::OkStatus();
      });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

void MetadataService::RevokeTimedOutPuts() {
  std::vector<PendingPuts::Entry> expired = pending_.TakeExpired(clock_.NowMs());
  std::vector<MemoryLocation> to_free;
  for (const auto& entry : expired) {
    ObjectTable::Shard& shard = table_.ShardOf(entry.key);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.objects.find(entry.key);
    if (it == shard.objects.end() || it->second.generation != entry.generation) continue;
    if (it->second.state == ObjectState::kComplete) {
      if (it->second.promotion()) {
        Log().warn("promotion of {} (generation {}) by client {} timed out; revoked",
                   KeyForLog(entry.key), entry.generation, it->second.promotion()->writer);
        DropPromotion(shard, it->second, &to_free);
        puts_timed_out_.Inc();
      }
      continue;
    }
    for (const StoredReplica& r : it->second.replicas) {
      if (r.tier == ReplicaTier::kMemory) to_free.push_back(r.location());
    }
    Log().warn("put of {} (generation {}) by client {} timed out after {} ms; revoked",
               KeyForLog(entry.key), entry.generation, it->second.writer_client(),
               options_.put_timeout_ms);
    shard.Erase(it);
    puts_timed_out_.Inc();
  }
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
}

void MetadataService::DropPromotion(ObjectTable::Shard& shard, const Object& object,
                                    std::vector<MemoryLocation>* to_free) {
  const Object::Promotion* promotion = object.promotion();
  if (promotion == nullptr) return;
  if (promotion->location.length > 0) {
    to_free->push_back(promotion->location);
    pending_.Remove(promotion->start_ms + options_.put_timeout_ms, object.generation);
  }
  shard.EndPromotion(object);
}

void MetadataService::KickPlanner() {
  // At most one extra pass per millisecond, whatever the number of waiting puts.
  int64_t now = clock_.NowMs();
  int64_t last = last_kick_ms_.load();
  if (now == last || !last_kick_ms_.compare_exchange_strong(last, now)) return;
  planner_.Plan();
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
  ReleaseTimedOutReports();
  RevokeTimedOutPuts();
  SweepLeases();
  FreeDeferred();
  planner_.Plan();
  evictor_.EvictToWatermark();
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
  snap.lost_ssd_reclaimed = disk_reclaimed_lost_.Value();
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
