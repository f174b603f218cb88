// PackedKeysGate: whether this daemon's master lookups (a MatchPrefix's, a get's) may name their
// keys packed (GetReplicasRequest.packed_keys), and the rest after meeting a master older than
// that. Such a master sees no keys in a packed lookup and answers keys_seen 0; whoever met it
// asks again key by key and calls OlderMaster(), and from then on every lookup of the daemon
// (MatchPrefix and gets alike) names its keys one by one for `retry_ms`, then tries packing
// again. One gate per daemon (BatchGetter owns it), so an older master is found, and logged,
// once. The gRPC master client has a gate of its own for the keys of the lease releases its
// lookups carry (answered releases_seen 0 by a master that does not read those). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/clock.h"

namespace mc::client {

class PackedKeysGate {
 public:
  // `clock` is borrowed; `what` names what goes one by one while packing rests (for the log).
  PackedKeysGate(const Clock& clock, int64_t retry_ms, std::string_view what = "lookups")
      : clock_(clock), retry_ms_(retry_ms), what_(what) {}

  // What a master's count of the packed keys it read (keys_seen, releases_seen) says of it.
  enum class Seen {
    kAll,   // it read every key sent
    kNone,  // a master older than packed keys: it read none, so it acted on none (leased,
            // released nothing); whoever sent them may send them again one by one
    kSome,  // a master that read part: it may have acted on what it read, so a lookup is not
            // asked again (it is refused and its leases given back); a release, idempotent, is
  };
  static Seen Classify(uint64_t seen, size_t asked) {
    if (seen == asked) return Seen::kAll;
    return seen == 0 ? Seen::kNone : Seen::kSome;
  }

  // Whether packing rests now (an older master was met less than retry_ms ago).
  bool Resting() const { return clock_.NowMs() < off_until_ms_.load(std::memory_order_relaxed); }
  // A packed request of `asked` keys (by `who`: "MatchPrefix", "gets", "GetReplicas") was
  // answered `seen` by a master that does not read packed keys: packing rests for retry_ms
  // (logged at most once every 10 minutes).
  void OlderMaster(uint64_t seen, size_t asked, std::string_view who);

 private:
  const Clock& clock_;
  const int64_t retry_ms_;
  const std::string what_;
  std::atomic<int64_t> off_until_ms_{0};
};

}  // namespace mc::client
