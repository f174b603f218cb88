#include "transfer/local/local_transport.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/synchronization/blocking_counter.h"
#include "common/clock.h"
#include "common/status.h"

namespace mc::transfer {
namespace {

bool Overlaps(const char* a, uint64_t a_len, const char* b, uint64_t b_len) {
  return a < b + b_len && b < a + a_len;
}

}  // namespace

LocalTransport::LocalTransport(LocalTransportOptions options, SegmentTable& segments)
    : options_(options), segments_(segments) {
  for (int i = 0; i < options_.copy_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

LocalTransport::~LocalTransport() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void LocalTransport::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !tasks_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void LocalTransport::Submit(std::span<const TransferRequest* const> requests,
                            std::span<TransferResult> results, int64_t deadline_ms) {
  for (size_t i = 0; i < requests.size(); ++i) {
    if (deadline_ms != 0 && RealClock::Get().NowMs() >= deadline_ms) {
      results[i].status = DeadlineError();
      continue;
    }
    results[i] = Execute(*requests[i]);
  }
}

TransferResult LocalTransport::Execute(const TransferRequest& request) {
  TransferResult result;
  if (request.op == OpKind::kReadDisk) {
    result.status = McError(Code::kInvalidArgument,
                            "local transport: SSD records are read through the tier itself");
    return result;
  }
  const uint64_t total = TotalLength(request);
  absl::StatusOr<char*> seg = segments_.Resolve(request.segment_id, request.offset, total);
  if (!seg.ok()) {
    result.status = seg.status();
    return result;
  }
  std::vector<Copy> copies;
  copies.reserve(request.local.size());
  bool overlap = false;
  uint64_t pos = 0;
  for (const LocalBuffer& b : request.local) {
    if (b.length == 0) continue;
    char* remote = *seg + pos;
    overlap = overlap || Overlaps(remote, b.length, b.data, b.length);
    if (request.op == OpKind::kRead) {
      copies.push_back({b.data, remote, b.length});
    } else {
      copies.push_back({remote, b.data, b.length});
    }
    pos += b.length;
  }
  if (overlap || workers_.empty() || total <= options_.parallel_copy_threshold) {
    for (const Copy& c : copies) std::memmove(c.dst, c.src, c.length);
  } else {
    CopyParallel(copies, total);
  }
  result.bytes = total;
  return result;
}

// Cuts the copy list into workers_+1 byte ranges of near-equal size; the caller copies one.
void LocalTransport::CopyParallel(const std::vector<Copy>& copies, uint64_t total) {
  const uint64_t parts = workers_.size() + 1;
  const uint64_t per_part = (total + parts - 1) / parts;
  std::vector<std::vector<Copy>> plan(parts);
  size_t part = 0;
  uint64_t filled = 0;
  for (Copy c : copies) {
    while (c.length > 0) {
      const uint64_t n = std::min(c.length, per_part - filled);
      plan[part].push_back({c.dst, c.src, n});
      c.dst += n;
      c.src += n;
      c.length -= n;
      filled += n;
      if (filled == per_part && part + 1 < parts) {
        ++part;
        filled = 0;
      }
    }
  }
  auto run = [](const std::vector<Copy>& list) {
    for (const Copy& c : list) std::memcpy(c.dst, c.src, c.length);
  };
  absl::BlockingCounter done(static_cast<int>(parts - 1));
  {
    absl::MutexLock lock(&mu_);
    for (size_t p = 1; p < parts; ++p) {
      tasks_.push_back([&run, &plan, &done, p] {
        run(plan[p]);
        done.DecrementCount();
      });
    }
  }
  run(plan[0]);
  done.Wait();
}

}  // namespace mc::transfer
