#include "client/gpu_put_stager.h"

#include <chrono>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/status.h"
#include "transfer/cuda/gpu_mover.h"

namespace mc::client {

namespace {

// Host memory left to a lost device (it may still write into it): kept reachable for the life
// of the process, never freed.
void LeaveToLostDevice(std::vector<std::unique_ptr<char[]>>& buffers) {
  static absl::Mutex mu;
  static auto* kept = new std::vector<std::unique_ptr<char[]>>();
  absl::MutexLock lock(&mu);
  for (std::unique_ptr<char[]>& buffer : buffers) kept->push_back(std::move(buffer));
  buffers.clear();
}

}  // namespace

GpuPutStager::Staged::~Staged() {
  if (in_use_ != nullptr && bytes_ > 0) in_use_->fetch_sub(bytes_);
}

GpuPutStager::Staged::Staged(Staged&& other) noexcept
    : in_use_(std::exchange(other.in_use_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      buffers_(std::move(other.buffers_)) {}

GpuPutStager::GpuPutStager(transfer::cuda::GpuMover& mover, GpuPutStagerOptions options,
                           const Clock& clock)
    : mover_(mover), options_(options), clock_(clock) {}

GpuPutStager::Staged GpuPutStager::Stage(std::vector<PutRequestItem>& items) {
  Staged staged;
  staged.in_use_ = &in_use_;
  std::vector<size_t> which;  // items being staged, in the order of `requests`
  std::vector<transfer::cuda::GpuMoveRequest> requests;
  for (size_t i = 0; i < items.size(); ++i) {
    PutRequestItem& item = items[i];
    if (item.gpu == nullptr || !item.input_error.ok()) continue;
    if (item.pieces.size() != 1) {  // ResolveSlices hands a GPU source over as one range
      item.input_error = McError(Code::kInternal, "a GPU put source must be one range");
      continue;
    }
    const uint64_t length = item.pieces[0].length;
    if (length == 0) continue;  // nothing to stage; the putter refuses an empty payload
    if (length > options_.max_staging_bytes) {
      item.input_error = McError(
          Code::kInvalidArgument,
          absl::StrCat("a GPU put source of ", length, " bytes exceeds --gpu_put_staging_bytes=",
                       options_.max_staging_bytes, " (the host memory it is staged through)"));
      continue;
    }
    // Reserve the item's share of the budget, or fail it (retryable: other puts hold it).
    uint64_t used = in_use_.load();
    bool reserved = false;
    while (used + length <= options_.max_staging_bytes) {
      if (in_use_.compare_exchange_weak(used, used + length)) {
        reserved = true;
        break;
      }
    }
    if (!reserved) {
      item.input_error = McError(
          Code::kUnavailable,
          absl::StrCat("GPU put staging memory is in use by other puts (--gpu_put_staging_bytes=",
                       options_.max_staging_bytes, "); retry"));
      continue;
    }
    staged.bytes_ += length;
    std::unique_ptr<char[]> buffer(new (std::nothrow) char[length]);
    if (buffer == nullptr) {
      item.input_error = McError(Code::kUnavailable, "out of host memory to stage a GPU source");
      continue;
    }
    transfer::cuda::GpuMoveRequest request;
    request.copies.push_back(transfer::cuda::CopyOp{buffer.get(), item.pieces[0].data, length});
    request.hash_source = true;
    requests.push_back(std::move(request));
    which.push_back(i);
    staged.buffers_.push_back(std::move(buffer));
  }
  if (requests.empty()) return staged;
  const std::vector<transfer::cuda::GpuMoveResult> results =
      mover_.Move(requests, clock_.NowMs() + options_.copy_timeout_ms);
  if (mover_.device_lost()) {
    // Streams that never drained may still write into the staging memory: it is never freed
    // (nor its budget returned); every later Move fails at once, so this happens once.
    LeaveToLostDevice(staged.buffers_);
    staged.in_use_ = nullptr;
    Logger("client").error(
        "GPU device lost while staging {} put source(s): {} bytes of host staging memory are "
        "left to the device, never freed; GPU puts and gets now fail (restart mc-client)",
        requests.size(), staged.bytes_);
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    PutRequestItem& item = items[which[r]];
    const transfer::cuda::GpuMoveResult& result = results[r];
    const transfer::cuda::CopyOp& copy = requests[r].copies[0];
    if (!result.status.ok() || !result.checksum.has_value()) {
      item.input_error = result.status.ok()
                             ? McError(Code::kTransferFailed, "cuda: no device hash of the source")
                             : result.status;
      continue;
    }
    char* host = static_cast<char*>(copy.dst);
    const uint64_t on_host = Checksum(host, copy.length);
    if (on_host != *result.checksum) {
      item.input_error =
          McError(Code::kChecksumMismatch,
                  absl::StrFormat("the host copy of the GPU source differs from the device's bytes "
                                  "(device %016x, host %016x): a short copy, or the buffer changed "
                                  "during the put; not stored",
                                  *result.checksum, on_host));
      MC_LOG_EVERY(std::chrono::seconds(5), Logger("client"), warn,
                   "GPU put source of {} bytes: staged copy differs from the device: {}",
                   copy.length, std::string(item.input_error.message()));
      continue;
    }
    item.pieces[0] = LocalBuffer{host, copy.length};
    item.checksum = on_host;  // the putter need not hash the same bytes again
  }
  return staged;
}

}  // namespace mc::client
