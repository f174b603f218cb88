#include "client/gpu/gpu_fd_tickets.h"

#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/status.h"

namespace mc::client {

GpuFdTickets::~GpuFdTickets() {
  absl::MutexLock lock(&mu_);
  for (auto& [ticket, p] : parked_) close(p.fd);
}

absl::StatusOr<uint64_t> GpuFdTickets::Park(int fd, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  if (parked_.size() >= max_total_) {
    close(fd);
    return McError(Code::kNoSpace, absl::StrCat("too many GPU handles waiting for "
                                                "RegisterGpuBuffer (",
                                                max_total_, ")"));
  }
  size_t& mine = per_owner_[owner];
  if (mine >= max_per_owner_) {
    close(fd);
    return McError(Code::kNoSpace, absl::StrCat("this session has ", mine,
                                                " GPU handles waiting for "
                                                "RegisterGpuBuffer; register or close them first"));
  }
  uint64_t ticket = 0;
  while (ticket == 0 || parked_.contains(ticket)) ticket = auth::RandomU64();
  parked_[ticket] = Parked{fd, owner};
  ++mine;
  return ticket;
}

absl::StatusOr<int> GpuFdTickets::Take(uint64_t ticket, std::string_view owner) {
  absl::MutexLock lock(&mu_);
  auto it = parked_.find(ticket);
  if (it == parked_.end() || it->second.owner != owner) {
    return McError(Code::kNotFound,
                   "no GPU handle parked under this fd_ticket for this caller (pass the fd over "
                   "the fd socket first, from the session whose x-mc-owner this call sends)");
  }
  const int fd = it->second.fd;
  auto mine = per_owner_.find(it->second.owner);
  if (mine != per_owner_.end() && --mine->second == 0) per_owner_.erase(mine);
  parked_.erase(it);
  return fd;
}

size_t GpuFdTickets::ReleaseOwner(std::string_view owner) {
  std::vector<int> fds;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (it->second.owner == owner) {
        fds.push_back(it->second.fd);
        parked_.erase(it++);
      } else {
        ++it;
      }
    }
    per_owner_.erase(std::string(owner));
  }
  for (int fd : fds) close(fd);
  return fds.size();
}

size_t GpuFdTickets::Count() const {
  absl::MutexLock lock(&mu_);
  return parked_.size();
}

}  // namespace mc::client
