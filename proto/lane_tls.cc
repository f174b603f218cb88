#include "proto/lane_tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mc::lane {
namespace {

std::string SslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "connection closed or timed out";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

// TLS 1.2+, no renegotiation, no compression.
SSL_CTX* NewContext(bool server) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return nullptr;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
  return ctx;
}

absl::Status FileError(const std::string& what, const std::string& file) {
  return absl::InvalidArgumentError(
      absl::StrCat("master lane TLS: cannot use ", what, " ", file, ": ", SslError()));
}

bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

Stream::~Stream() {
  if (ssl_ != nullptr) SSL_free(ssl_);
}

bool Stream::ReadExactly(char* dst, size_t n) {
  size_t have = 0;
  while (have < n) {
    ssize_t r;
    if (ssl_ == nullptr) {
      r = recv(fd_, dst + have, n - have, 0);
      if (r < 0 && errno == EINTR) continue;
    } else {
      ERR_clear_error();
      errno = 0;
      r = SSL_read(ssl_, dst + have, static_cast<int>(std::min<size_t>(n - have, 1 << 30)));
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) timed_out_ = true;
    if (r <= 0) return false;
    have += static_cast<size_t>(r);
  }
  return true;
}

bool Stream::WriteAll(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n;
    if (ssl_ == nullptr) {
      n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
    } else {
      ERR_clear_error();
      n = SSL_write(ssl_, bytes.data() + sent,
                    static_cast<int>(std::min<size_t>(bytes.size() - sent, 1 << 30)));
    }
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

void Stream::Shutdown() {
  if (ssl_ != nullptr) {
    ERR_clear_error();
    SSL_shutdown(ssl_);  // one close_notify; the peer's is not waited for
  }
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::ForServer(
    const TlsServerFiles& files) {
  SSL_CTX* ctx = NewContext(/*server=*/true);
  if (ctx == nullptr) return absl::InternalError("master lane TLS: SSL_CTX_new failed");
  std::shared_ptr<const TlsContext> out(new TlsContext(ctx, true));
  SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: nothing unasked arrives after the greeting
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1) {
    return FileError("certificate", files.cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return FileError("key", files.key_file);
  }
  if (!files.client_ca_file.empty()) {  // as gRPC's REQUEST_AND_REQUIRE_..._AND_VERIFY
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.client_ca_file.c_str());
    if (names == nullptr ||
        SSL_CTX_load_verify_locations(ctx, files.client_ca_file.c_str(), nullptr) != 1) {
      if (names != nullptr) sk_X509_NAME_pop_free(names, X509_NAME_free);
      return FileError("client CA", files.client_ca_file);
    }
    SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::ForClient(
    const TlsChannelFiles& files) {
  SSL_CTX* ctx = NewContext(/*server=*/false);
  if (ctx == nullptr) return absl::InternalError("master lane TLS: SSL_CTX_new failed");
  std::shared_ptr<const TlsContext> out(new TlsContext(ctx, false));
  if (SSL_CTX_load_verify_locations(ctx, files.ca_file.c_str(), nullptr) != 1) {
    return FileError("CA", files.ca_file);
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!files.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1) {
      return FileError("certificate", files.cert_file);
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      return FileError("key", files.key_file);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Stream>> TlsContext::Accept(int fd, int64_t timeout_ms) const {
  return Handshake(fd, "", timeout_ms);
}

absl::StatusOr<std::unique_ptr<Stream>> TlsContext::Connect(int fd, const std::string& host,
                                                            int64_t timeout_ms) const {
  return Handshake(fd, host, timeout_ms);
}

absl::StatusOr<std::unique_ptr<Stream>> TlsContext::Handshake(int fd, const std::string& host,
                                                              int64_t timeout_ms) const {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) return absl::InternalError("master lane TLS: SSL_new failed");
  auto stream = std::make_unique<Stream>(fd, ssl);  // frees ssl on every path
  if (SSL_set_fd(ssl, fd) != 1) return absl::InternalError("master lane TLS: SSL_set_fd failed");
  if (!server_) {
    if (host.empty()) return absl::InvalidArgumentError("master lane TLS: no host to verify");
    if (IsIpAddress(host)) {
      if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str()) != 1) {
        return absl::InvalidArgumentError("master lane TLS: bad IP address");
      }
    } else if (SSL_set1_host(ssl, host.c_str()) != 1 ||
               SSL_set_tlsext_host_name(ssl, host.c_str()) != 1) {
      return absl::InvalidArgumentError("master lane TLS: bad host name");
    }
  }
  // Non-blocking for the handshake, so that the whole of it (not each read) is bounded.
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  absl::Status status;
  for (;;) {
    ERR_clear_error();
    const int r = server_ ? SSL_accept(ssl) : SSL_connect(ssl);
    if (r == 1) break;
    const int err = SSL_get_error(ssl, r);
    short events = 0;
    if (err == SSL_ERROR_WANT_READ) events = POLLIN;
    if (err == SSL_ERROR_WANT_WRITE) events = POLLOUT;
    if (events == 0) {
      status = absl::UnavailableError(absl::StrCat("master lane TLS handshake: ", SslError()));
      break;
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{.fd = fd, .events = events, .revents = 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30))) == 0) {
      status = absl::DeadlineExceededError("master lane TLS handshake timed out");
      break;
    }
  }
  fcntl(fd, F_SETFL, flags);
  if (!status.ok()) return status;
  return stream;
}

}  // namespace mc::lane
