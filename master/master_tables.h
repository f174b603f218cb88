// MasterTables: the state the master's use-case services share (ClientLifecycle, PutCoordinator,
// ReadService, TieringService, ObjectReports, ReplicaRepair; MetadataService owns one and wires
// them). It holds the options, the object table, the segments, the client registry, the offload
// queue, the evictor and the offload planner, and the membership lock; each is thread-safe on
// its own. The services borrow them by reference and keep the lock order (membership -> shard ->
// segments; never two shards at once).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/keys.h"
#include "common/metrics.h"
#include "master/client_registry.h"
#include "master/evictor.h"
#include "master/master_types.h"
#include "master/object_table.h"
#include "master/offload_planner.h"
#include "master/segment_manager.h"

namespace mc::master {

// UNAVAILABLE "unknown client" with a retry hint (a transient state after a master restart).
absl::Status UnknownClient(const std::string& client_id);

struct MasterTables {
  MasterTables(MasterOptions options, const Clock& clock, MetricsRegistry& metrics);
  MasterTables(const MasterTables&) = delete;
  MasterTables& operator=(const MasterTables&) = delete;

  // Whether the client is registered with an SSD tier.
  bool DiskCapable(const std::string& client_id) const;

  const MasterOptions options;
  // This run's epoch (the high 32 bits of its segment ids): options.epoch, or random, nonzero.
  const uint32_t epoch;
  const Clock& clock;
  MetricsRegistry& metrics;
  ObjectTable table;
  SegmentManager segments;
  ClientRegistry clients;
  OffloadQueue offload_queue;
  Evictor evictor;
  OffloadPlanner planner;
  // Serializes membership changes (register, unregister, expiry and their cleanup), so a client
  // that re-registers while its expiry is being cleaned up never loses its new segments. Object
  // reports hold it shared, so the session they name stays current until they end.
  absl::Mutex membership_mu;
};

// The loop of the per-item batch calls: for each item (anything with a `key`), the key check,
// then fn(shard, i) -> Status with the key's shard locked. One status per item, in order.
template <typename Item, typename Fn>
std::vector<absl::Status> ForEachItem(ObjectTable& table, const std::vector<Item>& items, Fn&& fn) {
  std::vector<absl::Status> out(items.size());
  std::vector<std::string_view> keys;
  keys.reserve(items.size());
  for (const auto& item : items) keys.push_back(item.key);
  table.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      out[i] = ValidateKey(items[i].key);
      if (out[i].ok()) out[i] = fn(shard, i);
    }
  });
  return out;
}

}  // namespace mc::master
