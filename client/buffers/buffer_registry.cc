#include "client/buffers/buffer_registry.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/access/caller_limits.h"
#include "client/access/store_auth.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "transfer/memory_access.h"

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

// Maps, in this process, the pages of a fresh mapping that the shm object already has (the
// application wrote them: a vLLM KV cache is allocated in full), so the first get into each page
// pays no page fault on the hot path (measured: loads into never-touched pages of a 2,048-token
// prompt took ~2x as long). Holes stay holes: only pages mincore() reports resident are
// populated, so a sparse object costs no memory here. MADV_POPULATE_WRITE answers an error
// rather than SIGBUS when the object shrinks meanwhile; any error just ends the prefault.
//
// In the background, one buffer at a time, 64 Ki pages per step: populating costs about what
// the faults would (2 GiB took 1.7 s on the dev VM), so registration must not wait for it. Each
// step holds the buffer; one unmapped meanwhile (its last BufferRef gone) is dropped.
class Prefaulter {
 public:
  static Prefaulter& Get() {
    static Prefaulter p;  // its destructor stops the thread at exit, after the current step
    return p;
  }
  void Add(std::weak_ptr<const MappedBuffer> buffer) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(buffer));
  }
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !busy_; };
    mu_.Await(absl::Condition(&idle));
  }
  ~Prefaulter() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

 private:
  Prefaulter() : thread_([this] { Loop(); }) {}

  void Loop() {
    while (true) {
      std::weak_ptr<const MappedBuffer> next;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        next = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      PrefaultResident(next);
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
  }

  bool Stopping() {
    absl::MutexLock lock(&mu_);
    return stop_;
  }

  void PrefaultResident(const std::weak_ptr<const MappedBuffer>& weak) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    constexpr uint64_t kStepPages = 1 << 16;
    std::vector<unsigned char> resident(kStepPages);
    for (uint64_t step = 0;; step += kStepPages * page) {
      BufferRef buffer = weak.lock();
      if (buffer == nullptr || buffer->Broken() || step >= buffer->size() || Stopping()) return;
      char* const base = buffer->base() + step;
      const uint64_t bytes = std::min<uint64_t>(buffer->size() - step, kStepPages * page);
      const uint64_t pages = (bytes + page - 1) / page;
      if (mincore(base, bytes, resident.data()) != 0) return;
      for (uint64_t i = 0; i < pages;) {
        if ((resident[i] & 1) == 0) {
          ++i;
          continue;
        }
        uint64_t j = i;
        while (j < pages && (resident[j] & 1) != 0) ++j;
        const uint64_t len = std::min<uint64_t>((j - i) * page, bytes - i * page);
        if (madvise(base + i * page, len, MADV_POPULATE_WRITE) != 0) return;
        i = j;
      }
    }
  }

  absl::Mutex mu_;
  std::deque<std::weak_ptr<const MappedBuffer>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

void WaitForBufferPrefaults() { Prefaulter::Get().WaitIdle(); }

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

absl::StatusOr<BufferRef> BufferRegistry::MapFd(int fd, uint64_t size, std::string label) {
  auto refuse = [&](Code code, std::string why) {
    close(fd);
    return McError(code, absl::StrCat("buffer ", label, ": ", why));
  };
  if (fd < 0) return McError(Code::kInvalidArgument, absl::StrCat("buffer ", label, ": no fd"));
  struct stat st {};
  if (fstat(fd, &st) != 0)
    return refuse(Code::kInternal, absl::StrCat("fstat: ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) {
    return refuse(Code::kInvalidArgument,
                  "not a shared-memory object (expected a regular file on tmpfs or hugetlbfs: "
                  "shm_open, memfd_create)");
  }
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) {
    return refuse(Code::kInternal, absl::StrCat("fstatfs: ", std::strerror(errno)));
  }
  // Memory only: a file on a disk or network file system could stall or fail the daemon's copies.
  if (fs.f_type != TMPFS_MAGIC && fs.f_type != HUGETLBFS_MAGIC) {
    return refuse(Code::kInvalidArgument,
                  "not a shared-memory object (its file system is neither tmpfs nor hugetlbfs)");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return refuse(Code::kInvalidArgument,
                  "the descriptor is not open for reading and writing (O_RDWR)");
  }
  const uint64_t object_size = static_cast<uint64_t>(st.st_size);
  if (size == 0) size = object_size;
  if (size == 0 || size > object_size) {
    return refuse(Code::kInvalidArgument, absl::StrCat("buffer size ", size, " but the object has ",
                                                       object_size, " bytes"));
  }
  InstallGuard();
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return refuse(Code::kInvalidArgument, absl::StrCat("mmap: ", std::strerror(errno)));
  }
  int slot = AcquireSlot(static_cast<char*>(base), size);
  if (slot < 0) {
    munmap(base, size);
    return refuse(Code::kNoSpace,
                  absl::StrCat("more than ", kGuardSlots, " buffers in this process"));
  }
  auto mapped = std::make_shared<const MappedBuffer>(std::move(label), fd, static_cast<char*>(base),
                                                     size, slot);
  Prefaulter::Get().Add(mapped);
  return mapped;
}

BufferRegistry::BufferRegistry(BufferRegistryOptions options) : options_(std::move(options)) {}

uint64_t BufferRegistry::RdmaBytes() const { return rdma_budget_->bytes.load(); }
uint64_t BufferRegistry::RdmaRefusals() const { return rdma_budget_->refusals.load(); }

namespace {

// Keeps a mapped buffer registered with the transfer engine: deregistered when the holder goes
// (the last BufferRef), before the buffer it holds can be unmapped.
struct RdmaRegisteredBuffer {
  RdmaRegisteredBuffer(BufferRef b, transfer::MemoryRegistrar* r, std::shared_ptr<void> budget,
                       std::atomic<uint64_t>* bytes)
      : buffer(std::move(b)), registrar(r), budget_owner(std::move(budget)), budget_bytes(bytes) {}
  ~RdmaRegisteredBuffer() {
    registrar->UnregisterMemory(buffer->base());  // waits for the transports' in-flight users
    budget_bytes->fetch_sub(buffer->size());
  }
  RdmaRegisteredBuffer(const RdmaRegisteredBuffer&) = delete;
  RdmaRegisteredBuffer& operator=(const RdmaRegisteredBuffer&) = delete;

  const BufferRef buffer;
  transfer::MemoryRegistrar* const registrar;
  const std::shared_ptr<void> budget_owner;  // keeps `budget_bytes` alive
  std::atomic<uint64_t>* const budget_bytes;
};

}  // namespace

BufferRef BufferRegistry::RegisterWithRdma(BufferRef buffer) {
  transfer::MemoryRegistrar* registrar = registrar_.load();
  if (registrar == nullptr || buffer == nullptr) return buffer;
  const uint64_t size = buffer->size();
  RdmaBudget& budget = *rdma_budget_;
  uint64_t used = budget.bytes.load();
  do {
    if (size > options_.max_rdma_bytes || used > options_.max_rdma_bytes - size) {
      budget.refusals.fetch_add(1);
      Logger("client").info(
          "buffer {} ({} bytes) not registered with rdma: {} bytes already are, the limit "
          "(--rdma_buffer_bytes_total={}); its transfers use tcp",
          buffer->name(), size, used, options_.max_rdma_bytes);
      return buffer;
    }
  } while (!budget.bytes.compare_exchange_weak(used, used + size));
  if (absl::Status s =
          registrar->RegisterMemory(buffer->base(), size, transfer::MemoryAccess::kLocal);
      !s.ok()) {
    budget.bytes.fetch_sub(size);
    budget.refusals.fetch_add(1);
    Logger("client").warn(
        "buffer {} ({} bytes) not registered with rdma ({}); its transfers use tcp (raise "
        "RLIMIT_MEMLOCK if the device ran out of lockable memory)",
        buffer->name(), size, s.ToString());
    return buffer;
  }
  auto holder =
      std::make_shared<RdmaRegisteredBuffer>(buffer, registrar, rdma_budget_, &budget.bytes);
  const MappedBuffer* raw = holder->buffer.get();
  return BufferRef(std::move(holder), raw);  // aliasing: shares the holder's lifetime
}

void BufferRegistry::CountRefusal(const char* limit) const {
  CountLimitRefusal(options_.metrics, limit);
}

void BufferRegistry::CountMismatch() const {
  owner_mismatches_.fetch_add(1);
  if (options_.metrics == nullptr) return;
  options_.metrics
      ->GetCounter("mc_store_buffer_owner_mismatches_total",
                   "Store calls that named a buffer id of another caller (answered as unknown)")
      .Inc();
}

namespace {

// One scope of the buffer quotas: a caller (one session) or every session of its uid. The words
// fill the refusal's message; the labels name the limit in mc_store_limit_refusals_total.
struct QuotaScope {
  const char* buffers_label;
  const char* bytes_label;
  const char* already_hold;  // "<who> already hold(s) "
  const char* would_hold;    // "<who> would hold "
  const char* bytes_noun;    // what the bytes are in "... + size<bytes_noun>, over the limit"
  const char* flag_scope;    // the flags' suffix: --store_max_buffers_per_<flag_scope>
  size_t max_buffers;
  uint64_t max_bytes;
};

// OK when `usage` plus one more buffer of `size` bytes stays within `scope`'s limits.
absl::Status CheckQuota(const QuotaScope& scope, const BufferRegistry::Usage& usage, uint64_t size,
                        MetricsRegistry* metrics) {
  if (usage.buffers >= scope.max_buffers) {
    CountLimitRefusal(metrics, scope.buffers_label);
    return absl::ResourceExhaustedError(
        absl::StrCat(scope.already_hold, usage.buffers,
                     " registered buffers, the limit (--store_max_buffers_per_", scope.flag_scope,
                     "=", scope.max_buffers, ")"));
  }
  if (size > scope.max_bytes || usage.bytes > scope.max_bytes - size) {
    CountLimitRefusal(metrics, scope.bytes_label);
    return absl::ResourceExhaustedError(
        absl::StrCat(scope.would_hold, usage.bytes, " + ", size, scope.bytes_noun,
                     ", over the limit (--store_max_buffer_bytes_per_", scope.flag_scope, "=",
                     scope.max_bytes, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BufferRegistry::CheckLimitsLocked(const std::string& owner, const std::string& account,
                                               uint64_t size) const {
  if (buffers_.size() + staged_.size() >= options_.max_buffers) {
    CountRefusal("buffers_total");
    return McError(Code::kNoSpace, absl::StrCat("more than ", options_.max_buffers, " buffers"));
  }
  if (size > options_.max_bytes || total_bytes_ > options_.max_bytes - size) {
    CountRefusal("buffer_bytes_total");
    return McError(Code::kNoSpace,
                   absl::StrCat("registered buffers would map ", total_bytes_, " + ", size,
                                " bytes, over the daemon's limit (--store_max_buffer_bytes_total=",
                                options_.max_bytes, ")"));
  }
  const QuotaScope per_caller{.buffers_label = "buffers",
                              .bytes_label = "buffer_bytes",
                              .already_hold = "this caller already holds ",
                              .would_hold = "this caller's registered buffers would hold ",
                              .bytes_noun = " bytes",
                              .flag_scope = "caller",
                              .max_buffers = options_.max_buffers_per_owner,
                              .max_bytes = options_.max_bytes_per_owner};
  const QuotaScope per_uid{.buffers_label = "buffers_uid",
                           .bytes_label = "buffer_bytes_uid",
                           .already_hold = "the sessions of this caller's uid already hold ",
                           .would_hold = "the sessions of this caller's uid would hold ",
                           .bytes_noun = " bytes of buffers",
                           .flag_scope = "uid",
                           .max_buffers = options_.max_buffers_per_account,
                           .max_bytes = options_.max_bytes_per_account};
  Usage usage;
  if (auto it = usage_.find(owner); it != usage_.end()) usage = it->second;
  MC_RETURN_IF_ERROR(CheckQuota(per_caller, usage, size, options_.metrics));
  Usage shared;
  if (auto it = account_usage_.find(account); it != account_usage_.end()) shared = it->second;
  return CheckQuota(per_uid, shared, size, options_.metrics);
}

namespace {

void Charge(absl::flat_hash_map<std::string, BufferRegistry::Usage>& usage, const std::string& key,
            uint64_t size) {
  BufferRegistry::Usage& u = usage[key];
  ++u.buffers;
  u.bytes += size;
}

void Refund(absl::flat_hash_map<std::string, BufferRegistry::Usage>& usage, const std::string& key,
            uint64_t size) {
  auto it = usage.find(key);
  if (it == usage.end()) return;
  --it->second.buffers;
  it->second.bytes -= size;
  if (it->second.buffers == 0) usage.erase(it);
}

}  // namespace

void BufferRegistry::ChargeLocked(const Entry& entry) {
  const uint64_t size = entry.buffer->size();
  Charge(usage_, entry.owner, size);
  Charge(account_usage_, entry.account, size);
  total_bytes_ += size;
}

void BufferRegistry::RefundLocked(const Entry& entry) {
  const uint64_t size = entry.buffer->size();
  total_bytes_ -= size;
  Refund(usage_, entry.owner, size);
  Refund(account_usage_, entry.account, size);
}

std::pair<size_t, uint64_t> BufferRegistry::AccountUsage(const std::string& account) const {
  absl::MutexLock lock(&mu_);
  auto it = account_usage_.find(account);
  if (it == account_usage_.end()) return {0, 0};
  return {it->second.buffers, it->second.bytes};
}

absl::StatusOr<std::string> BufferRegistry::Stage(BufferRef buffer, const std::string& owner,
                                                  const std::string& account_in) {
  const std::string& account = account_in.empty() ? owner : account_in;
  MC_ASSIGN_OR_RETURN(std::string handle, RandomHexToken());
  {
    absl::MutexLock lock(&mu_);
    MC_RETURN_IF_ERROR(CheckLimitsLocked(owner, account, buffer->size()));
  }
  // Outside the lock: pinning takes time; on a refusal below, `registered` is deregistered
  // after the lock was released.
  BufferRef registered = RegisterWithRdma(std::move(buffer));
  {
    absl::MutexLock lock(&mu_);
    MC_RETURN_IF_ERROR(CheckLimitsLocked(owner, account, registered->size()));
    Entry entry{std::move(registered), owner, account};
    ChargeLocked(entry);
    staged_.emplace(handle, std::move(entry));
  }
  return handle;
}

absl::StatusOr<uint64_t> BufferRegistry::Claim(std::string_view handle) {
  BufferRef held;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = staged_.find(std::string(handle));
    if (it == staged_.end()) {
      return McError(Code::kNotFound,
                     "unknown or already used registration handle (get one from the fd socket)");
    }
    id = next_id_++;
    held = it->second.buffer;
    buffers_.emplace(id, std::move(it->second));
    staged_.erase(it);
  }
  Logger("client").info("registered buffer {} = {} ({} bytes)", id, held->name(), held->size());
  return id;
}

absl::StatusOr<uint64_t> BufferRegistry::Register(const std::string& shm_name, uint64_t size,
                                                  const std::string& owner,
                                                  const std::string& account_in) {
  const std::string& account = account_in.empty() ? owner : account_in;
  if (shm_name.empty() || shm_name.size() > 255 || shm_name.find('/', 1) != std::string::npos) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("bad shm name '", shm_name, "' (expected \"/name\")"));
  }
  int fd = shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    return McError(Code::kNotFound,
                   absl::StrCat("shm_open(", shm_name, "): ", std::strerror(errno)));
  }
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckLimitsLocked(owner, account, size); !s.ok()) {
      close(fd);
      return s;
    }
  }
  MC_ASSIGN_OR_RETURN(BufferRef mapped_buffer, MapFd(fd, size, shm_name));
  BufferRef buffer = RegisterWithRdma(std::move(mapped_buffer));  // dropped after the lock
  absl::MutexLock lock(&mu_);
  MC_RETURN_IF_ERROR(CheckLimitsLocked(owner, account, buffer->size()));
  Entry entry{std::move(buffer), owner, account};
  ChargeLocked(entry);
  uint64_t id = next_id_++;
  const uint64_t mapped = entry.buffer->size();
  buffers_.emplace(id, std::move(entry));
  Logger("client").info("registered buffer {} = {} ({} bytes, by name)", id, shm_name, mapped);
  return id;
}

absl::Status BufferRegistry::Unregister(uint64_t buffer_id, std::string_view owner) {
  BufferRef doomed;  // unmapped outside the lock, or later by the last in-flight user
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer_id);
  if (it != buffers_.end() && it->second.owner != owner) {
    CountMismatch();
    it = buffers_.end();
  }
  if (it == buffers_.end()) {
    return McError(Code::kNotFound, absl::StrCat("unknown buffer id ", buffer_id));
  }
  RefundLocked(it->second);
  doomed = std::move(it->second.buffer);
  buffers_.erase(it);
  return absl::OkStatus();
}

size_t BufferRegistry::ReleaseOwner(const std::string& owner) {
  std::vector<BufferRef> doomed;  // unmapped outside the lock
  absl::MutexLock lock(&mu_);
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    if (it->second.owner == owner) {
      RefundLocked(it->second);
      doomed.push_back(std::move(it->second.buffer));
      buffers_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto it = staged_.begin(); it != staged_.end();) {
    if (it->second.owner == owner) {
      RefundLocked(it->second);
      doomed.push_back(std::move(it->second.buffer));
      staged_.erase(it++);
    } else {
      ++it;
    }
  }
  return doomed.size();
}

absl::StatusOr<ResolvedBuffer> BufferRegistry::ResolveBuffer(uint64_t buffer_id,
                                                             std::string_view owner) const {
  ResolvedBuffer out;
  out.id = buffer_id;
  {
    absl::MutexLock lock(&mu_);
    auto it = buffers_.find(buffer_id);
    if (it != buffers_.end() && it->second.owner != owner) {
      CountMismatch();
      it = buffers_.end();
    }
    if (it == buffers_.end()) {
      return McError(Code::kInvalidArgument, absl::StrCat("unknown buffer id ", buffer_id));
    }
    out.ref = it->second.buffer;
  }
  if (absl::Status s = out.ref->CheckIntact(); !s.ok()) return s;
  // The application may have shrunk the object since it registered it: touching the mapping
  // past the object's end would fault. (A shrink after this check is the guard's business.)
  absl::StatusOr<uint64_t> object_size = out.ref->ObjectSize();
  if (!object_size.ok()) return object_size.status();
  out.object_size = *object_size;
  return out;
}

absl::StatusOr<char*> ResolvedBuffer::Slice(uint64_t offset, uint64_t length) const {
  const MappedBuffer& buf = *ref;
  if (offset > buf.size() || length > buf.size() - offset) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("slice [", offset, ", +", length, ") outside buffer ", id, " of ",
                                buf.size(), " bytes"));
  }
  if (offset + length > object_size) {
    Logger("client").warn(
        "buffer {} ({}): slice [{}, +{}) beyond the shm object's {} bytes "
        "(truncated after registration)",
        id, buf.name(), offset, length, object_size);
    return McError(Code::kInvalidArgument,
                   absl::StrCat("slice [", offset, ", +", length, ") of buffer ", id, " (",
                                buf.name(), ") lies beyond its shm object, now ", object_size,
                                " bytes (truncated after registration)"));
  }
  return buf.base() + offset;
}

absl::StatusOr<char*> BufferRegistry::Resolve(uint64_t buffer_id, uint64_t offset, uint64_t length,
                                              BufferRef* ref, std::string_view owner) const {
  MC_ASSIGN_OR_RETURN(ResolvedBuffer b, ResolveBuffer(buffer_id, owner));
  MC_ASSIGN_OR_RETURN(char* p, b.Slice(offset, length));
  *ref = std::move(b.ref);
  return p;
}

size_t BufferRegistry::Count() const {
  absl::MutexLock lock(&mu_);
  return buffers_.size();
}

size_t BufferRegistry::CountOwned(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = usage_.find(owner);
  return it == usage_.end() ? 0 : it->second.buffers;
}

}  // namespace mc::client
