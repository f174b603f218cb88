// HolderBackoff: the data endpoints that refused a connection moments ago.
//
// A holder whose daemon is gone refuses every connection (nothing listens there); dialling it
// again for every block of every request is what turned one dead holder into thousands of failed
// loads. The batch paths skip such a holder's replicas for `backoff_ms` after a refusal (trying
// the key's other replicas at once), and report the holder to the master (ReportReplicaFaults
// UNREACHABLE), which drops it once it can confirm it is gone. Only refusals count: a slow or
// failed exchange with a live holder does not (common/status.h, IsPeerUnreachable).
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace mc::client {

class HolderBackoff {
 public:
  // At most this many endpoints are remembered; beyond it the expired ones are dropped, and if
  // none has expired the refusal is not recorded (a bound on memory, not on correctness).
  static constexpr size_t kMaxEndpoints = 4096;

  // `backoff_ms` 0 turns the back-off off (every replica is always tried).
  HolderBackoff(const Clock& clock, int64_t backoff_ms) : clock_(clock), backoff_ms_(backoff_ms) {}

  // Records that `endpoint` refused a connection. True when it was not backing off already:
  // the caller then reports it (once per back-off period, not once per block).
  bool Refused(const std::string& endpoint);
  // Whether `endpoint` refused a connection less than backoff_ms ago.
  bool BackingOff(std::string_view endpoint) const;
  size_t CountForTest() const;

 private:
  const Clock& clock_;
  const int64_t backoff_ms_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> until_ms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::client
