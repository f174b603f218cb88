// libFuzzer target: the master lane's frames (proto/master_lane_frame.h) and a live MasterLane.
// Each input is read as a stream of request frames and as a reply (the readers must never read
// past what they were given or accept a length over its bound), then sent raw on a fresh
// connection to a live lane in front of a real metadata service with one registered client: the
// lane must answer with well-formed replies or close, never crash.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "master/grpc_service.h"
#include "master/master_lane.h"
#include "master/metadata_service.h"
#include "proto/master_lane_frame.h"

namespace {

constexpr size_t kMaxBody = 1 << 20;

struct Fixture {
  Fixture() : service(mc::master::MasterOptions{}, mc::RealClock::Get(), metrics) {
    mc::SetLogLevel("off");
    mc::master::ClientInfo info;
    info.client_id = "c1";
    info.endpoint = "127.0.0.1:1";
    (void)service.RegisterClient(info, {1 << 20}, {}, false);
    grpc_service = std::make_unique<mc::master::MasterGrpcService>(service, metrics, 1000);
    lane = std::make_unique<mc::master::MasterLane>(
        mc::master::MasterLaneOptions{.listen = "127.0.0.1:0",
                                      .max_connections = 8,
                                      .idle_timeout_ms = 500,
                                      .max_body_bytes = kMaxBody},
        *grpc_service, metrics);
    port = *lane->Start();
  }
  mc::MetricsRegistry metrics;
  mc::master::MetadataService service;
  std::unique_ptr<mc::master::MasterGrpcService> grpc_service;
  std::unique_ptr<mc::master::MasterLane> lane;
  int port = 0;
};

// Reads from [data, data + size), never past it.
mc::lane::ReadExactly MemoryReader(const uint8_t*& data, size_t& size) {
  return [&data, &size](char* dst, size_t n) {
    if (n > size) return false;
    std::memcpy(dst, data, n);
    data += n;
    size -= n;
    return true;
  };
}

void SendAndDrain(int port, const uint8_t* data, size_t size) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) abort();
  (void)!send(fd, data, size, MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  const mc::lane::ReadExactly read = [fd](char* dst, size_t n) {
    size_t have = 0;
    while (have < n) {
      const ssize_t r = recv(fd, dst + have, n - have, 0);
      if (r <= 0) return false;
      have += static_cast<size_t>(r);
    }
    return true;
  };
  // A served connection is greeted "ready" first; a full lane (never here) greets "full".
  if (!mc::lane::ReadGreeting(read).ok()) abort();
  mc::lane::Reply reply;
  for (;;) {
    const absl::Status s = mc::lane::ReadReply(read, 64 << 20, &reply);
    if (absl::IsUnavailable(s)) break;  // closed: the lane is done with this stream
    if (!s.ok()) abort();               // a malformed reply from the lane
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture();
  {
    const uint8_t* p = data;
    size_t left = size;
    mc::lane::Request request;
    while (mc::lane::ReadRequest(MemoryReader(p, left), kMaxBody, &request).ok()) {
      if (request.credential.size() > mc::lane::kMaxCredentialBytes) abort();
      if (request.body.size() > kMaxBody) abort();
    }
  }
  {
    const uint8_t* p = data;
    size_t left = size;
    mc::lane::Reply reply;
    if (mc::lane::ReadReply(MemoryReader(p, left), kMaxBody, &reply).ok() &&
        (reply.message.size() > mc::lane::kMaxErrorMessageBytes ||
         reply.leader.size() > mc::lane::kMaxLeaderBytes || reply.body.size() > kMaxBody)) {
      abort();
    }
  }
  SendAndDrain(fixture->port, data, size);
  return 0;
}
