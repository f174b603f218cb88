// The `local` transport: requests whose segment lives in this process, served by memcpy through
// the SegmentTable. A request larger than `parallel_copy_threshold` is cut into equal byte
// ranges copied by `copy_threads` helper threads plus the caller. Buffers overlapping the
// segment range are copied by the caller alone with memmove.
// Thread-safe: concurrent Submit() calls share the helper threads.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transfer/transport.h"

namespace mc::transfer {

struct LocalTransportOptions {
  uint64_t parallel_copy_threshold = 8 << 20;  // bytes; copies above it are split
  int copy_threads = 2;                         // helper threads (0 = caller only)
};

class LocalTransport final : public Transport {
 public:
  LocalTransport(LocalTransportOptions options, SegmentTable& segments);
  ~LocalTransport() override;

  std::string_view name() const override { return "local"; }
  void Submit(std::span<const TransferRequest* const> requests,
              std::span<TransferResult> results, int64_t deadline_ms) override;

 private:
  struct Copy {
    char* dst;
    const char* src;
    uint64_t length;
  };
  TransferResult Execute(const TransferRequest& request);
  void CopyParallel(const std::vector<Copy>& copies, uint64_t total);
  void WorkerLoop();

  const LocalTransportOptions options_;
  SegmentTable& segments_;
  std::vector<std::thread> workers_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mc::transfer
