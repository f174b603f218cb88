#include "client/buffer_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc::client {

MappedBuffer::~MappedBuffer() { munmap(base_, size_); }

absl::StatusOr<uint64_t> BufferRegistry::Register(const std::string& shm_name, uint64_t size) {
  if (shm_name.empty() || shm_name.size() > 255 || shm_name.find('/', 1) != std::string::npos) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("bad shm name '", shm_name, "' (expected \"/name\")"));
  }
  int fd = shm_open(shm_name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return McError(Code::kNotFound,
                   absl::StrCat("shm_open(", shm_name, "): ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return McError(Code::kInternal, absl::StrCat("fstat(", shm_name, "): ", std::strerror(err)));
  }
  uint64_t object_size = static_cast<uint64_t>(st.st_size);
  if (size == 0) size = object_size;
  if (size == 0 || size > object_size) {
    close(fd);
    return McError(Code::kInvalidArgument,
                   absl::StrCat("buffer size ", size, " but shm object ", shm_name, " has ",
                                object_size, " bytes"));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    return McError(Code::kInternal, absl::StrCat("mmap(", shm_name, "): ", std::strerror(err)));
  }
  auto buffer = std::make_shared<const MappedBuffer>(shm_name, static_cast<char*>(base), size);
  absl::MutexLock lock(&mu_);
  if (buffers_.size() >= max_buffers_) {
    return McError(Code::kNoSpace, absl::StrCat("more than ", max_buffers_, " buffers"));
  }
  uint64_t id = next_id_++;
  buffers_.emplace(id, std::move(buffer));
  Logger("client").info("registered buffer {} = {} ({} bytes)", id, shm_name, size);
  return id;
}

absl::Status BufferRegistry::Unregister(uint64_t buffer_id) {
  BufferRef doomed;  // unmapped outside the lock, or later by the last in-flight user
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) {
    return McError(Code::kNotFound, absl::StrCat("unknown buffer id ", buffer_id));
  }
  doomed = std::move(it->second);
  buffers_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<char*> BufferRegistry::Resolve(uint64_t buffer_id, uint64_t offset,
                                              uint64_t length, BufferRef* ref) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) {
    return McError(Code::kInvalidArgument, absl::StrCat("unknown buffer id ", buffer_id));
  }
  const MappedBuffer& buf = *it->second;
  if (offset > buf.size() || length > buf.size() - offset) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("slice [", offset, ", +", length, ") outside buffer ", buffer_id,
                                " of ", buf.size(), " bytes"));
  }
  *ref = it->second;
  return buf.base() + offset;
}

size_t BufferRegistry::Count() const {
  absl::MutexLock lock(&mu_);
  return buffers_.size();
}

}  // namespace mc::client
