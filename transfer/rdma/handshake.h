// The rdma connection setup, carried over the data plane as one kRdmaConnect request (on tcp: a
// frame of transfer/tcp/frame.h) on a connection of its own, through a PeerExchange
// (transfer/peer_exchange.h; this transport does not include tcp's headers): the requester sends
// the addresses of its new queue pairs (and the QPNs it retired), the serving daemon creates and
// connects one queue pair per address and answers with their addresses and the address, length and
// rkey of every segment it serves. So rkeys go only to a peer that holds a data-plane connection;
// with cluster keys that connection has passed the AUTH handshake (the tcp exchange runs it), so
// only members of the cluster get rkeys. One-sided verbs then bypass capabilities: a member holding
// an rkey can read or write the whole registered segment (docs/security.md). A daemon without rdma
// answers kUnavailable (or closes: an old daemon knows no such op) and the peer stays on tcp.
//
// Payloads are little-endian:
//   request:  u32 qp_count, u32 retired_count, qp_count x QpAddress, retired_count x u32 qpn
//   response: u32 qp_count, u32 segment_count, qp_count x QpAddress,
//             segment_count x {u64 id, u64 addr, u64 length, u32 rkey, u32 0}
//   QpAddress: gid[16], u16 lid, u16 0, u32 qpn, u32 psn, u32 mtu (32 bytes)
// Decoders check counts against limits and the exact length before reading anything.
// Thread-safe: pure functions, and a connector whose exchange opens a connection per setup.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "transfer/data_server.h"
#include "transfer/peer_exchange.h"
#include "transfer/rdma/rdma_transport.h"

namespace mc::transfer::rdma {

inline constexpr uint32_t kMaxHandshakeQps = 64;
inline constexpr uint32_t kMaxHandshakeSegments = 65536;

struct ConnectRequest {
  std::vector<QpAddress> qps;
  std::vector<uint32_t> retired;
};

std::string EncodeConnectRequest(std::span<const QpAddress> qps, std::span<const uint32_t> retired);
absl::StatusOr<ConnectRequest> DecodeConnectRequest(std::string_view bytes);
std::string EncodeHandshake(const PeerHandshake& handshake);
absl::StatusOr<PeerHandshake> DecodeHandshake(std::string_view bytes);

// The requester's side: one exchange with the peer's data plane per setup (`exchange` is
// borrowed and must outlive the connector; production: transfer/tcp/peer_exchange.h).
class DataPlaneRdmaConnector final : public RdmaConnector {
 public:
  explicit DataPlaneRdmaConnector(PeerExchange& exchange) : exchange_(exchange) {}
  absl::StatusOr<PeerHandshake> Connect(const std::string& endpoint,
                                        std::span<const QpAddress> local,
                                        std::span<const uint32_t> retired) override;

 private:
  PeerExchange& exchange_;
};

// The serving side: answers one kRdmaConnect request (RdmaTransport::ServeDataOp, which the
// engine's data-plane ops reach; a daemon without rdma refuses it with RefuseDataOp).
absl::Status ServeRdmaConnect(RdmaTransport& transport, const DataRequest& request,
                              RequestStream& stream);

}  // namespace mc::transfer::rdma
