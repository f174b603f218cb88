// The data server seam (transfer/data_server.h): RequestStream keeps the handler contract (read
// at most the payload, respond once, consume it all) for every transport; the tcp server maps a
// frame to the DataRequest its handlers see and closes a connection whose handler broke the
// contract; the loopback server (tests/fakes/loopback_data_server.h) serves the same handlers
// without a socket.
#include "transfer/data_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/fakes/loopback_data_server.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/server.h"
#include "transfer/tcp/socket_util.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer {
namespace {

TEST(RequestStream, RefusesReadsPastThePayloadWithoutReading) {
  LoopbackDataServer server;
  ASSERT_TRUE(server
                  .RegisterOpHandler(DataOp::kWrite,
                                     [](const DataRequest&, RequestStream& s) {
                                       char buf[16];
                                       EXPECT_EQ(ToCode(s.ReadExact(buf, 11)), Code::kInternal);
                                       EXPECT_EQ(ToCode(s.Skip(11)), Code::kInternal);
                                       EXPECT_EQ(s.payload_left(), 10u);
                                       MC_RETURN_IF_ERROR(s.ReadExact(buf, 4));
                                       MC_RETURN_IF_ERROR(s.Skip(6));
                                       EXPECT_EQ(ToCode(s.Skip(1)), Code::kInternal);
                                       return s.Respond(Code::kOk);
                                     })
                  .ok());
  ASSERT_TRUE(server.Start().ok());
  LoopbackResponse out = server.Serve({.op = DataOp::kWrite, .length = 10}, "0123456789");
  EXPECT_TRUE(out.status.ok()) << out.status;
  EXPECT_TRUE(out.responded);
  EXPECT_EQ(server.closed_connections(), 0);
}

TEST(RequestStream, RefusesASecondResponseAndReadsAfterTheResponse) {
  LoopbackDataServer server;
  ASSERT_TRUE(server
                  .RegisterOpHandler(DataOp::kIndex,
                                     [](const DataRequest&, RequestStream& s) {
                                       MC_RETURN_IF_ERROR(s.Skip(2));
                                       MC_RETURN_IF_ERROR(s.Respond(Code::kNotFound));
                                       EXPECT_EQ(ToCode(s.Skip(1)), Code::kInternal);
                                       EXPECT_EQ(ToCode(s.Respond(Code::kOk)), Code::kInternal);
                                       return absl::OkStatus();  // one bad response refused
                                     })
                  .ok());
  ASSERT_TRUE(server.Start().ok());
  LoopbackResponse out = server.Serve({.op = DataOp::kIndex, .length = 3}, "abc");
  EXPECT_EQ(out.code, Code::kNotFound);  // the first response stands
  // ... and a byte of the payload was left: a transport closes the connection.
  EXPECT_EQ(ToCode(out.status), Code::kInternal);
  EXPECT_EQ(out.payload_left, 1u);
  EXPECT_EQ(server.closed_connections(), 1);
}

TEST(RequestStream, AHandlerThatDoesNotRespondClosesTheConnection) {
  LoopbackDataServer server;
  ASSERT_TRUE(
      server
          .RegisterOpHandler(DataOp::kReadDisk,
                             [](const DataRequest&, RequestStream&) { return absl::OkStatus(); })
          .ok());
  ASSERT_TRUE(server.Start().ok());
  // READ_DISK carries no request payload: `length` is the bytes wanted.
  LoopbackResponse out = server.Serve({.op = DataOp::kReadDisk, .length = 4096});
  EXPECT_EQ(ToCode(out.status), Code::kInternal);
  EXPECT_FALSE(out.responded);
  EXPECT_EQ(ToCode(server.Serve({.op = DataOp::kIndex, .length = 0}).status),
            Code::kInvalidArgument);  // unserved op
  EXPECT_EQ(server.closed_connections(), 2);
}

// The engine's data-plane ops are registered before the engine exists: until one is attached,
// and on an engine whose transports do not serve the op (no rdma), the peer's rdma setup is
// answered UNAVAILABLE (it then stays on tcp) with its payload consumed; a payload too long to
// skip closes the connection instead of being read.
TEST(EngineDataOps, RefusesUntilAnEngineThatServesTheOpIsAttached) {
  LoopbackDataServer server;
  EngineDataOps ops;
  ASSERT_TRUE(ops.RegisterWith(server).ok());
  ASSERT_TRUE(server.Start().ok());
  const std::string setup(8 + 32, '\0');  // a connect request's size for one queue pair
  DataRequest request;
  request.op = DataOp::kRdmaConnect;
  request.length = setup.size();
  LoopbackResponse r = server.Serve(request, setup);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(r.responded);
  EXPECT_EQ(r.code, Code::kUnavailable);
  EXPECT_EQ(r.payload_left, 0u);

  SegmentTable table;
  TransferEngineOptions o;
  o.transport = "tcp";
  TransferEngine tcp_only(o, table);
  ops.Attach(&tcp_only);
  r = server.Serve(request, setup);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.code, Code::kUnavailable);
  EXPECT_EQ(r.payload_left, 0u);

  const std::string huge(kMaxRefusedPayloadBytes + 1, '\0');
  request.length = huge.size();
  r = server.Serve(request, huge);
  EXPECT_FALSE(r.status.ok());
  EXPECT_FALSE(r.responded);
  EXPECT_EQ(r.payload_left, huge.size()) << "nothing read";
  EXPECT_EQ(server.closed_connections(), 1);
  ops.Attach(nullptr);
}

TEST(DataServer, HandlersRegisterOnlyBeforeStart) {
  LoopbackDataServer loopback;
  tcp::TcpDataServerOptions o;
  o.listen_address = "127.0.0.1:0";
  SegmentTable table;
  tcp::TcpDataServer tcp_server(o, table);
  for (DataServer* server : std::vector<DataServer*>{&loopback, &tcp_server}) {
    auto answer = [](const DataRequest&, RequestStream& s) { return s.Respond(Code::kOk); };
    EXPECT_TRUE(server->RegisterOpHandler(DataOp::kReadDisk, answer).ok());
    ASSERT_TRUE(server->Start().ok());
    EXPECT_FALSE(server->RegisterOpHandler(DataOp::kIndex, answer).ok());
    EXPECT_TRUE(server->Health().ok());
    EXPECT_FALSE(server->endpoint().empty());
    server->Stop();
    server->Stop();  // idempotent
  }
}

// A raw connection to a TcpDataServer: frames out, response headers in.
class TcpHandlerContract : public ::testing::Test {
 protected:
  void StartServer(DataOp op, DataOpHandler handler) {
    tcp::TcpDataServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.metrics = &metrics_;
    server_ = std::make_unique<tcp::TcpDataServer>(o, table_);
    ASSERT_TRUE(server_->RegisterOpHandler(op, std::move(handler)).ok());
    ASSERT_TRUE(server_->Start().ok());
    auto fd = tcp::ConnectTcp(server_->endpoint(), {}, RealClock::Get().NowMs() + 5000);
    ASSERT_TRUE(fd.ok()) << fd.status();
    fd_ = std::move(*fd);
    ::fcntl(fd_.get(), F_SETFL, ::fcntl(fd_.get(), F_GETFL) & ~O_NONBLOCK);
    timeval tv{.tv_sec = 5, .tv_usec = 0};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  // Sends `header` (and a zero capability block where the op carries one) and `payload`.
  void Send(const tcp::FrameHeader& header, std::string payload = "") {
    tcp::FrameBytes bytes = tcp::EncodeFrameHeader(header);
    std::string out(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (tcp::CarriesCapability(header.base_op())) out.append(tcp::kCapabilityBlockSize, '\0');
    out += payload;
    iovec iov{out.data(), out.size()};
    ASSERT_TRUE(tcp::SendAll(fd_.get(), &iov, 1).ok());
  }
  absl::StatusOr<tcp::FrameHeader> Receive() {
    tcp::FrameBytes bytes;
    MC_RETURN_IF_ERROR(tcp::RecvAll(fd_.get(), bytes.data(), bytes.size()));
    return tcp::DecodeFrameHeader(bytes.data(), bytes.size());
  }
  // True when the server closed the connection (EOF, not the receive timeout).
  bool ClosedByServer() {
    char c;
    return ::recv(fd_.get(), &c, 1, 0) == 0;
  }

  MetricsRegistry metrics_;
  SegmentTable table_;
  std::unique_ptr<tcp::TcpDataServer> server_;
  tcp::UniqueFd fd_;
};

// The handler gets the frame's fields, and a READ_DISK frame's reserved word as the key tag.
TEST_F(TcpHandlerContract, HandlersSeeTheFrameAsADataRequest) {
  std::vector<DataRequest> seen;
  StartServer(DataOp::kReadDisk, [&](const DataRequest& r, RequestStream& s) {
    seen.push_back(r);
    const std::string data(r.length, 'd');
    const iovec iov{const_cast<char*>(data.data()), data.size()};
    return s.Respond(Code::kOk, {&iov, 1});
  });
  tcp::FrameHeader h = tcp::MakeRequest(tcp::FrameOp::kReadDisk, 77, 1234, 5678, 9);
  h.reserved = 0xABCD;
  Send(h);
  absl::StatusOr<tcp::FrameHeader> r = Receive();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request_id, 77u);
  EXPECT_EQ(r->code, 0u);
  EXPECT_EQ(r->length, 9u);
  std::string payload(9, '\0');
  ASSERT_TRUE(tcp::RecvAll(fd_.get(), payload.data(), payload.size()).ok());
  EXPECT_EQ(payload, std::string(9, 'd'));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].op, DataOp::kReadDisk);
  EXPECT_EQ(seen[0].segment_id, 1234u);
  EXPECT_EQ(seen[0].offset, 5678u);
  EXPECT_EQ(seen[0].length, 9u);
  EXPECT_EQ(seen[0].key_tag, 0xABCDu);
  EXPECT_EQ(seen[0].payload_length, 0u);
}

// A handler that answers without consuming its payload would leave the rest to be parsed as the
// next frame: the server closes the connection instead (after the one response it sent).
TEST_F(TcpHandlerContract, AHandlerThatLeavesPayloadUnreadClosesTheConnection) {
  StartServer(DataOp::kIndex,
              [](const DataRequest&, RequestStream& s) { return s.Respond(Code::kOk); });
  // The unread payload is a whole valid frame: without the check it would be served.
  tcp::FrameBytes inner =
      tcp::EncodeFrameHeader(tcp::MakeRequest(tcp::FrameOp::kIndex, 2, 0, 0, 0));
  Send(tcp::MakeRequest(tcp::FrameOp::kIndex, 1, 0, 0, inner.size()),
       std::string(reinterpret_cast<const char*>(inner.data()), inner.size()));
  absl::StatusOr<tcp::FrameHeader> r = Receive();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request_id, 1u);
  EXPECT_TRUE(ClosedByServer());
  EXPECT_EQ(server_->malformed_frames(), 0u);
}

// A second response would answer the peer's next request: it is refused, never sent.
TEST_F(TcpHandlerContract, ASecondResponseIsNeverSent) {
  StartServer(DataOp::kIndex, [](const DataRequest& r, RequestStream& s) {
    MC_RETURN_IF_ERROR(s.Skip(r.payload_length));
    MC_RETURN_IF_ERROR(s.Respond(Code::kNotReady));
    return s.Respond(Code::kOk);  // refused: closes the connection
  });
  Send(tcp::MakeRequest(tcp::FrameOp::kIndex, 1, 0, 0, 3), "abc");
  absl::StatusOr<tcp::FrameHeader> r = Receive();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(static_cast<Code>(r->code), Code::kNotReady);
  EXPECT_TRUE(ClosedByServer());
}

// A well-behaved handler keeps its connection: requests follow one another.
TEST_F(TcpHandlerContract, AHandlerThatKeepsTheContractKeepsItsConnection) {
  StartServer(DataOp::kIndex, [](const DataRequest& r, RequestStream& s) {
    std::string payload(r.payload_length, '\0');
    MC_RETURN_IF_ERROR(s.ReadExact(payload.data(), payload.size()));
    return s.Respond(payload == "ok" ? Code::kOk : Code::kInvalidArgument);
  });
  for (uint64_t id = 1; id <= 3; ++id) {
    Send(tcp::MakeRequest(tcp::FrameOp::kIndex, id, 0, 0, 2), id == 2 ? "no" : "ok");
    absl::StatusOr<tcp::FrameHeader> r = Receive();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->request_id, id);
    EXPECT_EQ(static_cast<Code>(r->code), id == 2 ? Code::kInvalidArgument : Code::kOk);
  }
  EXPECT_EQ(server_->connection_count(), 1u);
}

}  // namespace
}  // namespace mc::transfer
