#include "client/batch/gpu_put_stager.h"

#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/status.h"
#include "transfer/cuda/gpu_mover.h"

namespace mc::client {

GpuPutStager::Staged::~Staged() = default;

GpuPutStager::Staged::Staged(Staged&& other) noexcept
    : bytes_(std::exchange(other.bytes_, 0)), leases_(std::move(other.leases_)) {}

GpuPutStager::GpuPutStager(transfer::cuda::CudaApi& api, transfer::cuda::GpuMover& mover,
                           GpuPutStagerOptions options, const Clock& clock,
                           transfer::GpuTransfers* direct)
    : mover_(mover),
      direct_(options.direct ? direct : nullptr),
      options_(options),
      clock_(clock),
      pool_(api, mover,
            GpuGetStagerOptions{.pool_bytes = options.max_staging_bytes,
                                .copy_timeout_ms = options.copy_timeout_ms,
                                .purpose = "puts",
                                .flag = "--gpu_put_staging_bytes"},
            clock) {}

GpuPutStager::Staged GpuPutStager::Stage(std::vector<PutRequestItem>& items) {
  return StageItems(items, /*allow_direct=*/direct_ != nullptr);
}

bool GpuPutStager::CanWriteDirect(const std::string& endpoint, const LocalBuffer& source) const {
  return direct_ != nullptr && direct_->CanWriteDirect(endpoint, source.data, source.length);
}

absl::StatusOr<GpuPutStager::HostCopy> GpuPutStager::StageForWrite(const PutRequestItem& item,
                                                                   uint64_t checksum) {
  std::vector<PutRequestItem> one(1);
  one[0].key = item.key;
  one[0].pieces = item.pieces;
  one[0].gpu = item.gpu;
  HostCopy copy{.staged = StageItems(one, /*allow_direct=*/false), .pieces = {}};
  if (!one[0].input_error.ok()) return one[0].input_error;
  if (one[0].pieces.size() != 1 || !one[0].checksum.has_value()) {
    return McError(Code::kInternal, "a GPU put source was not staged");
  }
  if (*one[0].checksum != checksum) {
    return McError(Code::kChecksumMismatch,
                   absl::StrFormat("the GPU source changed during the put (hashed %016x by the "
                                   "device before, %016x as staged now); not stored",
                                   checksum, *one[0].checksum));
  }
  copy.pieces = std::move(one[0].pieces);
  return copy;
}

// What StageItems plans before the device runs it.
struct GpuPutStager::Plan {
  struct Piece {
    size_t item;
    uint64_t offset;  // in the item's staging range
  };
  std::vector<Piece> pieces;   // GPU pieces being staged, in the order of `requests`
  std::vector<char*> host_of;  // per item: its staging range, or null
  std::vector<transfer::cuda::GpuMoveRequest> requests;
  std::vector<size_t> direct;  // items hashed for a direct put, in the order of `hashes`
  std::vector<transfer::cuda::GpuMoveRequest> hashes;
};

void GpuPutStager::PlanStaging(std::vector<PutRequestItem>& items, bool allow_direct,
                               Staged& staged, Plan& plan) {
  plan.host_of.assign(items.size(), nullptr);
  for (size_t i = 0; i < items.size(); ++i) {
    PutRequestItem& item = items[i];
    if (item.gpu.empty() || !item.input_error.ok()) continue;
    if (item.gpu.on_device.size() != item.pieces.size()) {
      item.input_error = McError(Code::kInternal, "a GPU put source's pieces do not match");
      continue;
    }
    const uint64_t length = TotalLength(item.pieces);
    if (length == 0) continue;  // nothing to stage; the putter refuses an empty payload
    if (allow_direct && item.gpu.single()) {
      // Written straight from GPU memory: the device's hash of the source is the checksum.
      transfer::cuda::GpuMoveRequest hash;
      hash.copies.push_back(transfer::cuda::CopyOp{item.pieces[0].data, nullptr, length});
      hash.hash_destination = true;
      hash.hash_only = true;
      plan.hashes.push_back(std::move(hash));
      plan.direct.push_back(i);
      continue;
    }
    // A range of the pinned pool, or UNAVAILABLE (in use by other puts: retry; not allocated;
    // device lost) / INVALID_ARGUMENT (larger than the pool), each naming the flag.
    absl::StatusOr<GpuGetStager::Lease> lease = pool_.Reserve(length);
    if (!lease.ok()) {
      item.input_error = lease.status();
      continue;
    }
    char* buffer = lease->data();
    staged.bytes_ += length;
    staged.leases_.push_back(*std::move(lease));
    // Host pieces are copied here; each GPU piece is copied by the device, which then hashes
    // its source range (after the copy, on the same stream).
    uint64_t offset = 0;
    for (size_t p = 0; p < item.pieces.size(); ++p) {
      const LocalBuffer& piece = item.pieces[p];
      if (piece.length > 0 && item.gpu.on_device[p]) {
        transfer::cuda::GpuMoveRequest request;
        request.copies.push_back(transfer::cuda::CopyOp{buffer + offset, piece.data, piece.length});
        request.hash_source = true;
        plan.requests.push_back(std::move(request));
        plan.pieces.push_back({i, offset});
      } else if (piece.length > 0) {
        std::memcpy(buffer + offset, piece.data, piece.length);
      }
      offset += piece.length;
    }
    plan.host_of[i] = buffer;
  }
}

void GpuPutStager::HashDirectSources(std::vector<PutRequestItem>& items, const Plan& plan,
                                     int64_t deadline_ms) {
  const std::vector<transfer::cuda::GpuMoveResult> hashed = mover_.Move(plan.hashes, deadline_ms);
  for (size_t h = 0; h < hashed.size(); ++h) {
    PutRequestItem& item = items[plan.direct[h]];
    if (!hashed[h].status.ok()) {
      item.input_error = hashed[h].status;
    } else if (!hashed[h].checksum.has_value()) {
      item.input_error = McError(Code::kTransferFailed, "cuda: no device hash of the source");
    } else {
      item.checksum = hashed[h].checksum;
      item.gpu_direct = true;
    }
  }
}

void GpuPutStager::CopyAndVerify(std::vector<PutRequestItem>& items, const Plan& plan,
                                 int64_t deadline_ms) {
  const std::vector<transfer::cuda::GpuMoveRequest>& requests = plan.requests;
  const std::vector<transfer::cuda::GpuMoveResult> results = mover_.Move(requests, deadline_ms);
  if (mover_.device_lost()) {
    // Streams that never drained may still write into the staging ranges: the pool takes none
    // back from now on and is never freed; every later Move fails at once, so this logs once.
    Logger("client").error(
        "GPU device lost while staging {} put source piece(s): the pinned put staging pool is "
        "left to the device, never reused nor freed; GPU puts and gets now fail (restart "
        "mc-client)",
        requests.size());
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    PutRequestItem& item = items[plan.pieces[r].item];
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
}

GpuPutStager::Staged GpuPutStager::StageItems(std::vector<PutRequestItem>& items,
                                              bool allow_direct) {
  Staged staged;
  Plan plan;
  PlanStaging(items, allow_direct, staged, plan);
  const int64_t deadline_ms = clock_.NowMs() + options_.copy_timeout_ms;
  if (!plan.hashes.empty()) HashDirectSources(items, plan, deadline_ms);
  if (plan.requests.empty()) return staged;
  CopyAndVerify(items, plan, deadline_ms);
  const std::vector<char*>& host_of = plan.host_of;
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
