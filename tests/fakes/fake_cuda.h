// A fake CUDA device (the seam of transfer/cuda/cuda_api.h) for unit tests of the GPU mover,
// the cuda transport and the GPU buffer registry. "Device memory" is host memory the fake
// allocated (AllocDevice) or was told about; copies are memcpy and the hash kernel runs the
// same XXH3 code as the real kernel (transfer/cuda/xxh3_hd.h) on the CPU.
// By default work executes when it is enqueued. On command the fake holds enqueued work until
// RunPending(), fails the n-th copy from now (earlier copies of its batch land, it and the rest
// do not, and the stream's next event reports the error, as CUDA's sticky errors do), fails
// the next batch call at enqueue, silently shortens the next copy (a lying completion only the
// hash can catch), corrupts the next hash, or loses the device (every later call fails). Each
// QueryEvent of unfinished work can advance an injected FakeClock (time passing on the device).
// Exports of "other processes" memory (ExportIpc, ExportFd) feed Import().
// Thread-safe.
#pragma once

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "tests/fakes/fake_clock.h"
#include "transfer/cuda/cuda_api.h"
#include "transfer/cuda/xxh3_hd.h"

namespace mc::transfer::cuda {

class FakeCudaApi final : public CudaApi {
 public:
  explicit FakeCudaApi(int devices = 1) : devices_(devices) {}

  // --- test commands ---
  // Fake device memory (zeroed), freed with the fake. Page-aligned and a whole number of pages
  // (as CUDA's allocations are: 2 MiB granules), so that ExportDmaBuf can cover it.
  char* AllocDevice(uint64_t size) {
    absl::MutexLock lock(&mu_);
    const uint64_t pages = (size + kPage - 1) / kPage * kPage;
    auto& block = device_blocks_.emplace_back(std::make_unique<char[]>(pages + kPage));
    const auto raw = reinterpret_cast<uint64_t>(block.get());
    char* base = reinterpret_cast<char*>((raw + kPage - 1) / kPage * kPage);
    std::memset(base, 0, pages);
    device_ranges_[reinterpret_cast<uint64_t>(base)] = pages;
    return base;
  }
  static constexpr uint64_t kPage = 4096;
  // ExportDmaBuf answers `error` from now on (OK again: it exports).
  void FailDmaBufExport(absl::Status error) {
    absl::MutexLock lock(&mu_);
    dmabuf_error_ = std::move(error);
  }
  // FlushRdmaWrites answers `error` from now on.
  void FailRdmaFlush(absl::Status error) {
    absl::MutexLock lock(&mu_);
    flush_error_ = std::move(error);
  }
  uint64_t dmabuf_exports() const {
    absl::MutexLock l(&mu_);
    return dmabuf_exports_;
  }
  uint64_t rdma_flushes() const {
    absl::MutexLock l(&mu_);
    return rdma_flushes_;
  }
  // A 64-byte "cudaIpcMemHandle_t" naming [base, base+size) on `device`.
  std::vector<uint8_t> ExportIpc(char* base, uint64_t size, int device = 0) {
    absl::MutexLock lock(&mu_);
    std::vector<uint8_t> handle(64, 0);
    const uint64_t id = next_export_++;
    std::memcpy(handle.data(), &id, sizeof(id));
    exports_[id] = Export{base, size, device};
    return handle;
  }
  // A shareable-handle fd for [base, base+size): a real fd (a memfd, so that it survives
  // SCM_RIGHTS and dup), recognized by Import through its inode. The caller owns the returned fd.
  int ExportFd(char* base, uint64_t size, int device = 0) {
    absl::MutexLock lock(&mu_);
    const int fd = memfd_create("fake-cuda-export", MFD_CLOEXEC);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) return -1;
    exports_[next_export_++] = Export{base, size, device, fd, st.st_ino};
    return dup(fd);
  }
  ~FakeCudaApi() override {
    for (auto& [id, e] : exports_) {
      if (e.fd >= 0) close(e.fd);
    }
    for (auto& [token, m] : foreign_) foreign_unmap_(m);
  }
  // Memory of handles this fake did not export: called (under the fake's lock) by Import for a
  // handle it does not know, it maps the memory and returns where; `unmap` is called by
  // CloseImported. The daemon's fake-GPU test build (tests/fakes/shm_fake_cuda.h) uses it.
  struct Mapped {
    char* base;
    uint64_t size;
  };
  using ForeignImport =
      std::function<absl::StatusOr<Mapped>(GpuHandleKind, std::span<const uint8_t>, int fd)>;
  void SetForeignImport(ForeignImport import, std::function<void(const Mapped&)> unmap) {
    absl::MutexLock lock(&mu_);
    foreign_import_ = std::move(import);
    foreign_unmap_ = std::move(unmap);
  }
  void SetHold(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_ = hold;
  }
  void RunPending() {
    absl::MutexLock lock(&mu_);
    for (auto& [id, stream] : streams_) RunStream(stream);
  }
  void FailNthCopy(uint64_t n) {
    absl::MutexLock lock(&mu_);
    fail_copy_at_ = copies_ + n;
  }
  void FailNextAllocPinned() {
    absl::MutexLock lock(&mu_);
    fail_alloc_pinned_ = true;
  }
  uint64_t pinned_allocations() const {
    absl::MutexLock l(&mu_);
    return pinned_.size();
  }
  void FailNextBatchCall() {
    absl::MutexLock lock(&mu_);
    fail_batch_call_ = true;
  }
  void ShortenNextCopy(uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    shorten_next_ = bytes;
  }
  // From now on every n-th copy (0: none) lands with one byte flipped in its destination: a
  // completion that lies about what landed, which only a hash of the destination catches.
  void CorruptEveryNthCopy(uint64_t n) {
    absl::MutexLock lock(&mu_);
    corrupt_every_ = n;
  }
  void CorruptNextHash() {
    absl::MutexLock lock(&mu_);
    corrupt_hash_ = true;
  }
  void LoseDevice() {
    absl::MutexLock lock(&mu_);
    lost_ = true;
  }
  // Held work runs by itself once the injected clock reaches `ms` (a slow device catching up).
  void RunHeldWorkAtMs(int64_t ms) {
    absl::MutexLock lock(&mu_);
    run_at_ms_ = ms;
  }
  // Each QueryEvent that finds unfinished work advances `clock` by `ms`.
  void AdvanceClockOnPoll(FakeClock* clock, int64_t ms) {
    absl::MutexLock lock(&mu_);
    clock_ = clock;
    advance_ms_ = ms;
  }

  uint64_t batch_calls() const {
    absl::MutexLock l(&mu_);
    return batch_calls_;
  }
  uint64_t copies() const {
    absl::MutexLock l(&mu_);
    return copies_;
  }
  uint64_t hash_launches() const {
    absl::MutexLock l(&mu_);
    return hash_launches_;
  }
  uint64_t imports_open() const {
    absl::MutexLock l(&mu_);
    return imports_open_;
  }
  size_t host_registered() const {
    absl::MutexLock l(&mu_);
    return host_registered_.size();
  }
  size_t live_events() const {
    absl::MutexLock l(&mu_);
    return events_.size();
  }

  // --- CudaApi ---
  absl::StatusOr<int> DeviceCount() override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    return devices_;
  }
  absl::StatusOr<std::string> DeviceName(int device) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    if (device < 0 || device >= devices_) return McError(Code::kInvalidArgument, "no device");
    return std::string("FakeGPU sm_90");
  }
  // "GPU-00000fa4-0000-4000-8000-00000000000N" for device N.
  absl::StatusOr<std::string> DeviceUuid(int device) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    if (device < 0 || device >= devices_) return McError(Code::kInvalidArgument, "no device");
    std::vector<uint8_t> bytes = {0,    0, 0x0f, 0xa4, 0, 0, 0x40, 0,
                                  0x80, 0, 0,    0,    0, 0, 0,    static_cast<uint8_t>(device)};
    return FormatGpuUuid(bytes);
  }
  absl::StatusOr<ImportedMemory> Import(int device, GpuHandleKind kind,
                                        std::span<const uint8_t> handle, int fd,
                                        uint64_t size) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    const Export* e = nullptr;
    if (kind == GpuHandleKind::kCudaIpc) {
      if (handle.size() != 64) return McError(Code::kInvalidArgument, "ipc handle not 64 bytes");
      uint64_t id;
      std::memcpy(&id, handle.data(), sizeof(id));
      auto it = exports_.find(id);
      if (it != exports_.end() && it->second.fd < 0) e = &it->second;
    } else {
      struct stat st {};
      if (fd >= 0 && fstat(fd, &st) == 0) {
        for (auto& [id, ex] : exports_) {
          if (ex.fd >= 0 && ex.inode == st.st_ino) e = &ex;
        }
      }
    }
    if (e == nullptr && foreign_import_) {
      MC_ASSIGN_OR_RETURN(Mapped m, foreign_import_(kind, handle, fd));
      if (m.size < size) {
        foreign_unmap_(m);
        return McError(Code::kInvalidArgument, "allocation smaller than claimed");
      }
      device_ranges_[reinterpret_cast<uint64_t>(m.base)] = m.size;
      ++imports_open_;
      const uint64_t token = next_export_++;
      foreign_[token] = m;
      return ImportedMemory{reinterpret_cast<uint64_t>(m.base), m.size, token};
    }
    if (e == nullptr) return McError(Code::kInvalidArgument, "cudaErrorInvalidValue: bad handle");
    if (e->device != device) return McError(Code::kInvalidArgument, "handle of another device");
    if (e->size < size) return McError(Code::kInvalidArgument, "allocation smaller than claimed");
    device_ranges_[reinterpret_cast<uint64_t>(e->base)] = e->size;
    ++imports_open_;
    return ImportedMemory{reinterpret_cast<uint64_t>(e->base), e->size, next_export_++};
  }
  void CloseImported(int, const ImportedMemory& memory) override {
    absl::MutexLock lock(&mu_);
    --imports_open_;
    auto it = foreign_.find(memory.token);
    if (it != foreign_.end()) {
      device_ranges_.erase(reinterpret_cast<uint64_t>(it->second.base));
      foreign_unmap_(it->second);
      foreign_.erase(it);
    }
  }
  absl::Status HostRegister(void* base, uint64_t length) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    host_registered_[base] = length;
    return absl::OkStatus();
  }
  void HostUnregister(void* base) override {
    absl::MutexLock lock(&mu_);
    host_registered_.erase(base);
  }
  absl::StatusOr<void*> AllocPinned(uint64_t length) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    if (std::exchange(fail_alloc_pinned_, false)) {
      return McError(Code::kUnavailable, "cudaHostAlloc: out of memory (injected)");
    }
    auto block = std::make_unique<char[]>(length);
    void* p = block.get();
    pinned_[p] = std::move(block);
    return p;
  }
  void FreePinned(void* p) override {
    absl::MutexLock lock(&mu_);
    pinned_.erase(p);
  }
  absl::StatusOr<Stream> CreateStream(int device) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    if (device < 0 || device >= devices_) return McError(Code::kInvalidArgument, "no device");
    const Stream id = next_id_++;
    streams_[id];
    return id;
  }
  void DestroyStream(Stream stream) override {
    absl::MutexLock lock(&mu_);
    streams_.erase(stream);
  }
  absl::Status CopyBatchAsync(Stream stream, std::span<const CopyOp> ops) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    ++batch_calls_;
    if (fail_batch_call_) {
      fail_batch_call_ = false;
      return McError(Code::kInternal, "cudaErrorInvalidValue (injected)");
    }
    Item item;
    item.copies.assign(ops.begin(), ops.end());
    return Enqueue(stream, std::move(item));
  }
  absl::Status HashAsync(Stream stream, const HashRange* ranges, uint64_t* out,
                         uint32_t count) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    ++hash_launches_;
    Item item;
    item.hash = true;
    item.ranges = ranges;
    item.out = out;
    item.count = count;
    return Enqueue(stream, std::move(item));
  }
  absl::StatusOr<Event> RecordEvent(Stream stream) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    const Event id = next_id_++;
    events_[id] = EventState::kPending;
    Item item;
    item.event = id;
    MC_RETURN_IF_ERROR(Enqueue(stream, std::move(item)));
    return id;
  }
  absl::StatusOr<bool> QueryEvent(Event event) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    if (clock_ != nullptr && run_at_ms_ >= 0 && clock_->NowMs() >= run_at_ms_) {
      for (auto& [id, stream] : streams_) RunStream(stream);
    }
    auto it = events_.find(event);
    if (it == events_.end()) return McError(Code::kInternal, "unknown event");
    if (it->second == EventState::kPending) {
      if (clock_ != nullptr) clock_->AdvanceMs(advance_ms_);
      return false;
    }
    if (it->second == EventState::kFailed) {
      return McError(Code::kInternal, "cudaErrorIllegalAddress (injected copy fault)");
    }
    return true;
  }
  void DestroyEvent(Event event) override {
    absl::MutexLock lock(&mu_);
    events_.erase(event);
  }
  // A memfd stands for the dma-buf (the fake verbs device registers the memory at its iova).
  absl::StatusOr<int> ExportDmaBuf(int device, uint64_t device_addr, uint64_t length) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    if (!dmabuf_error_.ok()) return dmabuf_error_;
    if (device < 0 || device >= devices_) return McError(Code::kInvalidArgument, "no device");
    if (device_addr % kPage != 0 || length % kPage != 0 || length == 0) {
      return McError(Code::kInvalidArgument, "cuMemGetHandleForAddressRange: range not aligned");
    }
    auto it = device_ranges_.upper_bound(device_addr);
    bool inside = it != device_ranges_.begin();
    if (inside) {
      --it;
      const uint64_t at = device_addr - it->first;
      inside = at <= it->second && length <= it->second - at;
    }
    if (!inside) {
      return McError(Code::kInvalidArgument, "cuMemGetHandleForAddressRange: not one allocation");
    }
    const int fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
    if (fd < 0) return McError(Code::kInternal, "memfd_create failed");
    ++dmabuf_exports_;
    return fd;
  }
  absl::Status FlushRdmaWrites(int device) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    if (device < 0 || device >= devices_) return McError(Code::kInvalidArgument, "no device");
    ++rdma_flushes_;
    return flush_error_;
  }
  absl::Status SynchronizeStream(Stream stream) override {
    absl::MutexLock lock(&mu_);
    if (lost_) return Lost();
    auto it = streams_.find(stream);
    if (it == streams_.end()) return McError(Code::kInternal, "unknown stream");
    RunStream(it->second);
    return it->second.failed ? McError(Code::kInternal, "stream failed") : absl::OkStatus();
  }

 private:
  struct Export {
    char* base;
    uint64_t size;
    int device;
    int fd = -1;      // the export's own memfd (kept open while the fake lives)
    ino_t inode = 0;  // which Import recognizes an fd by
  };
  struct Item {
    std::vector<CopyOp> copies;
    bool hash = false;
    const HashRange* ranges = nullptr;
    uint64_t* out = nullptr;
    uint32_t count = 0;
    Event event = 0;
  };
  struct StreamState {
    std::deque<Item> pending;
    bool failed = false;
  };
  enum class EventState { kPending, kDone, kFailed };

  static absl::Status Lost() { return McError(Code::kUnavailable, "cudaErrorDevicesUnavailable"); }

  absl::Status Enqueue(Stream stream, Item item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = streams_.find(stream);
    if (it == streams_.end()) return McError(Code::kInternal, "unknown stream");
    it->second.pending.push_back(std::move(item));
    if (!hold_) RunStream(it->second);
    return absl::OkStatus();
  }

  void RunStream(StreamState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!s.pending.empty()) {
      Item item = std::move(s.pending.front());
      s.pending.pop_front();
      if (item.event != 0) {
        auto ev = events_.find(item.event);
        if (ev != events_.end()) ev->second = s.failed ? EventState::kFailed : EventState::kDone;
        continue;
      }
      if (s.failed) continue;  // sticky: later work of the stream does not run
      if (item.hash) {
        for (uint32_t i = 0; i < item.count; ++i) {
          item.out[i] = xxh3::Xxh3_64(reinterpret_cast<const uint8_t*>(item.ranges[i].addr),
                                      item.ranges[i].length, xxh3::kHostSecret);
          if (corrupt_hash_) {
            item.out[i] ^= 1;
            corrupt_hash_ = false;
          }
        }
        continue;
      }
      for (const CopyOp& c : item.copies) {
        if (copies_++ == fail_copy_at_) {
          s.failed = true;
          break;
        }
        uint64_t n = c.length;
        if (shorten_next_ > 0) {
          n = c.length > shorten_next_ ? c.length - shorten_next_ : 0;
          shorten_next_ = 0;
        }
        std::memmove(c.dst, c.src, n);
        if (corrupt_every_ > 0 && n > 0 && copies_ % corrupt_every_ == 0) {
          static_cast<uint8_t*>(c.dst)[n / 2] ^= 0x5a;
        }
      }
    }
  }

  const int devices_;
  mutable absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_batch_call_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_alloc_pinned_ ABSL_GUARDED_BY(mu_) = false;
  bool corrupt_hash_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t fail_copy_at_ ABSL_GUARDED_BY(mu_) = ~uint64_t{0};
  uint64_t shorten_next_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t corrupt_every_ ABSL_GUARDED_BY(mu_) = 0;
  FakeClock* clock_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t advance_ms_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t run_at_ms_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_export_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t batch_calls_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copies_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hash_launches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t imports_open_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dmabuf_exports_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rdma_flushes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status dmabuf_error_ ABSL_GUARDED_BY(mu_);
  absl::Status flush_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<char[]>> device_blocks_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> device_ranges_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Export> exports_ ABSL_GUARDED_BY(mu_);
  ForeignImport foreign_import_ ABSL_GUARDED_BY(mu_);
  std::function<void(const Mapped&)> foreign_unmap_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Mapped> foreign_ ABSL_GUARDED_BY(mu_);  // by ImportedMemory::token
  std::map<void*, uint64_t> host_registered_ ABSL_GUARDED_BY(mu_);
  std::map<void*, std::unique_ptr<char[]>> pinned_ ABSL_GUARDED_BY(mu_);
  std::map<Stream, StreamState> streams_ ABSL_GUARDED_BY(mu_);
  std::map<Event, EventState> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::transfer::cuda
