// GenerationCounter: the master's source of object generations. Every put (and so every object)
// of a run gets a generation no earlier run issued and no later one will: the counter starts at
// the wall clock (ms << 20), and reported generations (an owner's index, a recovered SSD record)
// raise it past themselves once checked to be ones some master run could have issued.
// Thread-safe (one atomic).
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace mc::master {

// Generations are in [1, kGenerationLimit): 0 means "never reserved", and the headroom above
// the wall-clock start (ms << 20, about 2^60.6 in 2026) lasts past the year 2240.
inline constexpr uint64_t kGenerationLimit = 1ull << 63;
// A generation reported to a master (an owner's index, a recovered SSD record) must be one some
// master run could have issued: below the wall clock this far ahead (ms << 20), or below this
// run's counter. Leaves room for masters whose clocks differ by up to this much; a report above
// it is refused, so no report can push the counter towards kGenerationLimit.
inline constexpr int64_t kGenerationLeadMs = 3'600'000;

class GenerationCounter {
 public:
  GenerationCounter();

  // The next generation, or 0 once they are exhausted (never wraps).
  uint64_t Next();
  // Raises the next generation past `generation` (a reported one), never lowering it.
  void RaisePast(uint64_t generation);
  // INVALID_ARGUMENT unless `generation` (a reported one) is one a master run could have issued:
  // 1 and above, below the larger of this run's counter and the wall clock kGenerationLeadMs
  // ahead (<< 20).
  absl::Status CheckReported(uint64_t generation) const;

 private:
  std::atomic<uint64_t> next_;
};

}  // namespace mc::master
