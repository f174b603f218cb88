// The put lifecycle (PutStart -> PutEnd | PutRevoke | timeout) and promotion.
#include "master/put_coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/logging.h"
#include "common/status.h"
#include "master/peer_names.h"

namespace mc::master {
namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("master");
  return log;
}

// Queues the memory replicas of `object` in `to_free` (freed once no shard lock is held).
void QueueMemoryReplicas(const Object& object, std::vector<MemoryLocation>* to_free) {
  for (const StoredReplica& r : object.replicas) {
    if (r.tier == ReplicaTier::kMemory) to_free->push_back(r.location());
  }
}

// The object of `key` at `generation` whose put `client_id` started, or end(). Generations are
// never reused, so a put whose generation the key no longer holds is gone: revoked (its
// replica's client died, or it timed out) and the key put again since. Another writer's put is
// answered the same way, and neither answer tells the key's current generation: a put is ended
// or revoked only by the client that started it.
ObjectMap::iterator FindOwnPut(ObjectTable::Shard& shard, std::string_view key, uint64_t generation,
                               const std::string& client_id)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) {
  auto it = shard.objects.find(AsKey(key));
  if (it == shard.objects.end() || it->second.generation != generation ||
      it->second.writer_client() != client_id) {
    return shard.objects.end();
  }
  return it;
}

}  // namespace

PutCoordinator::PutCoordinator(MasterTables& tables, DisputedKeys& disputed,
                               std::function<void()> kick_planner)
    : options_(tables.options),
      clock_(tables.clock),
      table_(tables.table),
      segments_(tables.segments),
      clients_(tables.clients),
      evictor_(tables.evictor),
      disputed_(disputed),
      kick_planner_(std::move(kick_planner)),
      puts_timed_out_(tables.metrics.GetCounter("mc_puts_timed_out_total",
                                                "Pending puts revoked by put timeout")),
      no_space_(tables.metrics.GetCounter("mc_put_no_space_total", "Puts answered NO_SPACE")),
      write_back_waits_(tables.metrics.GetCounter(
          "mc_put_write_back_waits_total",
          "PutStart items answered NO_SPACE with write_back_pending: memory is full of objects "
          "whose write-back to SSD has not ended (the client retries them)")) {}

absl::StatusOr<std::vector<MemoryLocation>> PutCoordinator::PlaceWithEviction(
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
    kick_planner_();
    return McError(Code::kNoSpace,
                   absl::StrCat("memory is full: ", waiting,
                                " byte(s) wait for their write-back to an SSD tier before they "
                                "may leave memory; retry shortly"));
  }
  return placed;
}

std::vector<PutStartOutcome> PutCoordinator::PutStart(const std::string& client_id,
                                                      const std::vector<PutStartItem>& items,
                                                      uint32_t replicas,
                                                      const std::vector<std::string>& avoid) {
  std::vector<PutStartOutcome> out(items.size());
  if (replicas == 0) replicas = 1;
  const bool known_client = clients_.IsAlive(client_id);
  CheckPutItems(client_id, known_client, items, replicas, &out);
  // Every item of an unknown client failed above. Returning here also keeps a caller's made-up
  // client ids out of PeerNames, which interns only registered clients' pairs.
  if (!known_client) return out;
  const std::vector<std::string_view> keys = ItemKeys(items);
  const int64_t now = clock_.NowMs();
  ReservePuts(client_id, items, keys, replicas, now, &out);
  std::vector<std::vector<MemoryLocation>> placed =
      PlacePuts(client_id, items, replicas, avoid, &out);
  AttachPuts(items, keys, now, placed, &out);
  return out;
}

void PutCoordinator::CheckPutItems(const std::string& client_id, bool known_client,
                                   const std::vector<PutStartItem>& items, uint32_t replicas,
                                   std::vector<PutStartOutcome>* out) const {
  for (size_t i = 0; i < items.size(); ++i) {
    absl::Status& s = (*out)[i].status;
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
}

// Phase 1: reserve each key as a PENDING object (ALREADY_EXISTS if stored or being stored).
void PutCoordinator::ReservePuts(const std::string& client_id,
                                 const std::vector<PutStartItem>& items,
                                 const std::vector<std::string_view>& keys, uint32_t replicas,
                                 int64_t now, std::vector<PutStartOutcome>* out_ptr) {
  std::vector<PutStartOutcome>& out = *out_ptr;
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
      const uint64_t generation = generations_.Next();
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
      pending_.Add(PendingKeyOf(now, out[i].generation), std::move(key));
    }
  });
}

// Phase 2: place replicas with no shard lock held (eviction takes shard locks).
std::vector<std::vector<MemoryLocation>> PutCoordinator::PlacePuts(
    const std::string& client_id, const std::vector<PutStartItem>& items, uint32_t replicas,
    const std::vector<std::string>& avoid, std::vector<PutStartOutcome>* out_ptr) {
  std::vector<PutStartOutcome>& out = *out_ptr;
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
  return placed;
}

// Phase 3: attach the replicas, or drop the reservation of a key that got none.
void PutCoordinator::AttachPuts(const std::vector<PutStartItem>& items,
                                const std::vector<std::string_view>& keys, int64_t now,
                                std::vector<std::vector<MemoryLocation>>& placed,
                                std::vector<PutStartOutcome>* out_ptr) {
  std::vector<PutStartOutcome>& out = *out_ptr;
  std::vector<MemoryLocation> to_free;
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      if (out[i].generation == 0) continue;  // never reserved
      auto it = shard.objects.find(AsKey(items[i].key));
      bool ours = it != shard.objects.end() && it->second.generation == out[i].generation;
      if (!out[i].status.ok() || !ours) {
        if (ours) {
          pending_.Remove(PendingKeyOf(now, out[i].generation));
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
}

void PutCoordinator::ForgetPending(const Object& object) {
  pending_.Remove(PendingKeyOf(object.put_start_ms(), object.generation));
}

void PutCoordinator::RevokePut(ObjectTable::Shard& shard, ObjectMap::iterator it,
                               std::vector<MemoryLocation>* to_free) {
  ForgetPending(it->second);
  QueueMemoryReplicas(it->second, to_free);
  shard.Erase(it);
}

std::vector<absl::Status> PutCoordinator::PutEnd(const std::string& client_id,
                                                 const std::vector<PutEndItem>& items) {
  std::vector<MemoryLocation> to_free;
  std::vector<absl::Status> out =
      ForEachItem(table_, items, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
        shard.mu.AssertHeld();
        auto it = FindOwnPut(shard, items[i].key, items[i].generation, client_id);
        if (it == shard.objects.end()) {
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
          const uint32_t asked = object.replicas_asked();
          RevokePut(shard, it, &to_free);
          return McError(
              Code::kUnavailable,
              absl::StrCat("only ", held, " of ", asked,
                           " replicas remain: a replica's client was lost during the put; "
                           "the put is revoked, retry it"));
        }
        ForgetPending(object);
        shard.CompletePut(object, items[i].checksum);
        disputed_.Forget(items[i].key);  // a put of this run vouches for the key again
        return absl::OkStatus();
      });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

std::vector<absl::Status> PutCoordinator::PutRevoke(const std::string& client_id,
                                                    const std::vector<PutRevokeItem>& items) {
  std::vector<MemoryLocation> to_free;
  std::vector<absl::Status> out =
      ForEachItem(table_, items, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
        shard.mu.AssertHeld();
        auto it = FindOwnPut(shard, items[i].key, items[i].generation, client_id);
        if (it == shard.objects.end()) {
          return McError(Code::kNotFound, "no pending put of this generation by this client");
        }
        if (it->second.state != ObjectState::kPending) {
          return McError(Code::kInvalidArgument, "the put has ended: remove the key instead");
        }
        RevokePut(shard, it, &to_free);
        return absl::OkStatus();
      });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

void PutCoordinator::RevokeTimedOutPuts() {
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
    QueueMemoryReplicas(it->second, &to_free);
    Log().warn("put of {} (generation {}) by client {} timed out after {} ms; revoked",
               KeyForLog(entry.key), entry.generation, it->second.writer_client(),
               options_.put_timeout_ms);
    shard.Erase(it);
    puts_timed_out_.Inc();
  }
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
}

void PutCoordinator::DropPromotion(ObjectTable::Shard& shard, const Object& object,
                                   std::vector<MemoryLocation>* to_free) {
  const Object::Promotion* promotion = object.promotion();
  if (promotion == nullptr) return;
  if (promotion->location.length > 0) {
    to_free->push_back(promotion->location);
    pending_.Remove(PendingKeyOf(promotion->start_ms, object.generation));
  }
  shard.EndPromotion(object);
}

std::vector<PutStartOutcome> PutCoordinator::PromoteStart(const std::string& client_id,
                                                          const std::vector<PromoteItem>& items) {
  std::vector<PutStartOutcome> out(items.size());
  std::vector<std::string_view> keys;
  for (const auto& item : items) keys.push_back(item.key);
  bool known_client = clients_.IsAlive(client_id);
  int64_t now = clock_.NowMs();
  std::vector<uint64_t> sizes(items.size(), 0);
  // Phase 1: reserve the promotion on objects that are COMPLETE and have no memory replica.
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      absl::Status& s = out[i].status;
      s = ValidateKey(items[i].key);
      if (!s.ok()) continue;
      if (!known_client) {
        s = UnknownClient(client_id);
        continue;
      }
      auto it = shard.objects.find(AsKey(items[i].key));
      if (it == shard.objects.end() || it->second.generation != items[i].generation ||
          it->second.state != ObjectState::kComplete) {
        s = McError(Code::kNotFound, "no complete object of this generation");
      } else if (it->second.HasMemoryReplica() || it->second.promotion()) {
        s = McError(Code::kAlreadyExists, "already in memory or being promoted");
      } else {
        shard.StartPromotion(it->second, Object::Promotion{{}, client_id, now});
        sizes[i] = it->second.size;
      }
    }
  });
  // Phase 2: place with no shard lock held.
  std::vector<MemoryLocation> placed(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (!out[i].status.ok()) continue;
    // Promotion is best effort: it may push out memory copies of objects that are also on SSD,
    // never the only copy of another object, neither by evicting (persisted objects only) nor
    // by filling memory past the high watermark, where the background pass would evict the
    // coldest objects whatever they are.
    absl::StatusOr<std::vector<MemoryLocation>> p =
        evictor_.MakeRoomUnderHighWatermark(sizes[i])
            ? PlaceWithEviction(sizes[i], 1, client_id, /*persisted_only=*/true)
            : McError(Code::kNoSpace, "promotion would fill memory past the high watermark");
    if (p.ok()) {
      placed[i] = (*p)[0];
    } else {
      out[i].status = p.status();
    }
  }
  // Phase 3: record the space on the reservation (or give it back).
  std::vector<MemoryLocation> to_free;
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      if (sizes[i] == 0) continue;  // never reserved
      auto it = shard.objects.find(AsKey(items[i].key));
      const Object::Promotion* promotion =
          it != shard.objects.end() ? it->second.promotion() : nullptr;
      bool ours = promotion != nullptr && it->second.generation == items[i].generation &&
                  promotion->writer == client_id && promotion->start_ms == now &&
                  promotion->location.length == 0;
      if (!out[i].status.ok() || !ours) {
        if (ours) shard.EndPromotion(it->second);
        if (placed[i].length > 0) to_free.push_back(placed[i]);
        if (out[i].status.ok()) out[i].status = McError(Code::kNotFound, "object changed");
        continue;
      }
      placed[i].generation = items[i].generation;
      shard.PlacePromotion(it->second, placed[i]);
      pending_.Add(PendingKeyOf(now, items[i].generation), std::string(it->first));
      out[i].generation = items[i].generation;
      out[i].replicas.push_back(Replica{ReplicaTier::kMemory, placed[i]});
    }
  });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

std::vector<absl::Status> PutCoordinator::PromoteEnd(const std::string& client_id,
                                                     const std::vector<PromoteItem>& items,
                                                     const std::vector<bool>& written) {
  std::vector<MemoryLocation> to_free;
  std::vector<absl::Status> out =
      ForEachItem(table_, items, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
        shard.mu.AssertHeld();
        auto it = shard.objects.find(AsKey(items[i].key));
        if (it == shard.objects.end() || it->second.generation != items[i].generation ||
            !it->second.promotion() || it->second.promotion()->writer != client_id ||
            it->second.promotion()->location.length == 0) {
          return McError(Code::kNotFound, "no promotion of this generation by this client");
        }
        const Object& object = it->second;
        if (i < written.size() && written[i]) {
          pending_.Remove(PendingKeyOf(object.promotion()->start_ms, object.generation));
          shard.CompletePromotion(object);
        } else {
          DropPromotion(shard, object, &to_free);
        }
        return absl::OkStatus();
      });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}
}  // namespace mc::master
