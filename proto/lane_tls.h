// TLS for the master lane (docs/security.md, "The master lane"): the same certificate files and
// rules as the master's gRPC TLS (proto/grpc_tls.h), applied with OpenSSL on the lane's blocking
// sockets. TLS 1.2 or later (1.3 preferred: OpenSSL negotiates the highest), no renegotiation.
// Server: its certificate and key; with a client CA every client must present a certificate
// that chains to it. Client: the server must chain to the CA file and name the expected host
// (the dialled host, or the server-name override) in its subjectAltName (DNS or IP entry), as
// gRPC checks; a client certificate is presented when given. The handshake is bounded in time.
// A `Stream` reads and writes a connection's bytes, through TLS or plaintext.
// Thread-safe: a TlsContext is immutable once made and shared; a Stream is used by one thread.
// OpenSSL writes with write(): the calling thread must ignore or block SIGPIPE (the daemons
// ignore it, common/daemon_shell.h; the master lane's threads block it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/grpc_tls.h"
#include "proto/master_lane_frame.h"

struct ssl_st;
struct ssl_ctx_st;

namespace mc::lane {

// One connection's byte stream: `ssl` (owned, may be null: plaintext) over `fd` (borrowed, not
// closed here). Blocking; the socket's SO_RCVTIMEO / SO_SNDTIMEO bound each wait.
class Stream {
 public:
  Stream(int fd, ssl_st* ssl) : fd_(fd), ssl_(ssl) {}
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Exactly n bytes; false on EOF, timeout (timed_out() then true) or error. A plaintext read
  // interrupted by a signal (EINTR) goes on.
  bool ReadExactly(char* dst, size_t n);
  // ReadExactly as the frame readers take it (proto/master_lane_frame.h); valid while this is.
  lane::ReadExactly Reader() {
    return [this](char* dst, size_t n) { return ReadExactly(dst, n); };
  }
  // All of `bytes`; false when not all of it left.
  bool WriteAll(const std::string& bytes);
  // A TLS close_notify (best effort) before the socket is closed.
  void Shutdown();
  int fd() const { return fd_; }
  bool timed_out() const { return timed_out_; }

 private:
  const int fd_;
  ssl_st* const ssl_;
  bool timed_out_ = false;
};

class TlsContext {
 public:
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // INVALID_ARGUMENT naming the file that cannot be used (the daemons check the files at start
  // with TlsServerProblems / TlsChannelProblems).
  static absl::StatusOr<std::shared_ptr<const TlsContext>> ForServer(const TlsServerFiles& files);
  static absl::StatusOr<std::shared_ptr<const TlsContext>> ForClient(const TlsChannelFiles& files);

  // The handshake on connected socket `fd` within `timeout_ms`; then a Stream over it. On
  // failure (timeout, refused certificate, not TLS) the socket is left to the caller to close.
  absl::StatusOr<std::unique_ptr<Stream>> Accept(int fd, int64_t timeout_ms) const;
  // `host`: the name the server's certificate must hold (a DNS name or an IP address).
  absl::StatusOr<std::unique_ptr<Stream>> Connect(int fd, const std::string& host,
                                                  int64_t timeout_ms) const;

 private:
  TlsContext(ssl_ctx_st* ctx, bool server) : ctx_(ctx), server_(server) {}
  absl::StatusOr<std::unique_ptr<Stream>> Handshake(int fd, const std::string& host,
                                                    int64_t timeout_ms) const;
  ssl_ctx_st* const ctx_;
  const bool server_;
};

}  // namespace mc::lane
