// DataServer: the serving side of the data plane, apart from any transport. A daemon's data
// server answers its peers' requests against its memory segments (READ, WRITE) and hands the
// other ops to handlers that other components register: the SSD tier's READ_DISK
// (client/tier/offload_driver.h), the object index's INDEX (client/session/index_service.h), the
// transfer engine's transports (the rdma connection setup, through EngineDataOps in
// transfer/transfer_engine.h). Handlers see only a DataRequest and a
// RequestStream, so they do not depend on how the request travelled.
//
// The one implementation that serves peers is tcp (transfer/tcp/server.h: TcpDataServer, whose
// frames carry these fields; it also authenticates connections and checks every data op's
// capability before a handler runs). READ_DISK and INDEX are two-sided and stay on tcp even
// between peers that move READ/WRITE over rdma: their payloads are variable-sized (an SSD record,
// a list of entries), which over RDMA SEND/RECV would need a protocol of posted receive buffers,
// and READ_DISK is bound by the SSD, not by the network. tests/fakes/loopback_data_server.h
// drives handlers in-process, without sockets.
//
// The handler contract, kept by RequestStream whatever the transport: a handler reads (or skips)
// exactly the request's payload_length bytes, and sends exactly one response. A read past the
// payload, or a second response, is refused without touching the transport; a handler that
// returns OK without keeping the contract closes the connection like one that returns an error.
// Thread-safety: RegisterOpHandler before Start, Start/Stop from one owner thread; handlers run
// on the server's threads (several at once, one request per connection at a time), and each
// RequestStream belongs to the one thread serving its request.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "common/status.h"

namespace mc::transfer {

// The counter of requests naming an unknown segment (label op = read, write, index); handlers of
// other ops count theirs under the same name.
inline constexpr const char* kUnknownSegmentMetric = "mc_dataplane_unknown_segment_total";
inline constexpr const char* kUnknownSegmentHelp =
    "Data-plane frames naming a segment id this daemon does not publish (a reader or writer of "
    "an earlier registration or master run), by op.";
// Refused capabilities, by auth::Denial reason: frames the data-plane server refused and INDEX
// notice entries the owner refused (an INDEX entry's wrong_key is only possible there).
inline constexpr const char* kCapabilityDeniedMetric = "mc_data_capability_denied_total";
inline constexpr const char* kCapabilityDeniedHelp =
    "Data-plane frames and INDEX notice entries refused (PERMISSION_DENIED, no byte touched): "
    "no valid capability, by reason.";

// The ops a data server serves. The values are those of the tcp frame ops
// (transfer/tcp/frame.h), which the tcp server checks at compile time.
enum class DataOp : uint16_t {
  kRead = 1,         // segment bytes -> requester
  kWrite = 2,        // requester's payload -> segment bytes
  kReadDisk = 3,     // an SSD-tier record -> requester
  kRdmaConnect = 4,  // rdma queue-pair exchange (payload: the requester's queue pairs)
  kIndex = 6,        // index notice (payload: transfer/index_notice.h)
};

// One request, as its handler sees it. Every field comes from the network: a handler checks
// each one before it sizes, allocates or addresses anything with it.
struct DataRequest {
  DataOp op = DataOp::kRead;
  uint64_t segment_id = 0;  // READ_DISK: the record's generation
  uint64_t offset = 0;      // byte offset in the segment; READ_DISK: the record locator
  // READ, READ_DISK: the bytes wanted; the other ops: the bytes of the request payload.
  uint64_t length = 0;
  uint32_t key_tag = 0;  // READ_DISK: low 32 bits of the key's XXH3; 0 otherwise
  // Bytes of request payload that follow, which the handler must consume (read or skip):
  // `length` for WRITE, INDEX and RDMA_CONNECT, 0 for READ and READ_DISK.
  uint64_t payload_length = 0;
};

// The request payload bytes `op` carries for a request of `length` (DataRequest::payload_length).
inline uint64_t RequestPayloadLength(DataOp op, uint64_t length) {
  return op == DataOp::kRead || op == DataOp::kReadDisk ? 0 : length;
}

// The I/O of one request, for its handler. Blocking; belongs to the thread serving the request.
// The public calls keep the contract (above) and count what the handler did; a transport
// implements the Do* calls.
class RequestStream {
 public:
  virtual ~RequestStream() = default;
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;

  // Exactly `length` bytes of the request payload into `data`. INTERNAL, nothing read, when
  // `length` exceeds what is left of the payload.
  absl::Status ReadExact(void* data, uint64_t length);
  // Discards `length` bytes of the request payload (same bound as ReadExact).
  absl::Status Skip(uint64_t length);
  // The one response: `code` and the bytes of `payload` (read OK: the data; usually empty
  // otherwise). `payload` need live only for the call. INTERNAL, nothing sent, on a second call.
  absl::Status Respond(Code code, std::span<const iovec> payload = {});

  uint64_t payload_left() const { return payload_left_; }
  bool responded() const { return responded_; }
  // After the handler returned OK: OK when it consumed the whole payload and responded, else
  // INTERNAL naming what it left undone (the transport then closes the connection).
  absl::Status CheckFinished() const;

 protected:
  explicit RequestStream(uint64_t payload_length) : payload_left_(payload_length) {}
  virtual absl::Status DoReadExact(void* data, uint64_t length) = 0;
  virtual absl::Status DoSkip(uint64_t length) = 0;
  virtual absl::Status DoRespond(Code code, std::span<const iovec> payload) = 0;

 private:
  // Consumes `length` bytes of the payload's bound, or refuses.
  absl::Status Take(uint64_t length, const char* what);

  uint64_t payload_left_;
  bool responded_ = false;
};

// Serves one request of its op. Non-OK (or OK without keeping the contract) closes the
// connection: the peer is not trusted further.
using DataOpHandler =
    std::function<absl::Status(const DataRequest& request, RequestStream& stream)>;

// Payload bytes RefuseDataOp skips before answering; a request with more is not answered (the
// connection closes): no op nobody serves here may make the server read without bound.
inline constexpr uint64_t kMaxRefusedPayloadBytes = 64 << 10;

// Answers UNAVAILABLE to a request of an op this daemon does not serve now (e.g. the rdma
// connection setup on a daemon without rdma: the peer then stays on tcp), after skipping its
// payload; a payload over kMaxRefusedPayloadBytes returns an error instead (the connection
// closes).
absl::Status RefuseDataOp(const DataRequest& request, RequestStream& stream);

class DataServer {
 public:
  virtual ~DataServer() = default;

  // Serves `op` with `handler`; one registered for READ or WRITE replaces the server's own
  // (which serve its SegmentTable). Before Start() only.
  virtual absl::Status RegisterOpHandler(DataOp op, DataOpHandler handler) = 0;
  virtual absl::Status Start() = 0;
  // Stops serving and waits for the handlers running. Idempotent.
  virtual void Stop() = 0;
  // Where peers reach this server (tcp: the bound "HOST:PORT"), after Start().
  virtual const std::string& endpoint() const = 0;
  // OK, or why the data plane cannot take requests now.
  virtual absl::Status Health() const = 0;
};

}  // namespace mc::transfer
