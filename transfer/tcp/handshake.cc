#include "transfer/tcp/handshake.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "transfer/tcp/frame.h"

namespace mc::transfer::tcp {
namespace {

constexpr std::string_view kServerLabel = "mcstore/v1/dp-server\n";
constexpr std::string_view kClientLabel = "mcstore/v1/dp-client\n";
constexpr std::string_view kSessionLabel = "mcstore/v1/dp-session\n";
constexpr uint64_t kWishPlaintext = 0;
constexpr uint64_t kWishEncrypted = 1;

// The MACed transcript; an encrypted connection's ends with 0x01 (binds the agreed mode).
std::string Transcript(std::string_view label, std::string_view nc, std::string_view ns,
                       bool encrypted = false) {
  std::string out(label);
  out.append(nc).append(ns);
  if (encrypted) out.push_back('\x01');
  return out;
}

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFor(int fd, short events, int64_t deadline_ms) {
  while (true) {
    const int64_t left = deadline_ms - RealClock::Get().NowMs();
    if (left <= 0) return McError(Code::kTransferFailed, "handshake deadline passed");
    pollfd pfd{fd, events, 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (rc > 0) return absl::OkStatus();
    if (rc < 0 && errno != EINTR) {
      return McError(Code::kTransferFailed, absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
}

absl::Status SendFrame(int fd, const FrameHeader& header, std::string_view payload,
                       int64_t deadline_ms) {
  std::string bytes(kFrameHeaderSize, '\0');
  EncodeFrameHeader(header, reinterpret_cast<uint8_t*>(bytes.data()));
  bytes += payload;
  return SendAllBy(fd, bytes.data(), bytes.size(), deadline_ms);
}

std::string_view View(const auth::Mac& mac) {
  return {reinterpret_cast<const char*>(mac.data()), mac.size()};
}

}  // namespace

std::string_view HandshakeFailureName(HandshakeFailure failure) {
  switch (failure) {
    case HandshakeFailure::kNone:
      return "none";
    case HandshakeFailure::kNoHandshake:
      return "no_handshake";
    case HandshakeFailure::kMalformed:
      return "malformed";
    case HandshakeFailure::kBadMac:
      return "bad_mac";
    case HandshakeFailure::kTimeout:
      return "timeout";
    case HandshakeFailure::kClosed:
      return "closed";
    case HandshakeFailure::kPlaintext:
      return "plaintext_refused";
    case HandshakeFailure::kCount:
      break;
  }
  return "invalid";
}

absl::Status SendAllBy(int fd, const void* data, size_t length, int64_t deadline_ms) {
  const char* p = static_cast<const char*>(data);
  while (length > 0) {
    const ssize_t n = ::send(fd, p, length, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      length -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      MC_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline_ms));
      continue;
    }
    return McError(Code::kTransferFailed, absl::StrCat("send: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status RecvAllBy(int fd, void* data, size_t length, int64_t deadline_ms) {
  char* p = static_cast<char*>(data);
  while (length > 0) {
    const ssize_t n = ::recv(fd, p, length, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      length -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return McError(Code::kUnavailable, "peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      MC_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline_ms));
      continue;
    }
    return McError(Code::kTransferFailed, absl::StrCat("recv: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ClientHandshake(int fd, const auth::ClusterKeys& keys, int64_t deadline_ms,
                             SessionKeys* session) {
  const bool encrypt = session != nullptr;
  const std::string nc = auth::RandomBytes(kHandshakeNonceSize);
  MC_RETURN_IF_ERROR(SendFrame(
      fd, MakeRequest(FrameOp::kAuth, 1, encrypt ? kWishEncrypted : kWishPlaintext, 0, nc.size()),
      nc, deadline_ms));
  // Step 2: the server's nonce and proof.
  uint8_t buf[kFrameHeaderSize];
  MC_RETURN_IF_ERROR(RecvAllBy(fd, buf, sizeof(buf), deadline_ms));
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(buf, sizeof(buf), 1024);
  if (!h.ok())
    return McError(Code::kTransferFailed, absl::StrCat("handshake: ", h.status().message()));
  if (!h->is_response() || h->base_op() != static_cast<uint16_t>(FrameOp::kAuth) ||
      h->request_id != 1) {
    return McError(Code::kTransferFailed, "handshake: the server answered another op");
  }
  if (h->code != 0) {
    return McError(CodeFromInt(static_cast<int>(h->code)),
                   encrypt ? "handshake refused by the server"
                           : "handshake refused by the server (does it require "
                             "--data_encryption=on?)");
  }
  if (h->segment_id != (encrypt ? kWishEncrypted : kWishPlaintext)) {
    return McError(Code::kPermissionDenied,
                   "handshake: the server answered another encryption mode than asked");
  }
  if (h->length != kHandshakeNonceSize + auth::kMacSize) {
    return McError(Code::kTransferFailed, "handshake: bad server proof size");
  }
  std::string reply(h->length, '\0');
  MC_RETURN_IF_ERROR(RecvAllBy(fd, reply.data(), reply.size(), deadline_ms));
  const std::string_view ns = std::string_view(reply).substr(0, kHandshakeNonceSize);
  const auto* server_mac = reinterpret_cast<const uint8_t*>(reply.data() + kHandshakeNonceSize);
  // Which of our secrets the server signed with (the session keys come from that one).
  const std::string server_transcript = Transcript(kServerLabel, nc, ns, encrypt);
  const std::string_view server_mac_view(reinterpret_cast<const char*>(server_mac), auth::kMacSize);
  size_t server_secret = keys.secret_count();
  for (size_t i = 0; i < keys.secret_count(); ++i) {
    if (auth::ConstantTimeEqual(
            View(keys.SignWith(i, auth::Purpose::kDataPlane, server_transcript)),
            server_mac_view)) {
      server_secret = i;
      break;
    }
  }
  if (server_secret == keys.secret_count()) {
    return McError(Code::kPermissionDenied,
                   "handshake: the server does not hold our cluster secret");
  }
  // Step 3: our proof; step 4: the verdict.
  const auth::Mac mine =
      keys.Sign(auth::Purpose::kDataPlane, Transcript(kClientLabel, nc, ns, encrypt));
  MC_RETURN_IF_ERROR(
      SendFrame(fd, MakeRequest(FrameOp::kAuth, 2, 0, 1, auth::kMacSize), View(mine), deadline_ms));
  MC_RETURN_IF_ERROR(RecvAllBy(fd, buf, sizeof(buf), deadline_ms));
  h = DecodeFrameHeader(buf, sizeof(buf), 0);
  if (!h.ok() || !h->is_response() || h->base_op() != static_cast<uint16_t>(FrameOp::kAuth) ||
      h->request_id != 2) {
    return McError(Code::kTransferFailed, "handshake: bad verdict frame");
  }
  if (h->code != 0) {
    return McError(Code::kPermissionDenied, "handshake: the server refused our proof");
  }
  if (encrypt) {
    *session = DeriveSessionKeys(
        keys.SignWith(server_secret, auth::Purpose::kDataPlane, Transcript(kSessionLabel, nc, ns)));
  }
  return absl::OkStatus();
}

HandshakeFailure ServerHandshake(int fd, const auth::ClusterKeys& keys, int64_t deadline_ms,
                                 std::string* detail, bool require_encryption, bool* encrypted,
                                 SessionKeys* session) {
  auto io_failure = [&](const absl::Status& s) {
    *detail = std::string(s.message());
    return ToCode(s) == Code::kTransferFailed && s.message().find("deadline") != std::string::npos
               ? HandshakeFailure::kTimeout
               : HandshakeFailure::kClosed;
  };
  uint8_t buf[kFrameHeaderSize];
  if (absl::Status s = RecvAllBy(fd, buf, sizeof(buf), deadline_ms); !s.ok()) return io_failure(s);
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(buf, sizeof(buf), kHandshakeNonceSize);
  if (!h.ok()) {
    // A data op with a large length fails the small limit: tell it apart from junk.
    absl::StatusOr<FrameHeader> any = DecodeFrameHeader(buf, sizeof(buf));
    const bool other_op = any.ok() && any->base_op() != static_cast<uint16_t>(FrameOp::kAuth);
    *detail = other_op ? absl::StrCat("op ", any->op, " before the handshake")
                       : std::string(h.status().message());
    return other_op ? HandshakeFailure::kNoHandshake : HandshakeFailure::kMalformed;
  }
  if (h->base_op() != static_cast<uint16_t>(FrameOp::kAuth)) {
    *detail = absl::StrCat("op ", h->op, " before the handshake");
    return HandshakeFailure::kNoHandshake;
  }
  if (h->is_response() || h->offset != 0 ||
      (h->segment_id != kWishPlaintext && h->segment_id != kWishEncrypted) ||
      h->length != kHandshakeNonceSize) {
    *detail = "AUTH step 1 malformed";
    return HandshakeFailure::kMalformed;
  }
  const FrameHeader hello = *h;
  const bool encrypt = hello.segment_id == kWishEncrypted;
  std::string nc(kHandshakeNonceSize, '\0');
  if (absl::Status s = RecvAllBy(fd, nc.data(), nc.size(), deadline_ms); !s.ok()) {
    return io_failure(s);
  }
  if (require_encryption && !encrypt) {
    // Best effort: the connection closes next either way.
    (void)SendFrame(fd, MakeResponse(hello, Code::kPermissionDenied, 0), {}, deadline_ms);
    *detail = "the requester asked for a plaintext connection; this server requires encryption";
    return HandshakeFailure::kPlaintext;
  }
  const std::string ns = auth::RandomBytes(kHandshakeNonceSize);
  const auth::Mac proof =
      keys.Sign(auth::Purpose::kDataPlane, Transcript(kServerLabel, nc, ns, encrypt));
  std::string reply = ns;
  reply.append(View(proof));
  if (absl::Status s =
          SendFrame(fd, MakeResponse(hello, Code::kOk, reply.size()), reply, deadline_ms);
      !s.ok()) {
    return io_failure(s);
  }
  if (absl::Status s = RecvAllBy(fd, buf, sizeof(buf), deadline_ms); !s.ok()) return io_failure(s);
  h = DecodeFrameHeader(buf, sizeof(buf), auth::kMacSize);
  if (!h.ok() || h->is_response() || h->base_op() != static_cast<uint16_t>(FrameOp::kAuth) ||
      h->offset != 1 || h->segment_id != 0 || h->length != auth::kMacSize) {
    *detail = "AUTH step 3 malformed";
    return HandshakeFailure::kMalformed;
  }
  const FrameHeader step3 = *h;
  auth::Mac theirs{};
  if (absl::Status s = RecvAllBy(fd, theirs.data(), theirs.size(), deadline_ms); !s.ok()) {
    return io_failure(s);
  }
  const bool ok = keys.Verify(auth::Purpose::kDataPlane, Transcript(kClientLabel, nc, ns, encrypt),
                              theirs.data(), theirs.size());
  // The verdict either way (best effort on failure: the connection closes next).
  const absl::Status sent = SendFrame(
      fd, MakeResponse(step3, ok ? Code::kOk : Code::kPermissionDenied, 0), {}, deadline_ms);
  if (!ok) {
    *detail = "the requester's proof does not verify under our cluster secret";
    return HandshakeFailure::kBadMac;
  }
  if (!sent.ok()) return io_failure(sent);
  if (encrypted != nullptr) *encrypted = encrypt;
  if (encrypt && session != nullptr) {
    // Under the signing secret, the one our proof was made with (the requester follows it).
    *session =
        DeriveSessionKeys(keys.Sign(auth::Purpose::kDataPlane, Transcript(kSessionLabel, nc, ns)));
  }
  return HandshakeFailure::kNone;
}

}  // namespace mc::transfer::tcp
