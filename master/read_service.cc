// Lookups with read leases, lease release and sweeping, existence, removal.
#include "master/read_service.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/status.h"

namespace mc::master {

ReadService::ReadService(MasterTables& tables, PutCoordinator& puts)
    : options_(tables.options),
      clock_(tables.clock),
      table_(tables.table),
      segments_(tables.segments),
      offload_queue_(tables.offload_queue),
      puts_(puts),
      leases_granted_(tables.metrics.GetCounter("mc_leases_granted_total", "Read leases granted")),
      leases_expired_(
          tables.metrics.GetCounter("mc_leases_expired_total", "Read leases that ended by expiry")),
      leases_released_(
          tables.metrics.GetCounter("mc_leases_released_total", "Read leases released by readers")),
      lease_releases_refused_(tables.metrics.GetCounter(
          "mc_master_lease_releases_refused_total",
          "Lease releases that named another caller's lease (nothing released)")) {}

LookupBatch ReadService::GetReplicas(const std::vector<std::string_view>& keys,
                                     const LookupOptions& options) {
  LookupBatch batch;
  batch.results.resize(keys.size());
  int64_t ttl = options.lease_ttl_ms > 0 ? options.lease_ttl_ms : options_.lease_ttl_ms;
  ttl = std::min(ttl, options_.max_lease_ttl_ms);
  batch.lease_ttl_ms = options.grant_lease ? ttl : 0;
  // Random (CSPRNG), never 0: a lease id is not a capability (releases also need the owner) but
  // must not be guessable either. Two live ids collide with probability ~2^-64.
  uint64_t lease_id = 0;
  while (options.grant_lease && lease_id == 0) lease_id = auth::RandomU64();
  batch.lease_id = lease_id;
  CheckLookupKeys(keys, &batch);
  const size_t looked_up = LookUp(keys, options, ttl, &batch);
  if (options.stop_at_first_miss) EndPrefix(keys, options, looked_up, &batch);
  return batch;
}

void ReadService::CheckLookupKeys(const std::vector<std::string_view>& keys, LookupBatch* batch) {
  // Input checks in request order: a repeated key is the caller's bug (it must dedupe).
  absl::flat_hash_set<absl::string_view> seen;
  seen.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    batch->results[i].status = ValidateKey(keys[i]);
    if (batch->results[i].status.ok() && !seen.insert(AsKey(keys[i])).second) {
      batch->results[i].status = McError(Code::kInvalidArgument, "key repeated in one lookup");
    }
  }
}

size_t ReadService::LookUp(const std::vector<std::string_view>& keys, const LookupOptions& options,
                           int64_t ttl, LookupBatch* batch) {
  const uint64_t lease_id = batch->lease_id;
  int64_t now = clock_.NowMs();
  uint64_t granted = 0;
  uint64_t expired = 0;  // pruned here, so the sweep would never count them
  // A prefix match walks the keys in order, a chunk at a time, and stops after the chunk that
  // holds the first miss: keys further on are neither looked up nor leased.
  const size_t chunk = options.stop_at_first_miss ? kPrefixChunk : keys.size();
  size_t looked_up = 0;
  while (looked_up < keys.size()) {
    const size_t begin = looked_up;
    const size_t end = std::min(keys.size(), begin + chunk);
    std::vector<std::string_view> part(keys.begin() + begin, keys.begin() + end);
    table_.ForKeys(part, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
      shard.mu.AssertHeld();
      shard.FindEach(part, indices, [&](size_t j, auto it) {
        shard.mu.AssertHeld();
        LookupOutcome& r = batch->results[begin + j];
        if (!r.status.ok()) return;
        if (it == shard.objects.end()) {
          r.status = McError(Code::kNotFound, "no such key");
          return;
        }
        const Object& object = it->second;
        if (object.state != ObjectState::kComplete) {
          r.status = McError(Code::kNotReady, "key is being written");
          return;
        }
        r.size = object.size;
        r.checksum = object.checksum;
        r.generation = object.generation;
        if (options.with_replicas) {
          r.replicas.assign(object.replicas.begin(), object.replicas.end());
          auto in_memory = [](const StoredReplica& x) { return x.tier == ReplicaTier::kMemory; };
          // Usually already in order; stable_partition would allocate a buffer per key.
          if (!std::is_partitioned(r.replicas.begin(), r.replicas.end(), in_memory)) {
            std::stable_partition(r.replicas.begin(), r.replicas.end(), in_memory);
          }
        }
        if (options.touch) shard.MarkRead(object);
        if (options.grant_lease) {
          expired += shard.GrantLease(object, {lease_id, now + ttl, options.lease_owner}, now);
          ++granted;
        }
      });
    });
    looked_up = end;
    if (options.stop_at_first_miss &&
        std::any_of(batch->results.begin() + begin, batch->results.begin() + end,
                    [](const LookupOutcome& r) { return !r.status.ok(); })) {
      break;
    }
  }
  leases_granted_.Inc(granted);
  leases_expired_.Inc(expired);
  return looked_up;
}

void ReadService::EndPrefix(const std::vector<std::string_view>& keys, const LookupOptions& options,
                            size_t looked_up, LookupBatch* batch) {
  size_t matched = 0;
  while (matched < looked_up && batch->results[matched].status.ok()) ++matched;
  if (matched < keys.size()) {
    // Keys of the last chunk past the first miss are not part of the prefix: release what they
    // were granted.
    std::vector<std::string_view> beyond;
    for (size_t i = matched + 1; i < looked_up; ++i) {
      if (batch->results[i].status.ok()) beyond.push_back(keys[i]);
    }
    if (options.grant_lease && !beyond.empty()) {
      ReleaseLeases(batch->lease_id, beyond, options.lease_owner);
    }
    batch->results.resize(matched + 1);
  }
}

size_t ReadService::ReleaseLeases(uint64_t lease_id, const std::vector<std::string_view>& keys,
                                  uint64_t owner) {
  size_t released = 0;
  size_t refused = 0;
  size_t expired = 0;
  int64_t now = clock_.NowMs();
  auto count = [&](LeaseRelease outcome) {
    switch (outcome) {
      case LeaseRelease::kReleased:
        ++released;
        break;
      case LeaseRelease::kNotOwner:
        ++refused;
        break;
      case LeaseRelease::kNotHeld:
        break;
    }
  };
  std::vector<size_t> found_by_key;
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    // Keys named in the order they were granted end their leases from the shard's grant record
    // without loading the objects; the rest find their objects by key.
    found_by_key.clear();
    for (size_t i : indices) {
      const std::optional<LeaseRelease> outcome =
          shard.ReleaseGranted(lease_id, keys[i], owner, now, &expired);
      if (outcome.has_value()) {
        count(*outcome);
      } else {
        found_by_key.push_back(i);
      }
    }
    if (found_by_key.empty()) return;
    shard.FindEach(keys, found_by_key, [&](size_t, auto it) {
      shard.mu.AssertHeld();
      if (it == shard.objects.end()) return;
      // Expired leases go first (counted as expired), so releasing one is not lost silently.
      count(shard.ReleaseLease(it->second, lease_id, owner, now, &expired));
    });
  });
  leases_released_.Inc(released);
  if (refused > 0) lease_releases_refused_.Inc(refused);
  leases_expired_.Inc(expired);
  return released;
}

void ReadService::SweepLeases() {
  int64_t now = clock_.NowMs();
  uint64_t expired = 0;
  table_.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    expired += shard.SweepLeases(now);
  });
  leases_expired_.Inc(expired);
}

size_t ReadService::ActiveLeaseCount() {
  int64_t now = clock_.NowMs();
  size_t n = 0;
  table_.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    for (const auto& [object, leases] : shard.leased()) {
      for (const Lease& l : leases) n += l.expiry_ms > now ? 1 : 0;
    }
  });
  return n;
}

std::vector<bool> ReadService::Exist(const std::vector<std::string_view>& keys) {
  std::vector<bool> out(keys.size(), false);
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    shard.FindEach(keys, indices, [&](size_t i, auto it) {
      shard.mu.AssertHeld();
      out[i] = it != shard.objects.end() && it->second.state == ObjectState::kComplete;
    });
  });
  return out;
}

std::vector<absl::Status> ReadService::Remove(const std::vector<std::string_view>& keys) {
  std::vector<absl::Status> out(keys.size());
  std::vector<MemoryLocation> to_free;
  int64_t now = clock_.NowMs();
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      out[i] = ValidateKey(keys[i]);
      if (!out[i].ok()) continue;
      auto it = shard.objects.find(AsKey(keys[i]));
      if (it == shard.objects.end()) {
        out[i] = McError(Code::kNotFound, "no such key");
      } else if (it->second.state != ObjectState::kComplete) {
        out[i] = McError(Code::kNotReady, "key is being written");
      } else if (shard.HasLiveLease(it->second, now)) {
        out[i] = McError(Code::kHasLease, "key is leased by a reader");
      } else {
        puts_.DropPromotion(shard, it->second, &to_free);
        for (const StoredReplica& r : it->second.replicas) {
          if (r.tier == ReplicaTier::kMemory) {
            to_free.push_back(r.location());
          } else {  // the owning client deletes the record
            offload_queue_.Push(
                r.client_id(),
                OffloadTask{OffloadTask::Kind::kDrop, std::string(it->first), it->second.generation,
                            it->second.size, it->second.checksum, 0, 0, r.offset});
          }
        }
        shard.Erase(it);
      }
    }
  });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

}  // namespace mc::master
