// FdSession: the application side of mc-client's fd socket (client/buffers/fd_channel.h describes
// the protocol): one connection, its owner token, and the registration of shared-memory buffers by
// file descriptor. For C++ tools (mc-admin, mc-bench) and tests; the Python client has its own
// (python/mcstore/_fdchannel.py). Store calls that use the buffers must send
// `x-mc-owner: owner()`; closing the session (or exiting) releases them. Thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace mc::client {

inline constexpr uint32_t kFdOpRegister = 1;
inline constexpr uint32_t kFdOpHello = 2;
inline constexpr uint32_t kFdOpRegisterGpu = 3;  // a POSIX-fd GPU handle; reply "OK owner ticket"
inline constexpr size_t kFdRequestSize = 16;

// The 16-byte request: "MCF1", u32 op, u64 size, little-endian.
std::string FdRequest(uint32_t op, uint64_t size);

// The fd socket next to a Store address "unix:PATH" (PATH.fd); "" for a TCP address.
std::string DefaultFdSocket(std::string_view store_address);

class FdSession {
 public:
  // Connects and says HELLO (timeout_ms bounds each exchange).
  static absl::StatusOr<std::unique_ptr<FdSession>> Open(const std::string& path,
                                                         int64_t timeout_ms = 10'000);
  ~FdSession();
  FdSession(const FdSession&) = delete;
  FdSession& operator=(const FdSession&) = delete;

  const std::string& owner() const { return owner_; }
  // Passes `fd` (open O_RDWR on a shm object or memfd; the caller keeps it) for `size` bytes
  // (0 = all); returns the one-time handle for RegisterBuffer.
  absl::StatusOr<std::string> Register(int fd, uint64_t size);

 private:
  explicit FdSession(int sock) : sock_(sock) {}
  // Sends `msg` (with `fd` when >= 0); the reply's owner and handle fields.
  absl::Status Ask(const std::string& msg, int fd, std::string* owner, std::string* handle);

  int sock_;
  std::string owner_;
};

}  // namespace mc::client
