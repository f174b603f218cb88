// GpuFdTickets: the POSIX-fd GPU handles (cuMemExportToShareableHandle(..., POSIX_FILE_
// DESCRIPTOR)) an application passes over the fd channel (op REGISTER_GPU_FD), parked for its
// session's owner until RegisterGpuBuffer{kind: GPU_HANDLE_POSIX_FD, fd_ticket} names them.
//
// Why: a CUDA IPC handle is 64 bytes any process of the node can replay; an fd reaches the
// daemon only from a process that holds it, over a socket whose peer credentials are logged
// (DESIGN.md invariant 8).
// Tickets are random 64-bit values (never 0), one-time, and bound to the owner that parked them:
// another owner's ticket, a used one and an unknown one all answer NOT_FOUND. Bounds: at most
// `max_per_owner` parked fds per owner and `max_total` in all (RESOURCE_EXHAUSTED past them);
// a session's parked fds are closed when it ends (ReleaseOwner), every fd at destruction.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mc::client {

class GpuFdTickets {
 public:
  explicit GpuFdTickets(size_t max_per_owner = 16, size_t max_total = 1024)
      : max_per_owner_(max_per_owner), max_total_(max_total) {}
  ~GpuFdTickets();
  GpuFdTickets(const GpuFdTickets&) = delete;
  GpuFdTickets& operator=(const GpuFdTickets&) = delete;

  // Takes `fd` (closed here on every error) and returns its ticket.
  absl::StatusOr<uint64_t> Park(int fd, const std::string& owner);
  // The parked fd of `ticket` for `owner`, handed over (the caller closes it).
  absl::StatusOr<int> Take(uint64_t ticket, std::string_view owner);
  // Closes every fd `owner` parked; returns how many.
  size_t ReleaseOwner(std::string_view owner);
  size_t Count() const;

 private:
  struct Parked {
    int fd;
    std::string owner;
  };
  const size_t max_per_owner_;
  const size_t max_total_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Parked> parked_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> per_owner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::client
