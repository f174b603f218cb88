// The io_uring engine: one ring, owned by one thread. Callers enqueue a batch and wait on its
// future; the ring thread keeps up to queue_depth requests in flight, resubmits the remainder of a
// short transfer, and completes the batch when its last request is done. A ring thread asleep in
// io_uring_submit_and_wait is woken for new work by a poll on an eventfd that Submit writes to, so
// a batch submitted while others are in flight starts at once (not at the next completion).
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

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
#include "offload/io_engine.h"
#include "offload/internal/pending_batch.h"

namespace mc::offload {
namespace {

constexpr uint64_t kMaxOpBytes = uint64_t{1} << 30;  // one SQE moves at most 1 GiB
// user_data of the eventfd poll (ops carry their Op*, never null).
constexpr uint64_t kKickTag = 0;

class UringIoEngine final : public IoEngine {
 public:
  explicit UringIoEngine(int depth) : depth_(depth) { std::memset(&ring_, 0, sizeof(ring_)); }
  // Sets up the ring in place and starts its thread; a negative errno when the kernel refuses.
  int Init() {
    kick_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (kick_fd_ < 0) return -errno;
    // One entry more than the depth: the eventfd poll is always armed beside depth_ requests.
    int rc = io_uring_queue_init(static_cast<unsigned>(depth_) + 1, &ring_, 0);
    if (rc < 0) return rc;
    initialized_ = true;
    thread_ = std::thread([this] { Loop(); });
    return 0;
  }
  ~UringIoEngine() override {
    if (initialized_) {
      {
        absl::MutexLock lock(&mu_);
        stop_ = true;
      }
      Kick();
      thread_.join();
      io_uring_queue_exit(&ring_);  // cancels the armed poll (it has no buffer)
    }
    if (kick_fd_ >= 0) ::close(kick_fd_);
  }

  std::vector<IoResult> SubmitAndWait(std::span<const IoRequest> requests) override {
    if (requests.empty()) return {};
    return Submit(requests)->Wait();
  }
  std::unique_ptr<IoBatch> Submit(std::span<const IoRequest> requests) override;
  std::string_view Name() const override { return "io_uring"; }

 private:
  struct Batch;
  struct Op {
    Batch* batch;
    IoRequest req;
    uint64_t done;  // bytes transferred so far
    iovec iov;
  };
  // Lives on the heap, owned by its PendingBatch, so it outlives the caller's stack frame, which
  // waits for the ring thread to be done with it before freeing it.
  struct Batch {
    std::vector<Op> ops;
    std::vector<IoResult> results;
    size_t remaining = 0;  // touched only by the ring thread once enqueued
    std::promise<void> done;
  };

  void Loop();
  bool TakeWork(bool block);
  // Under mu_, before sleeping in the kernel: false (do not sleep) when work arrived meanwhile.
  bool EnterKernelWait();
  void Kick();
  void ArmKick();
  void Prepare(Op* op, io_uring_sqe* sqe);
  void Complete(Op* op, int res);
  void Finish(Op* op, IoResult result);

  io_uring ring_;  // ring thread only (after Init)
  const int depth_;
  int kick_fd_ = -1;
  bool initialized_ = false;
  std::thread thread_;
  // Ring thread only:
  std::deque<Op*> ready_;
  int inflight_ = 0;
  bool kick_armed_ = false;  // the eventfd poll is in the ring

  absl::Mutex mu_;
  std::deque<Batch*> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The ring thread sleeps (or is about to) in io_uring_submit_and_wait: new work must kick it.
  bool in_kernel_wait_ ABSL_GUARDED_BY(mu_) = false;
};

std::unique_ptr<IoBatch> UringIoEngine::Submit(std::span<const IoRequest> requests) {
  auto batch = std::make_unique<Batch>();
  batch->results.assign(requests.size(), IoResult(uint64_t{0}));
  batch->ops.resize(requests.size());
  batch->remaining = requests.size();
  Batch* b = batch.get();
  for (size_t i = 0; i < requests.size(); ++i) b->ops[i] = Op{b, requests[i], 0, {}};
  std::future<void> done = b->done.get_future();
  if (requests.empty()) {
    b->done.set_value();
    return std::make_unique<internal::PendingBatch<Batch>>(std::move(batch), std::move(done));
  }
  bool kick = false;
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(b);
    kick = std::exchange(in_kernel_wait_, false);
  }
  if (kick) Kick();
  return std::make_unique<internal::PendingBatch<Batch>>(std::move(batch), std::move(done));
}

void UringIoEngine::Kick() {
  // EAGAIN only when the counter is saturated, which wakes the poll just as well.
  (void)::eventfd_write(kick_fd_, 1);
}

bool UringIoEngine::EnterKernelWait() {
  absl::MutexLock lock(&mu_);
  if (!queue_.empty()) return false;
  in_kernel_wait_ = true;
  return true;
}

void UringIoEngine::ArmKick() {
  if (kick_armed_) return;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return;  // the ring is full: the next completion wakes us anyway
  io_uring_prep_poll_add(sqe, kick_fd_, POLLIN);
  io_uring_sqe_set_data64(sqe, kKickTag);
  kick_armed_ = true;
}

// Moves queued batches into ready_; blocks for work when `block`. False once stopped and drained.
bool UringIoEngine::TakeWork(bool block) {
  absl::MutexLock lock(&mu_);
  if (block) {
    auto has_work = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
    mu_.Await(absl::Condition(&has_work));
  }
  if (stop_ && queue_.empty() && ready_.empty() && inflight_ == 0) return false;
  for (Batch* b : queue_) {
    for (Op& op : b->ops) ready_.push_back(&op);
  }
  queue_.clear();
  return true;
}

void UringIoEngine::Prepare(Op* op, io_uring_sqe* sqe) {
  const uint64_t left = op->req.length - op->done;
  op->iov.iov_base = op->req.buffer + op->done;
  op->iov.iov_len = static_cast<size_t>(std::min(left, kMaxOpBytes));
  const uint64_t at = op->req.offset + op->done;
  if (op->req.op == IoOp::kRead) {
    io_uring_prep_readv(sqe, op->req.fd, &op->iov, 1, at);
  } else {
    io_uring_prep_writev(sqe, op->req.fd, &op->iov, 1, at);
  }
  io_uring_sqe_set_data(sqe, op);
}

void UringIoEngine::Finish(Op* op, IoResult result) {
  Batch* b = op->batch;
  b->results[static_cast<size_t>(op - b->ops.data())] = std::move(result);
  if (--b->remaining == 0) b->done.set_value();  // the caller may free the batch from here on
}

void UringIoEngine::Complete(Op* op, int res) {
  const bool read = op->req.op == IoOp::kRead;
  if (res == -EINTR || res == -EAGAIN) {
    ready_.push_back(op);
  } else if (res < 0) {
    Finish(op, McError(Code::kTransferFailed,
                       std::string(read ? "io_uring read: " : "io_uring write: ") +
                           std::strerror(-res)));
  } else if (res == 0 && op->req.length > op->done) {
    Finish(op, McError(Code::kTransferFailed, read ? "short read (end of file)" : "short write"));
  } else {
    op->done += static_cast<uint64_t>(res);
    if (op->done < op->req.length) {
      ready_.push_back(op);  // resume a short transfer
    } else {
      Finish(op, op->done);
    }
  }
}

void UringIoEngine::Loop() {
  static auto& log = Logger("offload");
  while (TakeWork(/*block=*/ready_.empty() && inflight_ == 0)) {
    while (!ready_.empty() && inflight_ < depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      Op* op = ready_.front();
      ready_.pop_front();
      if (op->req.length == 0) {
        io_uring_prep_nop(sqe);  // keeps completion in one place
      } else {
        Prepare(op, sqe);
      }
      io_uring_sqe_set_data(sqe, op);
      ++inflight_;
    }
    if (inflight_ == 0) continue;
    // Sleep for a completion only when no batch is queued; Submit kicks the eventfd while we do.
    const bool wait = EnterKernelWait();
    if (wait) ArmKick();
    int rc = wait ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit(&ring_);
    if (wait) {
      absl::MutexLock lock(&mu_);
      in_kernel_wait_ = false;
    }
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      log.error("io_uring_submit_and_wait: {}", std::strerror(-rc));
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      if (io_uring_cqe_get_data64(cqe) == kKickTag) {
        kick_armed_ = false;
        eventfd_t ignored = 0;
        (void)::eventfd_read(kick_fd_, &ignored);  // reset the counter (non-blocking)
        continue;
      }
      --inflight_;
      Complete(static_cast<Op*>(io_uring_cqe_get_data(cqe)), cqe->res);
    }
    io_uring_cq_advance(&ring_, seen);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> CreateUringIoEngine(int queue_depth) {
  if (queue_depth < 1) queue_depth = 1;
  if (queue_depth > 4096) queue_depth = 4096;
  auto engine = std::make_unique<UringIoEngine>(queue_depth);
  int rc = engine->Init();
  if (rc < 0) {
    return McError(Code::kUnavailable, std::string("io_uring_queue_init: ") + std::strerror(-rc));
  }
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace mc::offload
