// An RdmaConnector that hands the connection setup straight to another RdmaTransport of this
// process (the serving side, registered by endpoint) instead of over the network: for unit tests
// against fake verbs and for two endpoints over real verbs in one process. Thread-safe after
// the peers are added.
#pragma once

#include <atomic>
#include <map>
#include <string>

#include "common/status.h"
#include "transfer/rdma/rdma_transport.h"

namespace mc::transfer::rdma {

class InProcessRdmaConnector final : public RdmaConnector {
 public:
  void AddPeer(const std::string& endpoint, RdmaTransport* server) { peers_[endpoint] = server; }
  absl::StatusOr<PeerHandshake> Connect(const std::string& endpoint,
                                        std::span<const QpAddress> local,
                                        std::span<const uint32_t> retired) override {
    auto it = peers_.find(endpoint);
    if (it == peers_.end()) return McError(Code::kUnavailable, "no such rdma peer: " + endpoint);
    ++connects_;
    return it->second->Accept(local, retired);
  }
  int connects() const { return connects_; }

 private:
  std::map<std::string, RdmaTransport*> peers_;
  std::atomic<int> connects_{0};
};

}  // namespace mc::transfer::rdma
