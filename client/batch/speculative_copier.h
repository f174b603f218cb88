// SpeculativeCopier: copies objects this daemon holds in its own segments into their get
// destinations while the master lookup of that get is in flight (BatchGetter, docs/
// architecture.md "Speculative local copies"). It only copies and hashes; whether a copy is kept
// is BatchGetter's decision, from the master's answer.
//
// One helper thread takes one job at a time: TryStart() hands it a job only when it is idle
// (otherwise the get does not speculate, so a busy helper never delays a get). Finish() is the
// getter's side once the answer is in: items it does not want and the helper has not started are
// cancelled, items it wants and the helper has not started are copied on the calling thread, and
// it waits only for the one item the helper may be copying (each item is bounded by the getter).
// Items are claimed with an atomic state, so each is copied by exactly one thread and Finish()
// returns only when no thread writes any destination of the job any more.
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
  };
  class Job;

  SpeculativeCopier();
  ~SpeculativeCopier();
  SpeculativeCopier(const SpeculativeCopier&) = delete;
  SpeculativeCopier& operator=(const SpeculativeCopier&) = delete;

  // Starts copying `items` on the helper thread, or returns null (the helper is busy, or no
  // items).
  std::shared_ptr<Job> TryStart(std::vector<Item> items);
  // See above. `wanted[i]`: whether item i may still be kept. Returns the items, with `copied`
  // and `checksum` set on those copied (a cancelled item may have been copied all the same).
  static std::vector<Item>& Finish(Job& job, const std::vector<bool>& wanted);

 private:
  void Loop();

  absl::Mutex mu_;
  std::shared_ptr<Job> next_ ABSL_GUARDED_BY(mu_);  // handed over, not yet taken
  bool busy_ ABSL_GUARDED_BY(mu_) = false;          // a job is handed over or running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mc::client
