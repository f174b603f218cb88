// Small POSIX socket helpers for the tcp transport and data-plane server: resolve, listen,
// connect with a deadline, tune, and blocking exact send/receive that never raise SIGPIPE.
// Thread-safe: functions touch only their arguments.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mc::transfer::tcp {

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Socket buffer sizes asked of the kernel; 0 leaves that buffer to the kernel's autotuning (an
// explicit size locks it: the kernel caps it at net.core.wmem_max / rmem_max and doubles it).
struct SocketBuffers {
  int send_bytes = 0;     // SO_SNDBUF
  int receive_bytes = 0;  // SO_RCVBUF
  // With receive_bytes 0: the autotuned receive buffer starts at about this many bytes (at most
  // net.ipv4.tcp_rmem's max) instead of tcp_rmem's default, and still grows from there.
  int receive_floor_bytes = 0;
};

// The data plane's defaults (mc-client's --tcp_*_buffer_* flags, the tcp transport's options, the
// connection pool and the data-plane server): SO_SNDBUF 8 MiB; SO_RCVBUF autotuned, starting from
// 16 MiB. One place to change them.
inline constexpr SocketBuffers kDataPlaneBuffers{
    .send_bytes = 8 << 20, .receive_bytes = 0, .receive_floor_bytes = 16 << 20};

// TCP_NODELAY and the socket buffer sizes.
void TuneSocket(int fd, SocketBuffers buffers);

// Raises an autotuned receive buffer (receive_bytes 0) to about receive_floor_bytes, best
// effort; does nothing when receive_bytes is set (an explicit SO_RCVBUF) or the floor is 0.
// TuneSocket calls it; the data-plane server calls it for a connection once it is admitted.
void ApplyReceiveFloor(int fd, SocketBuffers buffers);

// A listening socket on "HOST:PORT" (port 0 = any free port); `bound` receives "HOST:PORT".
absl::StatusOr<UniqueFd> ListenTcp(const std::string& endpoint, SocketBuffers buffers,
                                   std::string* bound);

// A connected, tuned, non-blocking socket to "HOST:PORT"; gives up at `deadline_ms`
// (steady ms, 0 = the kernel's connect timeout).
absl::StatusOr<UniqueFd> ConnectTcp(const std::string& endpoint, SocketBuffers buffers,
                                    int64_t deadline_ms);

// Blocking helpers (for blocking sockets): all bytes or an error (EOF is kUnavailable).
absl::Status SendAll(int fd, iovec* iov, int iovcnt);
absl::Status RecvAll(int fd, void* data, uint64_t length);
absl::Status SkipBytes(int fd, uint64_t length);

// Drops `n` consumed bytes from the front of an iovec array; returns the new first index.
size_t ConsumeIov(iovec* iov, size_t count, size_t first, uint64_t n);

}  // namespace mc::transfer::tcp
