// An RdmaConnector that hands the connection setup straight to another RdmaTransport of this
// process (the serving side, registered by endpoint) instead of over the network: for unit tests
// against fake verbs and for two endpoints over real verbs in one process. A peer may also be a
// whole TransferEngine: the setup then goes through its data-plane op
// (TransferEngine::ServeDataOp), encoded and decoded as on the wire. Thread-safe after the peers
// are added.
#pragma once

#include <atomic>
#include <map>
#include <string>

#include "common/status.h"
#include "tests/fakes/loopback_data_server.h"
#include "transfer/rdma/handshake.h"
#include "transfer/rdma/rdma_transport.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer::rdma {

class InProcessRdmaConnector final : public RdmaConnector {
 public:
  void AddPeer(const std::string& endpoint, RdmaTransport* server) { peers_[endpoint] = server; }
  void AddPeer(const std::string& endpoint, TransferEngine* server) { engines_[endpoint] = server; }
  absl::StatusOr<PeerHandshake> Connect(const std::string& endpoint,
                                        std::span<const QpAddress> local,
                                        std::span<const uint32_t> retired) override {
    if (auto engine = engines_.find(endpoint); engine != engines_.end()) {
      ++connects_;
      const std::string payload = EncodeConnectRequest(local, retired);
      DataRequest request;
      request.op = DataOp::kRdmaConnect;
      request.length = request.payload_length = payload.size();
      LoopbackRequestStream stream(payload);
      absl::Status s = engine->second->ServeDataOp(request, stream);
      if (s.ok()) s = stream.CheckFinished();
      if (!s.ok()) return s;
      if (stream.response().code != Code::kOk) {
        return McError(stream.response().code, "rdma setup refused by " + endpoint);
      }
      return DecodeHandshake(stream.response().payload);
    }
    auto it = peers_.find(endpoint);
    if (it == peers_.end()) return McError(Code::kUnavailable, "no such rdma peer: " + endpoint);
    ++connects_;
    return it->second->Accept(local, retired);
  }
  int connects() const { return connects_; }

 private:
  std::map<std::string, RdmaTransport*> peers_;
  std::map<std::string, TransferEngine*> engines_;
  std::atomic<int> connects_{0};
};

}  // namespace mc::transfer::rdma
