// SpeculativeCopier: copies objects this daemon holds in its own segments into their get
// destinations while the master lookup of that get is in flight (BatchGetter, docs/
// architecture.md "Speculative local copies"). It only copies and hashes; whether a copy is kept
// is BatchGetter's decision, from the master's answer.
//
// One helper thread takes one job at a time: TryStart() hands it a job only when it is idle
// (otherwise the get does not speculate, so a busy helper never delays a get). Finish() is the
// getter's side once the answer is in: items no longer wanted are cancelled when not started
// and abandoned at their next 256 KiB chunk when being copied; wanted items the helper has not
// started are copied by the calling thread (from the last one back, while the helper goes on from
// the first), so two threads finish the job. Finish() returns once the helper is done with the
// job, or at once when the helper had not taken it yet (then it never will): no thread writes
// any destination of the job any more. Each item is claimed with an atomic state, so it is copied
// at most once.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/batch/batch_types.h"

namespace mc::client {

class SpeculativeCopier {
 public:
  struct Item {
    const char* src = nullptr;      // the object's bytes in a local segment
    uint64_t size = 0;              // == TotalLength(dest)
    std::vector<LocalBuffer> dest;  // host memory only, disjoint from [src, src + size)
    // Set by Finish() for items copied: XXH3-64 of the destination bytes as written.
    bool copied = false;
    uint64_t checksum = 0;
    bool after_answer = false;  // copied by Finish()'s caller, not the helper
  };
  class Job;

  SpeculativeCopier();
  ~SpeculativeCopier();
  SpeculativeCopier(const SpeculativeCopier&) = delete;
  SpeculativeCopier& operator=(const SpeculativeCopier&) = delete;

  // Starts copying `items` on the helper thread, or returns null (the helper is busy, or no
  // items).
  std::shared_ptr<Job> TryStart(std::vector<Item> items);
  // See above. `wanted[i]`: whether item i may still be kept (missing: not wanted); a wanted item
  // must be one the caller may write now (its answer proved the range). Returns the items,
  // `copied` and `checksum` set on those copied whole (wanted or not).
  static std::vector<Item>& Finish(Job& job, const std::vector<bool>& wanted);
  // Whether a job is handed over or running (tests: let the helper finish before the answer).
  bool busy() const;
  // Tests: while paused the helper takes no job (Finish() then copies every wanted item).
  void PauseForTest(bool paused);

 private:
  void Loop();
  // Whether `job` was still handed over, not taken by the helper; if so it never will be.
  bool TakeBack(const Job& job);

  mutable absl::Mutex mu_;
  std::shared_ptr<Job> next_ ABSL_GUARDED_BY(mu_);  // handed over, not yet taken
  bool busy_ ABSL_GUARDED_BY(mu_) = false;          // a job is handed over or running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mc::client
