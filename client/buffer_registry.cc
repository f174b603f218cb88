#include "client/buffer_registry.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc::client {
namespace {

// The SIGBUS guard. Each mapped buffer owns one slot: its address range and a broken flag. The
// handler reads slots lock-free (only atomics, mmap and sigaction: async-signal-safe); slots are
// handed out and returned under a mutex. A slot's range is published (end, then begin) after
// mmap and withdrawn (begin = 0) before munmap. A thread faulting inside a buffer holds a
// reference to it, so the range it faults in stays mapped while the handler repairs it.
constexpr int kGuardSlots = 16384;

struct GuardSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> broken{false};
  std::atomic<bool> logged{false};
};

GuardSlot g_slots[kGuardSlots];
std::atomic<uint64_t> g_faults{0};
struct sigaction g_previous {};
std::once_flag g_install_once;
absl::Mutex g_slots_mu;
bool g_slot_used[kGuardSlots] ABSL_GUARDED_BY(g_slots_mu) = {};

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardSlot& slot : g_slots) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin) continue;
    const uintptr_t end = slot.end.load(std::memory_order_acquire);
    if (addr >= end) continue;
    // The object shrank under the mapping: put private zero pages over the whole buffer so the
    // faulting copy (and any other on this buffer) completes, and mark the buffer broken.
    void* p = mmap(reinterpret_cast<void*>(begin), end - begin, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) break;
    slot.broken.store(true, std::memory_order_release);
    g_faults.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Not ours: whoever handled SIGBUS before (a sanitizer), else the default action (a core).
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
      g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);  // returning re-runs the access, which now kills us
}

void InstallGuard() {
  std::call_once(g_install_once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_previous) != 0) {
      Logger("client").error("installing the SIGBUS guard: {}", std::strerror(errno));
    }
  });
}

int AcquireSlot(char* base, uint64_t size) {
  absl::MutexLock lock(&g_slots_mu);
  for (int i = 0; i < kGuardSlots; ++i) {
    if (g_slot_used[i]) continue;
    g_slot_used[i] = true;
    GuardSlot& slot = g_slots[i];
    slot.broken.store(false, std::memory_order_relaxed);
    slot.logged.store(false, std::memory_order_relaxed);
    slot.end.store(reinterpret_cast<uintptr_t>(base) + size, std::memory_order_release);
    slot.begin.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return i;
  }
  return -1;
}

void ReleaseSlot(int i) {
  g_slots[i].begin.store(0, std::memory_order_release);
  absl::MutexLock lock(&g_slots_mu);
  g_slot_used[i] = false;
}

}  // namespace

MappedBuffer::~MappedBuffer() {
  ReleaseSlot(guard_slot_);
  munmap(base_, size_);
  close(fd_);
}

bool MappedBuffer::Broken() const {
  return g_slots[guard_slot_].broken.load(std::memory_order_acquire);
}

absl::Status MappedBuffer::CheckIntact() const {
  if (!Broken()) return absl::OkStatus();
  if (!g_slots[guard_slot_].logged.exchange(true)) {
    Logger("client").error(
        "registered buffer {} ({} bytes) faulted: its shm object was truncated while mapped; "
        "the items using it fail, re-register the buffer",
        name_, size_);
  }
  return McError(Code::kInvalidArgument,
                 absl::StrCat("registered buffer ", name_,
                              " was truncated while in use (SIGBUS absorbed); the item's bytes "
                              "are void, re-register the buffer"));
}

absl::StatusOr<uint64_t> MappedBuffer::ObjectSize() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    return McError(Code::kInternal, absl::StrCat("fstat(", name_, "): ", std::strerror(errno)));
  }
  return static_cast<uint64_t>(st.st_size);
}

absl::Status CheckBuffersIntact(const std::vector<BufferRef>& refs) {
  for (const BufferRef& ref : refs) {
    if (ref == nullptr) continue;
    absl::Status s = ref->CheckIntact();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

uint64_t BufferFaultsAbsorbed() { return g_faults.load(std::memory_order_relaxed); }

absl::StatusOr<uint64_t> BufferRegistry::Register(const std::string& shm_name, uint64_t size) {
  if (shm_name.empty() || shm_name.size() > 255 || shm_name.find('/', 1) != std::string::npos) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("bad shm name '", shm_name, "' (expected \"/name\")"));
  }
  InstallGuard();
  int fd = shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC, 0);
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
  {
    absl::MutexLock lock(&mu_);
    if (buffers_.size() >= max_buffers_) {
      close(fd);
      return McError(Code::kNoSpace, absl::StrCat("more than ", max_buffers_, " buffers"));
    }
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    close(fd);
    return McError(Code::kInternal, absl::StrCat("mmap(", shm_name, "): ", std::strerror(err)));
  }
  int slot = AcquireSlot(static_cast<char*>(base), size);
  if (slot < 0) {
    munmap(base, size);
    close(fd);
    return McError(Code::kNoSpace,
                   absl::StrCat("more than ", kGuardSlots, " buffers in this process"));
  }
  auto buffer =
      std::make_shared<const MappedBuffer>(shm_name, fd, static_cast<char*>(base), size, slot);
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
  BufferRef held;
  {
    absl::MutexLock lock(&mu_);
    auto it = buffers_.find(buffer_id);
    if (it == buffers_.end()) {
      return McError(Code::kInvalidArgument, absl::StrCat("unknown buffer id ", buffer_id));
    }
    held = it->second;
  }
  const MappedBuffer& buf = *held;
  if (offset > buf.size() || length > buf.size() - offset) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("slice [", offset, ", +", length, ") outside buffer ", buffer_id,
                                " of ", buf.size(), " bytes"));
  }
  if (absl::Status s = buf.CheckIntact(); !s.ok()) return s;
  // The application may have shrunk the object since it registered it: touching the mapping
  // past the object's end would fault. (A shrink after this check is the guard's business.)
  absl::StatusOr<uint64_t> object_size = buf.ObjectSize();
  if (!object_size.ok()) return object_size.status();
  if (offset + length > *object_size) {
    Logger("client").warn(
        "buffer {} ({}): slice [{}, +{}) beyond the shm object's {} bytes "
        "(truncated after registration)",
        buffer_id, buf.name(), offset, length, *object_size);
    return McError(Code::kInvalidArgument,
                   absl::StrCat("slice [", offset, ", +", length, ") of buffer ", buffer_id, " (",
                                buf.name(), ") lies beyond its shm object, now ", *object_size,
                                " bytes (truncated after registration)"));
  }
  *ref = std::move(held);
  return buf.base() + offset;
}

size_t BufferRegistry::Count() const {
  absl::MutexLock lock(&mu_);
  return buffers_.size();
}

}  // namespace mc::client
