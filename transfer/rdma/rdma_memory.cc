// RdmaTransport's memory regions: application memory and GPU memory registered for local use
// (its lkeys go into this daemon's own work requests), the segments exported to peers, and the
// pins that keep a local region registered while a request uses it (rdma_transport.h).
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "transfer/rdma/rdma_transport.h"

namespace mc::transfer::rdma {

absl::Status RdmaTransport::RegisterMemory(void* base, uint64_t length, MemoryAccess access) {
  if (base == nullptr || length == 0) {
    return McError(Code::kInvalidArgument, "rdma: empty memory registration");
  }
  absl::MutexLock lock(&mr_mu_);
  const uint64_t addr = reinterpret_cast<uint64_t>(base);
  if (local_mrs_.contains(addr)) {
    return McError(Code::kAlreadyExists, "rdma: memory at this address already registered");
  }
  absl::StatusOr<MemoryRegion> mr = device_->RegisterMemory(base, length, access);
  if (!mr.ok()) return mr.status();
  local_mrs_[addr] = LocalRegion{.mr = *mr, .access = access};
  return absl::OkStatus();
}

absl::Status RdmaTransport::RegisterDeviceMemory(uint64_t device_addr, uint64_t length,
                                                 int dmabuf_fd) {
  if (device_addr == 0 || length == 0 || dmabuf_fd < 0) {
    return McError(Code::kInvalidArgument, "rdma: empty device memory registration");
  }
  absl::MutexLock lock(&mr_mu_);
  if (local_mrs_.contains(device_addr)) {
    return McError(Code::kAlreadyExists, "rdma: memory at this address already registered");
  }
  absl::StatusOr<MemoryRegion> mr =
      device_->RegisterDmaBuf(dmabuf_fd, 0, length, device_addr, MemoryAccess::kLocal);
  if (!mr.ok()) return mr.status();
  local_mrs_[device_addr] = LocalRegion{.mr = *mr, .access = MemoryAccess::kLocal};
  return absl::OkStatus();
}

void RdmaTransport::UnregisterMemory(void* base) {
  absl::MutexLock lock(&mr_mu_);
  const uint64_t addr = reinterpret_cast<uint64_t>(base);
  auto it = local_mrs_.find(addr);
  if (it == local_mrs_.end() || it->second.closing) return;
  it->second.closing = true;  // no new request takes it; the running ones end first
  while (it->second.users > 0) {
    mr_released_.Wait(&mr_mu_);
    it = local_mrs_.find(addr);
  }
  device_->DeregisterMemory(it->second.mr);
  local_mrs_.erase(it);
}

size_t RdmaTransport::local_regions_for_test() const {
  absl::MutexLock lock(&mr_mu_);
  return local_mrs_.size();
}

absl::Status RdmaTransport::ExportSegment(uint64_t segment_id, char* base, uint64_t size) {
  if (base == nullptr || size == 0) {
    return McError(Code::kInvalidArgument, "rdma: empty segment");
  }
  absl::MutexLock lock(&mr_mu_);
  if (exported_.contains(segment_id)) {
    return McError(Code::kAlreadyExists,
                   absl::StrCat("rdma: segment ", segment_id, " already exported"));
  }
  absl::StatusOr<MemoryRegion> mr = device_->RegisterMemory(base, size, MemoryAccess::kRemote);
  if (!mr.ok()) return mr.status();
  exported_[segment_id] = *mr;
  return absl::OkStatus();
}

void RdmaTransport::UnexportSegment(uint64_t segment_id) {
  absl::MutexLock lock(&mr_mu_);
  auto it = exported_.find(segment_id);
  if (it == exported_.end()) return;
  device_->DeregisterMemory(it->second);
  exported_.erase(it);
}

const RdmaTransport::LocalRegion* RdmaTransport::FindLocal(const char* data, uint64_t length,
                                                           bool any) const {
  const uint64_t addr = reinterpret_cast<uint64_t>(data);
  auto it = local_mrs_.upper_bound(addr);
  if (it == local_mrs_.begin()) return nullptr;
  --it;
  const MemoryRegion& mr = it->second.mr;
  if (addr < mr.addr || length > mr.length || addr - mr.addr > mr.length - length) return nullptr;
  if (it->second.closing && !any) return nullptr;
  return &it->second;
}

absl::StatusOr<uint32_t> RdmaTransport::PinLocal(const char* data, uint64_t length,
                                                 std::vector<uint64_t>* held) {
  absl::MutexLock lock(&mr_mu_);
  const LocalRegion* region = FindLocal(data, length, false);
  if (region == nullptr) {
    return McError(Code::kInvalidArgument,
                   "rdma: local buffer is not inside registered memory (or it is being "
                   "unregistered)");
  }
  ++local_mrs_[region->mr.addr].users;
  held->push_back(region->mr.addr);
  return region->mr.lkey;
}

void RdmaTransport::UnpinLocal(const std::vector<uint64_t>& held) {
  if (held.empty()) return;
  absl::MutexLock lock(&mr_mu_);
  for (uint64_t addr : held) {
    auto it = local_mrs_.find(addr);
    if (it != local_mrs_.end() && it->second.users > 0) --it->second.users;
  }
  mr_released_.SignalAll();
}

bool RdmaTransport::LocalBuffersRegistered(const TransferRequest& request) const {
  absl::MutexLock lock(&mr_mu_);
  for (const LocalBuffer& b : request.local) {
    if (b.length > 0 && FindLocal(b.data, b.length, false) == nullptr) return false;
  }
  return true;
}

}  // namespace mc::transfer::rdma
