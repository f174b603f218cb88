#include "client/gpu_put_stager.h"

#include <chrono>
#include <cstring>
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
  struct Piece {
    size_t item;
    uint64_t offset;  // in the item's staging buffer
  };
  std::vector<Piece> pieces;  // GPU pieces being staged, in the order of `requests`
  std::vector<char*> host_of(items.size(), nullptr);
  std::vector<transfer::cuda::GpuMoveRequest> requests;
  for (size_t i = 0; i < items.size(); ++i) {
    PutRequestItem& item = items[i];
    if (item.gpu.empty() || !item.input_error.ok()) continue;
    if (item.gpu.on_device.size() != item.pieces.size()) {
      item.input_error = McError(Code::kInternal, "a GPU put source's pieces do not match");
      continue;
    }
    const uint64_t length = TotalLength(item.pieces);
    if (length == 0) continue;  // nothing to stage; the putter refuses an empty payload
    if (length > options_.max_staging_bytes) {
      item.input_error = McError(
          Code::kInvalidArgument,
          absl::StrCat("a put source with GPU memory of ", length,
                       " bytes exceeds --gpu_put_staging_bytes=", options_.max_staging_bytes,
                       " (the host memory it is staged through)"));
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
    // Host pieces are copied here; each GPU piece is copied by the device, which then hashes
    // its source range (after the copy, on the same stream).
    uint64_t offset = 0;
    for (size_t p = 0; p < item.pieces.size(); ++p) {
      const LocalBuffer& piece = item.pieces[p];
      if (piece.length > 0 && item.gpu.on_device[p]) {
        transfer::cuda::GpuMoveRequest request;
        request.copies.push_back(
            transfer::cuda::CopyOp{buffer.get() + offset, piece.data, piece.length});
        request.hash_source = true;
        requests.push_back(std::move(request));
        pieces.push_back({i, offset});
      } else if (piece.length > 0) {
        std::memcpy(buffer.get() + offset, piece.data, piece.length);
      }
      offset += piece.length;
    }
    host_of[i] = buffer.get();
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
        "GPU device lost while staging {} put source piece(s): {} bytes of host staging memory "
        "are left to the device, never freed; GPU puts and gets now fail (restart mc-client)",
        requests.size(), staged.bytes_);
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    PutRequestItem& item = items[pieces[r].item];
    if (!item.input_error.ok()) continue;  // an earlier piece of the item failed
    const transfer::cuda::GpuMoveResult& result = results[r];
    const transfer::cuda::CopyOp& copy = requests[r].copies[0];
    if (!result.status.ok() || !result.checksum.has_value()) {
      item.input_error = result.status.ok()
                             ? McError(Code::kTransferFailed, "cuda: no device hash of the source")
                             : result.status;
      continue;
    }
    const uint64_t on_host = Checksum(static_cast<const char*>(copy.dst), copy.length);
    if (on_host != *result.checksum) {
      item.input_error =
          McError(Code::kChecksumMismatch,
                  absl::StrFormat("the host copy of a GPU source differs from the device's bytes "
                                  "(device %016x, host %016x): a short copy, or the buffer changed "
                                  "during the put; not stored",
                                  *result.checksum, on_host));
      MC_LOG_EVERY(std::chrono::seconds(5), Logger("client"), warn,
                   "GPU put source of {} bytes: staged copy differs from the device: {}",
                   copy.length, std::string(item.input_error.message()));
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    PutRequestItem& item = items[i];
    if (host_of[i] == nullptr || !item.input_error.ok()) continue;
    const uint64_t length = TotalLength(item.pieces);
    item.pieces = {LocalBuffer{host_of[i], length}};
    item.checksum = Checksum(host_of[i], length);  // the putter need not hash the bytes again
  }
  return staged;
}

}  // namespace mc::client
