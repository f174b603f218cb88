// Time as a seam. Components that expire things (leases, puts, clients) take a Clock&, so tests
// inject tests/fakes/fake_clock.h instead of sleeping. NowMs() is monotonic milliseconds.
// Thread-safe.
#pragma once

#include <cstdint>

namespace mc {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;
};

// steady_clock milliseconds.
class RealClock final : public Clock {
 public:
  int64_t NowMs() const override;
  static RealClock& Get();
};

}  // namespace mc
