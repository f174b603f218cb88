// FdChannelServer: the fd side channel of the Store service, a Unix SOCK_SEQPACKET socket
// (default path: <unix_socket>.fd, same mode and group) over which an application hands the
// daemon a shared-memory buffer as an open file descriptor (SCM_RIGHTS).
//
// Why a file descriptor: the kernel checked the caller's own rights when it opened the object,
// so the daemon (often root) maps only memory the caller may itself read and write. A name would
// be opened with the daemon's rights instead.
//
// Protocol (little-endian; one message per datagram):
//   request  16 bytes: "MCF1", u32 op, u64 size; op 1 REGISTER carries exactly one fd,
//            op 2 HELLO carries none, op 3 REGISTER_GPU carries exactly one fd: a POSIX-fd
//            GPU handle (cuMemExportToShareableHandle), parked in GpuFdTickets (size unused).
//   reply    text: "OK <owner> <handle>" (HELLO: handle "-"; REGISTER_GPU: the decimal
//            fd_ticket that RegisterGpuBuffer takes), or "ERR <CODE> <message>".
// Each connection is a session: at accept it gets a random owner token (the `x-mc-owner` the
// application then sends with its Store calls), and SO_PEERCRED (pid, uid) is logged with each
// registration. REGISTER checks the fd (BufferRegistry::MapFd: a regular tmpfs/hugetlbfs file,
// O_RDWR, at least `size` bytes), maps it and stages it under a one-time handle that
// RegisterBuffer takes. When the connection closes (the process exited or closed it) every
// buffer of the session is released, once no in-flight request uses it.
//
// Bounds: max_connections sessions in all and max_connections_per_uid per peer uid (more are
// answered ERR and closed); a connection must send its first message within
// first_message_timeout_ms; a malformed message (wrong size, unknown op, no fd, several fds,
// a bad fd) is answered ERR, its fds closed, and the session goes on. One thread polls every
// connection. Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/access/store_auth.h"
#include "client/buffers/buffer_registry.h"
#include "client/buffers/fd_session.h"
#include "client/gpu/gpu_fd_tickets.h"
#include "common/metrics.h"

namespace mc::client {

struct FdChannelOptions {
  std::string path;                  // the socket; required
  mode_t mode = 0660;                // --unix_socket_mode
  std::optional<gid_t> group;        // --unix_socket_group
  int max_connections = 128;         // --store_fd_max_connections
  int max_connections_per_uid = 32;  // --store_fd_max_connections_per_uid
  int64_t first_message_timeout_ms = 5000;
};

class FdChannelServer final : public CallerSessions {
 public:
  // `buffers` and `metrics` are borrowed and must outlive this object.
  FdChannelServer(FdChannelOptions options, BufferRegistry& buffers, MetricsRegistry& metrics);
  ~FdChannelServer() override;

  // Also called with the owner of every session that ends (after its shm buffers went),
  // returning how many of the owner's other resources it released (e.g. GPU buffers). Before
  // Start only.
  using SessionEndHook = std::function<size_t(const std::string& owner)>;
  void AddSessionEndHook(SessionEndHook hook) { session_end_hooks_.push_back(std::move(hook)); }
  // Where REGISTER_GPU parks its fds (borrowed; null: the op is refused, no GPU buffers here).
  // Before Start only; the caller also releases the session's tickets with a session-end hook.
  void SetGpuFdTickets(GpuFdTickets* tickets) { gpu_fd_tickets_ = tickets; }

  // Binds (replacing a stale socket), applies mode and group, listens, starts the thread.
  absl::Status Start();
  // Stops the thread, closes every connection (releasing their buffers), unlinks the socket.
  void Stop();

  bool IsLive(std::string_view owner) const override;
  // "uid:N" of the session's peer (SO_PEERCRED); the owner itself when it is no live session.
  std::string AccountOf(std::string_view owner) const override;
  std::optional<uid_t> UidOf(std::string_view owner) const override;
  static std::string AccountOfUid(uid_t uid);
  size_t Sessions() const;

 private:
  struct Conn {
    int fd = -1;
    std::string owner;
    pid_t pid = 0;
    uid_t uid = 0;
    int64_t accepted_ms = 0;
    bool spoke = false;
  };
  void Loop();
  void Accept();
  // Reads one message of `conn`; false when the connection is to be closed.
  bool Serve(Conn& conn);
  std::string Handle(Conn& conn, const char* msg, ssize_t len, int msg_flags, int* fds, int nfds);
  void Close(Conn& conn);
  void Count(const char* result);

  const FdChannelOptions options_;
  BufferRegistry& buffers_;
  MetricsRegistry& metrics_;
  std::vector<SessionEndHook> session_end_hooks_;  // fixed once started
  GpuFdTickets* gpu_fd_tickets_ = nullptr;         // fixed once started
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop wakes the loop
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  // Only the loop thread touches conns_; live owners are read by the Store handlers.
  absl::flat_hash_map<int, Conn> conns_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uid_t> live_owners_ ABSL_GUARDED_BY(mu_);  // owner -> uid
};

}  // namespace mc::client
