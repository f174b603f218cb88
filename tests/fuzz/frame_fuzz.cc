// libFuzzer target: data-plane frame decoding, and the server's request handling. Each input is
// decoded as a header (must never read out of bounds or accept a malformed frame), then sent
// raw on a fresh connection to a live TcpDataServer serving one small segment: the server must
// answer or close, never crash, and never touch memory outside the segment. An input whose
// first byte is '!' goes (less that byte) to a second server that runs authentication, after a
// valid handshake: a member sending junk and forged capabilities, which must never change a byte
// of that server's segment.
#include <poll.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/auth.h"
#include "common/capability.h"
#include "common/clock.h"
#include "common/logging.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/handshake.h"
#include "transfer/tcp/server.h"
#include "transfer/tcp/socket_util.h"
#include "transfer/transfer_engine.h"

namespace {

using namespace mc::transfer;

struct Fixture {
  explicit Fixture(bool authenticated) : memory(4096, 'S'), verifier({}, mc::RealClock::Get()) {
    mc::SetLogLevel("off");
    table.Add(5, memory.data(), memory.size());
    tcp::TcpDataServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.socket_buffers = {.send_bytes = 1 << 16, .receive_bytes = 1 << 16};
    o.max_frame_length = 1 << 20;
    o.io_timeout_ms = 200;
    if (authenticated) {
      keys = *mc::auth::ClusterKeys::FromSecrets({std::string(40, 'k')});
      verifier.SetKey(std::string(32, 'o'));
      o.cluster_keys = keys;
      o.capabilities = &verifier;
    }
    server = std::make_unique<tcp::TcpDataServer>(o, table);
    if (!server->Start().ok()) abort();
  }
  std::vector<char> memory;
  SegmentTable table;
  mc::auth::ClusterKeysPtr keys;
  mc::auth::CapabilityVerifier verifier;
  std::unique_ptr<tcp::TcpDataServer> server;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* plain = new Fixture(false);
  static Fixture* authed = new Fixture(true);
  Fixture* fx = plain;
  if (size > 0 && data[0] == '!') {
    fx = authed;
    ++data;
    --size;
  }
  if (size >= tcp::kFrameHeaderSize) {
    auto h = tcp::DecodeFrameHeader(data, tcp::kFrameHeaderSize, 1 << 20);
    if (h.ok() && (h->magic != tcp::kFrameMagic || h->length > (1u << 20))) abort();
  }
  (void)tcp::DecodeFrameHeader(data, size, 1 << 20);  // wrong sizes are refused, not read
  auto fd = tcp::ConnectTcp(fx->server->endpoint(), {1 << 16, 1 << 16}, 0);
  if (!fd.ok()) return 0;
  if (fx->keys != nullptr &&
      !tcp::ClientHandshake(fd->get(), *fx->keys, mc::RealClock::Get().NowMs() + 2000).ok()) {
    return 0;
  }
  size_t sent = 0;
  while (sent < size) {
    pollfd p{fd->get(), POLLOUT, 0};
    if (::poll(&p, 1, 200) <= 0) break;
    const ssize_t n = ::send(fd->get(), data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd->get(), SHUT_WR);
  char buf[4096];
  for (int i = 0; i < 64; ++i) {  // drain the answers until the server closes (bounded)
    pollfd p{fd->get(), POLLIN, 0};
    if (::poll(&p, 1, 300) <= 0) break;
    if (::recv(fd->get(), buf, sizeof(buf), 0) <= 0) break;
  }
  // No forged capability may have written the authenticated server's segment.
  for (char c : authed->memory) {
    if (c != 'S') abort();
  }
  return 0;
}
