// libFuzzer target: data-plane frame decoding, and the server's request handling. Each input is
// decoded as a header (must never read out of bounds or accept a malformed frame), then sent
// raw on a fresh connection to a live TcpDataServer serving one small segment: the server must
// answer or close, never crash, and never touch memory outside the segment.
#include <poll.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/logging.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/server.h"
#include "transfer/tcp/socket_util.h"
#include "transfer/transfer_engine.h"

namespace {

using namespace mc::transfer;

struct Fixture {
  Fixture() : memory(4096) {
    mc::SetLogLevel("off");
    table.Add(5, memory.data(), memory.size());
    tcp::TcpDataServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.socket_buffer_bytes = 1 << 16;
    o.max_frame_length = 1 << 20;
    o.io_timeout_ms = 200;
    server = std::make_unique<tcp::TcpDataServer>(o, table);
    if (!server->Start().ok()) abort();
  }
  std::vector<char> memory;
  SegmentTable table;
  std::unique_ptr<tcp::TcpDataServer> server;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fx = new Fixture();
  if (size >= tcp::kFrameHeaderSize) {
    auto h = tcp::DecodeFrameHeader(data, tcp::kFrameHeaderSize, 1 << 20);
    if (h.ok() && (h->magic != tcp::kFrameMagic || h->length > (1u << 20))) abort();
  }
  (void)tcp::DecodeFrameHeader(data, size, 1 << 20);  // wrong sizes are refused, not read
  auto fd = tcp::ConnectTcp(fx->server->endpoint(), 1 << 16, 0);
  if (!fd.ok()) return 0;
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
  return 0;
}
