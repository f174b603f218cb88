#include "client/gpu/gpu_buffers.h"

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace mc::client {

using transfer::cuda::GpuHandleKind;

GpuBuffer::~GpuBuffer() {
  if (transport_ != nullptr) transport_->RemoveDeviceRange(base_);
  // Waits for reads still landing through the NIC; the import closes after.
  if (rdma_direct_) transport_->UnregisterRdmaDirect(memory_.device_addr);
  api_.CloseImported(device_, memory_);
}

absl::StatusOr<uint64_t> GpuBufferRegistry::Register(const GpuBufferSpec& spec,
                                                     const std::string& owner) {
  if (spec.size == 0) return McError(Code::kInvalidArgument, "gpu buffer: size 0");
  uint64_t end = 0;
  if (!CheckedAdd(spec.allocation_offset, spec.size, &end)) {
    return McError(Code::kInvalidArgument, "gpu buffer: offset + size overflows");
  }
  switch (spec.kind) {
    case GpuHandleKind::kCudaIpc:
      if (spec.handle.size() != 64) {
        return McError(Code::kInvalidArgument, "gpu buffer: a CUDA IPC handle has 64 bytes");
      }
      break;
    case GpuHandleKind::kPosixFd:
      if (spec.fd < 0) return McError(Code::kInvalidArgument, "gpu buffer: no fd passed");
      break;
    default:
      return McError(Code::kInvalidArgument, "gpu buffer: unknown handle kind");
  }
  MC_ASSIGN_OR_RETURN(const int devices, api_.DeviceCount());
  if (spec.device < 0 || spec.device >= devices) {
    return McError(Code::kInvalidArgument, "gpu buffer: no device " + std::to_string(spec.device));
  }
  MC_RETURN_IF_ERROR(Reserve(owner));
  absl::StatusOr<transfer::cuda::ImportedMemory> imported =
      api_.Import(spec.device, spec.kind, spec.handle, spec.fd, end);
  if (imported.ok() && imported->size < end) {
    // The seam promises this; a wrong answer must not widen the range.
    api_.CloseImported(spec.device, *imported);
    imported = McError(Code::kInvalidArgument, "gpu buffer: range outside the exported allocation");
  }
  if (!imported.ok()) {
    absl::MutexLock lock(&mu_);
    UnreserveLocked(owner);
    return imported.status();
  }
  const transfer::cuda::ImportedMemory memory = *imported;
  bool rdma_direct = false;
  if (transport_ != nullptr) {
    absl::StatusOr<bool> direct = transport_->RegisterRdmaDirect(memory.device_addr, memory.size);
    if (!direct.ok()) {
      api_.CloseImported(spec.device, memory);
      absl::MutexLock lock(&mu_);
      UnreserveLocked(owner);
      return direct.status();
    }
    rdma_direct = *direct;
  }
  auto buffer = std::make_shared<const GpuBuffer>(api_, transport_, spec.device, memory,
                                                  memory.device_addr + spec.allocation_offset,
                                                  spec.size, rdma_direct);
  if (transport_ != nullptr) transport_->AddDeviceRange(buffer->base(), buffer->size());
  absl::MutexLock lock(&mu_);
  const uint64_t id = kGpuBufferIdBit | next_id_++;
  buffers_[id] = Entry{std::move(buffer), owner};
  return id;
}

absl::Status GpuBufferRegistry::Reserve(const std::string& owner) {
  absl::MutexLock lock(&mu_);
  if (slots_ >= max_buffers_) {
    return McError(Code::kNoSpace,
                   absl::StrCat("gpu buffer: ", max_buffers_,
                                " buffers registered with this mc-client (--gpu_max_buffers)"));
  }
  size_t& mine = owner_slots_[owner];
  if (mine >= max_per_owner_) {
    return McError(Code::kNoSpace,
                   absl::StrCat("gpu buffer: this caller has ", mine,
                                " buffers registered (--gpu_max_buffers_per_caller)"));
  }
  ++mine;
  ++slots_;
  return absl::OkStatus();
}

void GpuBufferRegistry::UnreserveLocked(const std::string& owner) {
  --slots_;
  auto it = owner_slots_.find(owner);
  if (it != owner_slots_.end() && --it->second == 0) owner_slots_.erase(it);
}

absl::Status GpuBufferRegistry::Unregister(uint64_t buffer_id, std::string_view owner) {
  GpuBufferRef dropped;  // released after the lock: the last reference closes the import
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end() || it->second.owner != owner) {
    return McError(Code::kNotFound, "gpu buffer: unknown id");
  }
  dropped = std::move(it->second.buffer);
  UnreserveLocked(it->second.owner);
  buffers_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> GpuBufferRegistry::Resolve(uint64_t buffer_id, uint64_t offset,
                                                    uint64_t length, GpuBufferRef* ref,
                                                    std::string_view owner) const {
  GpuBufferRef buffer;
  {
    absl::MutexLock lock(&mu_);
    auto it = buffers_.find(buffer_id);
    if (it == buffers_.end() || it->second.owner != owner) {
      return McError(Code::kInvalidArgument, "gpu buffer: unknown id");
    }
    buffer = it->second.buffer;
  }
  if (offset > buffer->size() || length > buffer->size() - offset) {
    return McError(Code::kInvalidArgument, "gpu buffer: slice outside the buffer");
  }
  const uint64_t addr = buffer->base() + offset;
  *ref = std::move(buffer);
  return addr;
}

size_t GpuBufferRegistry::ReleaseOwner(std::string_view owner) {
  std::vector<GpuBufferRef> dropped;  // released after the lock, as in Unregister
  absl::MutexLock lock(&mu_);
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    if (it->second.owner == owner) {
      dropped.push_back(std::move(it->second.buffer));
      UnreserveLocked(it->second.owner);
      buffers_.erase(it++);
    } else {
      ++it;
    }
  }
  return dropped.size();
}

size_t GpuBufferRegistry::Count() const {
  absl::MutexLock lock(&mu_);
  return buffers_.size();
}

}  // namespace mc::client
