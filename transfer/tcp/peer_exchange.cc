#include "transfer/tcp/peer_exchange.h"

#include <fcntl.h>
#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/handshake.h"
#include "transfer/tcp/sealed_records.h"
#include "transfer/tcp/socket_util.h"

namespace mc::transfer::tcp {

absl::StatusOr<std::string> TcpPeerExchange::Exchange(const std::string& endpoint, DataOp op,
                                                      std::string_view payload,
                                                      uint64_t max_response_bytes) {
  const auto frame_op = static_cast<uint16_t>(op);
  if (CarriesCapability(frame_op) || frame_op > kMaxFrameOp) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("data-plane op ", frame_op, " is not a setup exchange"));
  }
  const int64_t deadline = RealClock::Get().NowMs() + timeout_ms_;
  auto fd = ConnectTcp(endpoint, {}, deadline);
  if (!fd.ok()) return fd.status();
  SessionKeys session;
  const bool encrypt = keys_ != nullptr && encrypt_;
  if (keys_ != nullptr) {
    MC_RETURN_IF_ERROR(ClientHandshake(fd->get(), *keys_, deadline, encrypt ? &session : nullptr));
  }
  BlockingChannel channel(fd->get(), encrypt ? &session : nullptr, /*server_side=*/false);
  // Blocking from here, bounded by socket timeouts.
  const int flags = fcntl(fd->get(), F_GETFL, 0);
  fcntl(fd->get(), F_SETFL, flags & ~O_NONBLOCK);
  timeval tv{timeout_ms_ / 1000, static_cast<suseconds_t>((timeout_ms_ % 1000) * 1000)};
  setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd->get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

  FrameBytes header =
      EncodeFrameHeader(MakeRequest(static_cast<FrameOp>(frame_op), 1, 0, 0, payload.size()));
  const iovec head{header.data(), header.size()};
  const iovec body{const_cast<char*>(payload.data()), payload.size()};
  MC_RETURN_IF_ERROR(channel.Send(&head, 1, &body, 1));
  FrameBytes reply;
  MC_RETURN_IF_ERROR(channel.ReadExact(reply.data(), reply.size()));
  auto h = DecodeFrameHeader(reply.data(), reply.size(), max_response_bytes);
  if (!h.ok()) return h.status();
  if (!h->is_response() || h->base_op() != frame_op || h->request_id != 1) {
    return McError(Code::kTransferFailed,
                   absl::StrCat("data-plane op ", frame_op, ": unexpected response frame"));
  }
  if (h->code != 0) {
    return McError(static_cast<Code>(h->code),
                   absl::StrCat("data-plane op ", frame_op, " refused by ", endpoint));
  }
  std::string reply_body(h->length, '\0');
  MC_RETURN_IF_ERROR(channel.ReadExact(reply_body.data(), reply_body.size()));
  return reply_body;
}

}  // namespace mc::transfer::tcp
