#include "transfer/cuda/cuda_transport.h"

#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace mc::transfer::cuda {
namespace {

// The one non-empty local buffer of `r`, or null when it has none or several.
const LocalBuffer* OnlyBuffer(const TransferRequest& r) {
  const LocalBuffer* only = nullptr;
  for (const LocalBuffer& b : r.local) {
    if (b.length == 0) continue;
    if (only != nullptr) return nullptr;
    only = &b;
  }
  return only;
}

bool IsRead(const TransferRequest& r) { return r.direction == Direction::kRead; }

}  // namespace

CudaTransport::CudaTransport(CudaTransportOptions options, std::unique_ptr<CudaApi> api,
                             SegmentTable& segments)
    : options_(std::move(options)), api_(std::move(api)), segments_(segments) {
  if (options_.metrics != nullptr) {
    direct_bytes_ = &options_.metrics->GetCounter(
        "mc_gpu_direct_rdma_bytes_total",
        "Bytes read from remote replicas straight into GPU memory over GPUDirect RDMA, each "
        "read proved by the device hash.");
    direct_write_bytes_ = &options_.metrics->GetCounter(
        "mc_gpu_direct_rdma_write_bytes_total",
        "Bytes written from GPU memory straight to remote replicas over GPUDirect RDMA, each "
        "source proved unchanged by the device hash after the NIC read it.");
    direct_regions_ = &options_.metrics->GetGauge(
        "mc_gpu_direct_rdma_regions", "GPU buffers registered with the NIC for GPUDirect RDMA.");
  }
}

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

absl::Status CudaTransport::RegisterMemory(void* base, uint64_t length, MemoryAccess access) {
  if (access != MemoryAccess::kRemote) return absl::OkStatus();  // not a segment: not pinned
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

absl::StatusOr<bool> CudaTransport::RegisterRdmaDirect(uint64_t device_addr, uint64_t length) {
  const GpuDirectRdma mode = options_.gpu_direct_rdma;
  if (mode == GpuDirectRdma::kOff) return false;
  auto refuse = [&](std::string_view why) -> absl::StatusOr<bool> {
    if (mode == GpuDirectRdma::kOn) {
      return McError(Code::kUnavailable,
                     absl::StrCat("gpu buffer: GPUDirect RDMA is required (--gpu_direct_rdma=on) "
                                  "and unavailable: ",
                                  std::string(why)));
    }
    // A vLLM engine registers a buffer per KV storage: say it once, then only at debug.
    const bool first = !direct_refusal_logged_.exchange(true);
    Logger("transfer")
        .log(first ? spdlog::level::warn : spdlog::level::debug,
             "cuda: no GPUDirect RDMA for a GPU buffer ({}); its remote replicas "
             "are staged through pinned host memory",
             why);
    return false;
  };
  if (rdma_ == nullptr) {
    if (mode == GpuDirectRdma::kAuto) return false;  // tcp only: staging is the only way
    return refuse("no rdma transport (--transport=tcp, no verbs device, or built without verbs)");
  }
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (device_addr % page != 0) return refuse("the allocation does not start on a page boundary");
  // Whole pages of the import only: a partial last page would export bytes past the allocation
  // (the driver refuses that, and it is not ours to hand a NIC); reads into it are staged.
  const uint64_t whole = length / page * page;
  if (whole == 0) return refuse("the allocation is smaller than a page");
  absl::StatusOr<int> fd = api_->ExportDmaBuf(options_.mover.device, device_addr, whole);
  if (!fd.ok()) return refuse(fd.status().ToString());
  const absl::Status registered = rdma_->RegisterDeviceMemory(device_addr, whole, *fd);
  close(*fd);  // the NIC's registration holds the dma-buf itself
  if (!registered.ok()) return refuse(registered.ToString());
  if (direct_regions_ != nullptr) direct_regions_->Add(1);
  Logger("transfer").debug("cuda: GPUDirect RDMA region of {} bytes registered", whole);
  return true;
}

void CudaTransport::UnregisterRdmaDirect(uint64_t device_addr) {
  if (rdma_ == nullptr) return;
  rdma_->UnregisterMemory(reinterpret_cast<void*>(device_addr));
  if (direct_regions_ != nullptr) direct_regions_->Add(-1);
}

const LocalBuffer* CudaTransport::DirectBuffer(const TransferRequest& r) const {
  if (rdma_ == nullptr || options_.gpu_direct_rdma == GpuDirectRdma::kOff ||
      AsSegmentRange(r) == nullptr) {
    return nullptr;
  }
  const LocalBuffer* only = OnlyBuffer(r);  // the device hash covers one contiguous range
  if (only == nullptr || !IsDevice(only->data, only->length)) return nullptr;
  return rdma_->LocalBuffersRegistered(r) ? only : nullptr;
}

bool CudaTransport::CanReadDirect(const std::string& endpoint, const char* data, uint64_t length) {
  const TransferRequest r{
      Direction::kRead, {LocalBuffer{const_cast<char*>(data), length}}, endpoint, SegmentRange{}};
  return DirectBuffer(r) != nullptr && rdma_->PeerReachable(endpoint);
}

bool CudaTransport::CanWriteDirect(const std::string& endpoint, const char* data, uint64_t length) {
  if (!options_.local_endpoint.empty() && endpoint == options_.local_endpoint) {
    return IsDevice(data, length);  // a copy into this daemon's own segment
  }
  const TransferRequest r{
      Direction::kWrite, {LocalBuffer{const_cast<char*>(data), length}}, endpoint, SegmentRange{}};
  return DirectBuffer(r) != nullptr && rdma_->PeerReachable(endpoint);
}

bool CudaTransport::Claims(const TransferRequest& request) {
  for (const LocalBuffer& b : request.local) {
    if (IsDevice(b.data, b.length)) return true;
  }
  return false;
}

void CudaTransport::Submit(std::span<const TransferRequest* const> requests,
                           std::span<TransferResult> results, int64_t deadline_ms) {
  std::vector<GpuMoveRequest> moves;
  std::vector<size_t> index;                            // move -> request
  std::vector<size_t> direct;                           // requests served over GPUDirect RDMA
  std::vector<bool> host_hash(requests.size(), false);  // a READ's all-host destination
  // A WRITE asked for a checksum: its segment range, hashed on the CPU after the copy.
  std::vector<const char*> written(requests.size(), nullptr);
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = *requests[i];
    const SegmentRange* range = AsSegmentRange(r);
    if (range == nullptr || options_.local_endpoint.empty() ||
        r.endpoint != options_.local_endpoint) {
      if (DirectBuffer(r) != nullptr && rdma_->PeerReachable(r.endpoint)) {
        direct.push_back(i);
        continue;
      }
      results[i].status = McError(Code::kTransferFailed,
                                  "cuda: moves GPU memory to and from this daemon's memory "
                                  "segments, and remote memory replicas over GPUDirect RDMA "
                                  "to and from one registered GPU range, nothing else (BatchGet "
                                  "and BatchPut stage the others through host memory)");
      continue;
    }
    const uint64_t total = TotalLength(r);
    absl::StatusOr<char*> seg = segments_.Resolve(range->segment_id, range->offset, total);
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
      if (r.direction == Direction::kRead) {
        m.copies.push_back(CopyOp{b.data, *seg + pos, b.length});
      } else {
        m.copies.push_back(CopyOp{*seg + pos, b.data, b.length});
      }
      pos += b.length;
    }
    if (r.proof == Proof::kWrittenReplica) {
      written[i] = *seg;  // the replica as written: this daemon's own (host) memory
    } else if (r.proof == Proof::kDeliveredBytes) {
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
  if (!direct.empty()) SubmitDirect(requests, results, direct, deadline_ms);
  if (moves.empty()) return;
  std::vector<GpuMoveResult> moved = mover_->Move(moves, deadline_ms);
  for (size_t k = 0; k < moved.size(); ++k) {
    const size_t i = index[k];
    TransferResult& out = results[i];
    out.status = std::move(moved[k].status);
    out.bytes = moved[k].bytes;
    out.checksum = moved[k].checksum;
    if (out.status.ok() && written[i] != nullptr) out.checksum = Checksum(written[i], out.bytes);
    if (out.status.ok() && host_hash[i]) {
      StreamingChecksum sum;
      for (const LocalBuffer& b : requests[i]->local) sum.Update(b.data, b.length);
      out.checksum = sum.Digest();
    }
  }
}

void CudaTransport::SubmitDirect(std::span<const TransferRequest* const> requests,
                                 std::span<TransferResult> results,
                                 const std::vector<size_t>& direct, int64_t deadline_ms) {
  // The rdma transport would hash a destination on the CPU: GPU memory is hashed on the device.
  // READs into GPU memory and WRITEs from it, as sent to the rdma transport.
  std::vector<TransferRequest> sent;
  sent.reserve(direct.size());
  for (size_t i : direct) {
    sent.push_back(*requests[i]);
    sent.back().proof = Proof::kNone;
  }
  std::vector<const TransferRequest*> ptrs;
  for (const TransferRequest& r : sent) ptrs.push_back(&r);
  std::vector<TransferResult> got(sent.size());
  rdma_->Submit(ptrs, got, deadline_ms);

  std::vector<size_t> landed;  // indexes into `sent`
  for (size_t k = 0; k < sent.size(); ++k) {
    TransferResult& out = results[direct[k]];
    out.bytes = got[k].bytes;
    if (got[k].status.ok() && got[k].bytes == TotalLength(sent[k])) {
      landed.push_back(k);
    } else {
      out.status = got[k].status.ok() ? McError(Code::kTransferFailed, "rdma: short transfer")
                                      : got[k].status;
    }
  }
  if (landed.empty()) return;
  // The NIC's completions were seen; the device must see the bytes before it hashes them (the
  // WRITEs' sources were only read by the NIC: nothing to flush for them).
  const bool wrote_gpu =
      std::any_of(landed.begin(), landed.end(), [&](size_t k) { return IsRead(sent[k]); });
  if (absl::Status s = wrote_gpu ? api_->FlushRdmaWrites(options_.mover.device) : absl::OkStatus();
      !s.ok()) {
    for (size_t k : landed) {
      if (!IsRead(sent[k])) continue;
      results[direct[k]].status =
          McError(Code::kTransferFailed,
                  absl::StrCat("cuda: flushing GPUDirect RDMA writes failed: ", s.message()));
    }
    std::erase_if(landed, [&](size_t k) { return IsRead(sent[k]); });
  }
  std::vector<GpuMoveRequest> hashes;
  std::vector<size_t> hashed;  // indexes into `sent`
  for (size_t k : landed) {
    TransferResult& out = results[direct[k]];
    if (requests[direct[k]]->proof == Proof::kNone) {
      out.status = absl::OkStatus();
      CountDirect(IsRead(sent[k]), out.bytes);
      continue;
    }
    // Submit chose it; the caller holds the GPU buffer until Submit returns (client/: a
    // GpuBufferRef), so it is still imported and registered. A READ's destination is hashed; a
    // WRITE's source, after the NIC read it (what it holds now is what was sent, unless it was
    // changed and changed back meanwhile: the caller compares with the hash taken before).
    const LocalBuffer* dst = OnlyBuffer(sent[k]);
    GpuMoveRequest m;
    m.copies.push_back(CopyOp{dst->data, nullptr, dst->length});
    m.hash_destination = true;
    m.hash_only = true;
    hashes.push_back(std::move(m));
    hashed.push_back(k);
  }
  std::vector<GpuMoveResult> proved = mover_->Move(hashes, deadline_ms);
  for (size_t h = 0; h < proved.size(); ++h) {
    TransferResult& out = results[direct[hashed[h]]];
    out.status = std::move(proved[h].status);
    out.checksum = proved[h].checksum;
    if (out.status.ok()) CountDirect(IsRead(sent[hashed[h]]), out.bytes);
  }
}

void CudaTransport::CountDirect(bool read, uint64_t bytes) {
  (read ? direct_reads_ : direct_writes_).fetch_add(1);
  Counter* counter = read ? direct_bytes_ : direct_write_bytes_;
  if (counter != nullptr) counter->Inc(bytes);
}

}  // namespace mc::transfer::cuda
