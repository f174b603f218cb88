// PeerSlots<T>: a value per PeerNames index for the length of one answer, found without hashing
// strings. The master builds answers over replicas that name their holder by PeerNames index
// (StoredReplica::peer); what an answer works out once per holder (its owner column, its owner
// key) is kept here instead of in a map keyed by the holder's id and endpoint.
//
// The slots of the first kDirectPeers indices live in a table per thread and per T, indexed by
// PeerNames index: it grows to the highest such index met (at most kDirectPeers entries of
// 8 + sizeof(T) bytes, padded: 1 MiB per thread for an 8-byte T). A higher index (PeerNames
// never removes a pair, so a long-lived master whose clients often register with new endpoints
// climbs past it) takes a slot in a map of the instance's own instead: slower, never a table
// per thread sized by how many pairs were ever interned. Each PeerSlots takes a stamp no other
// instance in the process has, and a table slot counts as set only under its own stamp, so
// several instances alive at once on one thread (or an instance used on another thread) never
// read each other's values: they only overwrite them, and a value lost that way is worked out
// again. Not thread-safe itself: one instance per answer being built.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/node_hash_map.h"

namespace mc::master {

template <typename T>
class PeerSlots {
 public:
  PeerSlots() : stamp_(next_stamp_.fetch_add(1, std::memory_order_relaxed)) {}

  // Indices below this use the table per thread.
  static constexpr uint32_t kDirectPeers = 1u << 16;

  // The slot of `peer` and whether this instance had not set it yet (then its value is T{}). The
  // pointer stays valid until the next call.
  std::pair<T*, bool> Slot(uint32_t peer) {
    if (peer >= kDirectPeers) {
      auto [it, added] = beyond_.try_emplace(peer);
      return {&it->second, added};
    }
    std::vector<Entry>& entries = entries_;
    if (peer >= entries.size()) {
      entries.resize(
          std::min<size_t>(kDirectPeers, std::max<size_t>(peer + 1, entries.size() * 2)));
    }
    Entry& e = entries[peer];
    if (e.stamp == stamp_) return {&e.value, false};
    e.stamp = stamp_;
    e.value = T{};
    return {&e.value, true};
  }

 private:
  struct Entry {
    uint64_t stamp = 0;  // 0: no instance's (stamps start at 1)
    T value{};
  };
  // 64 bits: no stamp comes round again within the life of a process.
  static inline std::atomic<uint64_t> next_stamp_{1};
  static inline thread_local std::vector<Entry> entries_;

  uint64_t stamp_;
  absl::node_hash_map<uint32_t, T> beyond_;  // slots of indices >= kDirectPeers
};

}  // namespace mc::master
