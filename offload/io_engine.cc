#include "offload/io_engine.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status.h"
#include "offload/internal/pending_batch.h"

namespace mc::offload {
namespace {

// A batch whose results are known at construction.
class CompletedBatch final : public IoBatch {
 public:
  explicit CompletedBatch(std::vector<IoResult> results) : results_(std::move(results)) {}
  std::vector<IoResult> Wait() override { return std::move(results_); }

 private:
  std::vector<IoResult> results_;
};

absl::Status ErrnoError(IoOp op, int err) {
  return McError(Code::kTransferFailed,
                 std::string(op == IoOp::kRead ? "pread: " : "pwrite: ") + std::strerror(err));
}

// SubmitAndWait runs the requests on the calling thread; Submit hands them to a few worker
// threads (started on first use) so the caller can go on while they run.
class PosixIoEngine final : public IoEngine {
 public:
  PosixIoEngine() = default;
  ~PosixIoEngine() override {
    std::vector<std::thread> workers;
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      workers.swap(workers_);
    }
    for (std::thread& t : workers) t.join();  // the queue is empty: every batch was waited for
  }

  std::vector<IoResult> SubmitAndWait(std::span<const IoRequest> requests) override {
    std::vector<IoResult> results;
    results.reserve(requests.size());
    for (const IoRequest& r : requests) results.push_back(RunOne(r));
    return results;
  }
  std::unique_ptr<IoBatch> Submit(std::span<const IoRequest> requests) override {
    auto batch = std::make_unique<Batch>();
    batch->requests.assign(requests.begin(), requests.end());
    batch->results.assign(requests.size(), IoResult(uint64_t{0}));
    batch->remaining = requests.size();
    std::future<void> done = batch->done.get_future();
    if (requests.empty()) {
      batch->done.set_value();
    } else {
      absl::MutexLock lock(&mu_);
      if (workers_.empty()) {
        for (int i = 0; i < kWorkers; ++i) workers_.emplace_back([this] { Work(); });
      }
      for (size_t i = 0; i < requests.size(); ++i) queue_.push_back({batch.get(), i});
    }
    return std::make_unique<internal::PendingBatch<Batch>>(std::move(batch), std::move(done));
  }
  std::string_view Name() const override { return "posix"; }

 private:
  static constexpr int kWorkers = 4;
  // Owned by its PendingBatch, which waits for the workers to be done with it before freeing it.
  struct Batch {
    std::vector<IoRequest> requests;
    std::vector<IoResult> results;  // element i written only by the worker that ran request i
    std::atomic<size_t> remaining{0};
    std::promise<void> done;  // set by the worker that finishes the last request
  };
  struct Job {
    Batch* batch;
    size_t index;
  };

  void Work() {
    while (true) {
      Job job{nullptr, 0};
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopped
        job = queue_.front();
        queue_.pop_front();
      }
      Batch* b = job.batch;
      b->results[job.index] = RunOne(b->requests[job.index]);
      if (b->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) b->done.set_value();
    }
  }

  static IoResult RunOne(const IoRequest& r) {
    uint64_t done = 0;
    while (done < r.length) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(r.length - done, 1u << 30));
      const off_t at = static_cast<off_t>(r.offset + done);
      ssize_t n = r.op == IoOp::kRead ? ::pread(r.fd, r.buffer + done, chunk, at)
                                      : ::pwrite(r.fd, r.buffer + done, chunk, at);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return ErrnoError(r.op, errno);
      }
      if (n == 0) {
        return McError(Code::kTransferFailed,
                       r.op == IoOp::kRead ? "short read (end of file)" : "short write");
      }
      done += static_cast<uint64_t>(n);
    }
    return done;
  }

  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<IoBatch> IoEngine::Submit(std::span<const IoRequest> requests) {
  return std::make_unique<CompletedBatch>(SubmitAndWait(requests));
}

std::unique_ptr<IoEngine> CreatePosixIoEngine() { return std::make_unique<PosixIoEngine>(); }

std::unique_ptr<IoEngine> CreateIoEngine(const IoEngineOptions& options) {
  static auto& log = Logger("offload");
  if (options.force_posix) {
    log.warn("io engine: io_uring disabled by option, using pread/pwrite");
    return CreatePosixIoEngine();
  }
  auto uring = CreateUringIoEngine(options.queue_depth);
  if (uring.ok()) return std::move(*uring);
  log.warn("io engine: io_uring unavailable ({}), falling back to pread/pwrite",
           std::string(uring.status().message()));
  return CreatePosixIoEngine();
}

}  // namespace mc::offload
