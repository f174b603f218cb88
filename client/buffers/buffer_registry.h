// BufferRegistry: the shared-memory buffers applications register with RegisterBuffer.
//
// A buffer reaches the registry mapped (MapFd: a file descriptor the application passed over
// the fd side channel, see client/buffers/fd_channel.h; or, opt-in only, Register by shm_open name)
// and belongs to one owner (the caller's session token). Stage parks a mapped buffer under a random
// one-time handle; Claim turns the handle into a buffer id (RegisterBuffer). Resolve turns (id,
// offset, length) into memory after an overflow-safe bounds check, for the buffer's owner only:
// another owner's id answers exactly as an unknown id does. ReleaseOwner drops everything an owner
// holds (its session ended). Per-owner caps on buffers and bytes; per-account caps (an account is
// the uid of the owner's fd session: every session of one uid together) so that opening more
// sessions does not multiply a caller's share; and daemon-wide caps on buffers and bytes, staged
// ones included. A resolved buffer is held by a shared_ptr (a BufferRef), so Unregister
// during a transfer only unmaps once the in-flight use ends. Thread-safe.
//
// Shrinking: an application may ftruncate a registered shm object below the mapped size. Any
// access past the new end of the object would raise SIGBUS and kill the daemon. Two defences:
//  - Resolve fstat()s the object (its fd stays open) and refuses a slice the object no longer
//    backs, with INVALID_ARGUMENT;
//  - for the race (the object shrinks while a copy runs), a process-wide SIGBUS handler finds
//    the buffer that holds the faulting address, maps anonymous memory over the whole buffer so
//    the copy can finish harmlessly, and marks the buffer broken. Every user checks Broken()
//    once its copy has ended and fails that item; a broken buffer resolves no more (re-register).
//    Faults outside registered buffers go to the previous handler (default: crash with a core).
//
// RDMA: with the transfer engine attached (AttachRegistrar, when its transports need application
// buffers registered: rdma), each buffer is also registered with it as memory of LOCAL access
// only (an rdma memory region never exposed to peers by rkey) when it is staged or registered
// by name, within a daemon-wide byte budget (max_rdma_bytes); remote transfers from
// and into its slices then run as one-sided RDMA verbs where the peer is reached over rdma.
// The region lives exactly as long as the mapping: it is deregistered (before the munmap) when
// the last BufferRef goes, i.e. after Unregister / ReleaseOwner and once every request that
// resolved a slice of it ended; the transport itself also waits for its in-flight work
// requests before deregistering. A buffer the budget or the device refuses stays usable: its
// transfers go over tcp. Pinned pages and shrinking: the device keeps the pages it pinned at
// registration; an RDMA READ into a buffer shrunk meanwhile lands in orphaned pages, and the
// destination hash (a CPU read of the mapping) then faults into the guard above: the item fails.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

namespace mc::transfer {
class MemoryRegistrar;
}  // namespace mc::transfer

namespace mc::client {

class MappedBuffer {
 public:
  // Takes `fd` (kept open for the size checks) and the mapping; `guard_slot` is the SIGBUS
  // guard's slot for the mapping (see buffer_registry.cc).
  MappedBuffer(std::string name, int fd, char* base, uint64_t size, int guard_slot)
      : name_(std::move(name)), fd_(fd), base_(base), size_(size), guard_slot_(guard_slot) {}
  ~MappedBuffer();
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // True once an access faulted because the object shrank: the mapping no longer shows the
  // object, and whatever was copied to or from it since is garbage.
  bool Broken() const;
  // OK, or INVALID_ARGUMENT naming the buffer when it is broken (logged once per buffer).
  absl::Status CheckIntact() const;
  // The current size of the shm object, or an error.
  absl::StatusOr<uint64_t> ObjectSize() const;

 private:
  const std::string name_;
  const int fd_;
  char* const base_;
  const uint64_t size_;
  const int guard_slot_;
};
// Shared: a buffer stays mapped while any request still uses it.
using BufferRef = std::shared_ptr<const MappedBuffer>;

// A buffer checked for one request: held, not broken, and its shm object's size read once.
struct ResolvedBuffer {
  uint64_t id = 0;
  BufferRef ref;
  uint64_t object_size = 0;  // bytes of the shm object when it was resolved

  // Memory for [offset, offset + length) of it; INVALID_ARGUMENT when the slice lies outside
  // the mapping or beyond the object (truncated after registration).
  absl::StatusOr<char*> Slice(uint64_t offset, uint64_t length) const;
};

// OK when none of `refs` is broken, else the first buffer's error.
absl::Status CheckBuffersIntact(const std::vector<BufferRef>& refs);

// Buffers are prefaulted in the background after MapFd (their resident pages mapped, holes
// left alone); this waits until every buffer queued so far is done (tests).
void WaitForBufferPrefaults();

// Number of SIGBUS faults the guard absorbed in registered buffers (for /metrics and tests).
uint64_t BufferFaultsAbsorbed();

struct BufferRegistryOptions {
  size_t max_buffers = 4096;  // daemon-wide, staged ones included
  // Daemon-wide bytes mapped (--store_max_buffer_bytes_total): sparse objects cost no memory
  // but address space, of which a process has 128 TiB.
  uint64_t max_bytes = 32ull << 40;
  size_t max_buffers_per_owner = 256;         // --store_max_buffers_per_caller
  uint64_t max_bytes_per_owner = 1ull << 40;  // --store_max_buffer_bytes_per_caller
  // Every owner of one account (uid) together: below the daemon-wide caps, so one uid never
  // takes them all (--store_max_buffers_per_uid, --store_max_buffer_bytes_per_uid).
  size_t max_buffers_per_account = 1024;
  uint64_t max_bytes_per_account = 8ull << 40;
  // Counts refusals (mc_store_limit_refusals_total, mc_store_buffer_owner_mismatches_total)
  // when set; borrowed, must outlive the registry.
  MetricsRegistry* metrics = nullptr;
  // Bytes of application buffers registered with the rdma transport at once
  // (--rdma_buffer_bytes_total; their pages stay pinned while registered). Buffers past it
  // are not registered (their transfers use tcp); 0 registers none.
  uint64_t max_rdma_bytes = 64ull << 30;
};

class BufferRegistry {
 public:
  explicit BufferRegistry(size_t max_buffers = 4096)
      : BufferRegistry(BufferRegistryOptions{.max_buffers = max_buffers}) {}
  explicit BufferRegistry(BufferRegistryOptions options);

  // From now on, buffers staged or registered by name are registered (local access only) with
  // `registrar` (the transfer engine; borrowed; null = none), which must outlive every BufferRef
  // of this registry. Call before the first buffer arrives (buffers already held stay
  // unregistered).
  void AttachRegistrar(transfer::MemoryRegistrar* registrar) { registrar_.store(registrar); }
  // Bytes of buffers registered with the rdma transport now, and registrations refused
  // (budget or device) so far.
  uint64_t RdmaBytes() const;
  uint64_t RdmaRefusals() const;

  // Maps `size` bytes (0 = the whole object) of `fd`, which it takes (closed on every path).
  // Refused (INVALID_ARGUMENT): not a regular file on tmpfs or hugetlbfs (a shm object or a
  // memfd), not open O_RDWR, empty, or smaller than `size`. `label` names it in logs.
  static absl::StatusOr<BufferRef> MapFd(int fd, uint64_t size, std::string label);

  // Parks `buffer` for `owner` under a fresh 128-bit random handle (32 hex digits) that Claim
  // takes once. Counts toward the limits of the owner and of its `account` (empty: the owner is
  // its own account) from now on (RESOURCE_EXHAUSTED naming the flag).
  absl::StatusOr<std::string> Stage(BufferRef buffer, const std::string& owner,
                                    const std::string& account = "");
  // The staged buffer becomes a registered buffer of its owner: its id. NOT_FOUND for an
  // unknown or already claimed handle.
  absl::StatusOr<uint64_t> Claim(std::string_view handle);

  // Opt-in legacy path (--store_allow_named_buffers): opens the shm object by name with the
  // daemon's own rights. Maps `size` bytes; size 0 maps the whole object. Errors: missing
  // object, size larger than the object, too many buffers.
  absl::StatusOr<uint64_t> Register(const std::string& shm_name, uint64_t size,
                                    const std::string& owner = "", const std::string& account = "");
  // NOT_FOUND for an unknown id and for another owner's (the same answer: no oracle).
  absl::Status Unregister(uint64_t buffer_id, std::string_view owner = "");
  // Memory for [offset, offset + length) of buffer `id` of `owner`, holding the buffer in
  // `*ref`. Fails (INVALID_ARGUMENT) when the id is unknown or another owner's, the slice is
  // outside the buffer, the shm object no longer backs it, or the buffer is broken.
  absl::StatusOr<char*> Resolve(uint64_t buffer_id, uint64_t offset, uint64_t length,
                                BufferRef* ref, std::string_view owner = "") const;
  // The buffer part of Resolve, for a request whose many slices name few buffers: look it up
  // once, then ResolvedBuffer::Slice per slice (one fstat per buffer instead of per slice).
  absl::StatusOr<ResolvedBuffer> ResolveBuffer(uint64_t buffer_id,
                                               std::string_view owner = "") const;
  // Drops the owner's registered and staged buffers (unmapped once no request holds them);
  // returns how many.
  size_t ReleaseOwner(const std::string& owner);
  size_t Count() const;
  size_t CountOwned(const std::string& owner) const;
  // Buffers (registered and staged) and bytes of every owner of `account`.
  std::pair<size_t, uint64_t> AccountUsage(const std::string& account) const;
  uint64_t OwnerMismatches() const { return owner_mismatches_.load(); }

  // Buffers and bytes charged to an owner or an account.
  struct Usage {
    size_t buffers = 0;
    uint64_t bytes = 0;
  };

 private:
  struct Entry {
    BufferRef buffer;
    std::string owner;
    std::string account;
  };
  // OK when `owner` (of `account`) may hold one more buffer of `size` bytes.
  absl::Status CheckLimitsLocked(const std::string& owner, const std::string& account,
                                 uint64_t size) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ChargeLocked(const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefundLocked(const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountRefusal(const char* limit) const;
  void CountMismatch() const;
  // `buffer`, or, when a registrar is attached and the budget allows, the same buffer held
  // through a holder that keeps it registered until the last reference goes (an aliasing
  // BufferRef).
  BufferRef RegisterWithRdma(BufferRef buffer);

  struct RdmaBudget {
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> refusals{0};
  };

  const BufferRegistryOptions options_;
  // Shared with the holders, which may outlive the registry by the length of a request.
  const std::shared_ptr<RdmaBudget> rdma_budget_ = std::make_shared<RdmaBudget>();
  std::atomic<transfer::MemoryRegistrar*> registrar_{nullptr};
  mutable std::atomic<uint64_t> owner_mismatches_{0};
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> buffers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Entry> staged_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Usage> usage_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Usage> account_usage_ ABSL_GUARDED_BY(mu_);
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mc::client
