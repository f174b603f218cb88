#include "transfer/cuda/cuda_transport.h"

#include <utility>
#include <vector>

#include "common/checksum.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace mc::transfer::cuda {

CudaTransport::CudaTransport(CudaTransportOptions options, std::unique_ptr<CudaApi> api,
                             SegmentTable& segments)
    : options_(std::move(options)), api_(std::move(api)), segments_(segments) {}

absl::StatusOr<std::unique_ptr<CudaTransport>> CudaTransport::Create(CudaTransportOptions options,
                                                                     std::unique_ptr<CudaApi> api,
                                                                     SegmentTable& segments) {
  std::unique_ptr<CudaTransport> t(new CudaTransport(std::move(options), std::move(api), segments));
  MC_ASSIGN_OR_RETURN(t->mover_, GpuMover::Create(*t->api_, t->options_.mover));
  return t;
}

CudaTransport::~CudaTransport() {
  mover_.reset();  // before the api it uses
  absl::MutexLock lock(&mu_);
  for (auto& [base, length] : pinned_) api_->HostUnregister(base);
}

absl::Status CudaTransport::RegisterMemory(void* base, uint64_t length, MemoryAccess /*access*/) {
  if (absl::Status s = api_->HostRegister(base, length); !s.ok()) {
    Logger("transfer")
        .warn("cuda: cannot pin {} bytes at {} ({}); GPU copies will be staged", length, base,
              s.ToString());
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  pinned_[base] = length;
  return absl::OkStatus();
}

void CudaTransport::UnregisterMemory(void* base) {
  {
    absl::MutexLock lock(&mu_);
    if (pinned_.erase(base) == 0) return;
  }
  api_->HostUnregister(base);
}

void CudaTransport::AddDeviceRange(uint64_t base, uint64_t length) {
  absl::MutexLock lock(&mu_);
  device_ranges_[base] = length;
}

void CudaTransport::RemoveDeviceRange(uint64_t base) {
  absl::MutexLock lock(&mu_);
  device_ranges_.erase(base);
}

bool CudaTransport::IsDevice(const char* p, uint64_t length) const {
  const auto addr = reinterpret_cast<uint64_t>(p);
  absl::MutexLock lock(&mu_);
  auto it = device_ranges_.upper_bound(addr);
  if (it == device_ranges_.begin()) return false;
  --it;
  return addr - it->first <= it->second && length <= it->second - (addr - it->first);
}

bool CudaTransport::HandlesRequest(const TransferRequest& request) const {
  for (const LocalBuffer& b : request.local) {
    if (IsDevice(b.data, b.length)) return true;
  }
  return false;
}

void CudaTransport::Submit(std::span<const TransferRequest* const> requests,
                           std::span<TransferResult> results, int64_t deadline_ms) {
  std::vector<GpuMoveRequest> moves;
  std::vector<size_t> index;  // move -> request
  std::vector<bool> host_hash(requests.size(), false);
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = *requests[i];
    if (r.op == OpKind::kReadDisk || r.op == OpKind::kIndex || options_.local_endpoint.empty() ||
        r.endpoint != options_.local_endpoint) {
      results[i].status = McError(Code::kTransferFailed,
                                  "cuda: moves GPU memory to and from this daemon's memory "
                                  "segments only (BatchGet stages other replicas through host "
                                  "memory; GPUDirect RDMA is not done)");
      continue;
    }
    const uint64_t total = TotalLength(r);
    absl::StatusOr<char*> seg = segments_.Resolve(r.segment_id, r.offset, total);
    if (!seg.ok()) {
      results[i].status = seg.status();
      continue;
    }
    GpuMoveRequest m;
    uint64_t pos = 0;
    bool all_host = true;
    for (const LocalBuffer& b : r.local) {
      if (b.length == 0) continue;
      if (IsDevice(b.data, b.length)) all_host = false;
      if (r.op == OpKind::kRead) {
        m.copies.push_back(CopyOp{b.data, *seg + pos, b.length});
      } else {
        m.copies.push_back(CopyOp{*seg + pos, b.data, b.length});
      }
      pos += b.length;
    }
    if (r.op == OpKind::kRead && r.want_checksum) {
      if (all_host) {
        host_hash[i] = true;  // hashed on the CPU from the destination below
      } else if (m.copies.size() == 1) {
        m.hash_destination = true;
      } else {
        results[i].status = McError(Code::kInvalidArgument,
                                    "cuda: a checksum of a scattered device destination is not "
                                    "supported; use one contiguous slice");
        continue;
      }
    }
    moves.push_back(std::move(m));
    index.push_back(i);
  }
  std::vector<GpuMoveResult> moved = mover_->Move(moves, deadline_ms);
  for (size_t k = 0; k < moved.size(); ++k) {
    const size_t i = index[k];
    TransferResult& out = results[i];
    out.status = std::move(moved[k].status);
    out.bytes = moved[k].bytes;
    out.checksum = moved[k].checksum;
    if (out.status.ok() && host_hash[i]) {
      StreamingChecksum sum;
      for (const LocalBuffer& b : requests[i]->local) sum.Update(b.data, b.length);
      out.checksum = sum.Digest();
    }
  }
}

}  // namespace mc::transfer::cuda
