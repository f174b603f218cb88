// Promoter: writes SSD hits back into memory (mc-client --promote_on_hit), so the next get of a
// hot object is a memory read. Best effort and batched: one PromoteStart for the items, their
// bytes (already verified by the get) written through the transfer engine before the master's
// write deadline, one PromoteEnd that attaches the written replicas and gives back the rest.
// A failure only means the object stays on SSD. Thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "client/master_client.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

class Promoter {
 public:
  struct Item {
    std::string_view key;
    uint64_t generation = 0;
    std::vector<transfer::LocalBuffer> bytes;  // the verified object, valid during Promote()
  };

  Promoter(std::string client_id, MasterClient& master, transfer::TransferEngine& engine,
           const Clock& clock, MetricsRegistry& metrics);

  // Returns how many items now have a memory replica.
  size_t Promote(const std::vector<Item>& items);

 private:
  const std::string client_id_;
  MasterClient& master_;
  transfer::TransferEngine& engine_;
  const Clock& clock_;
  Counter& promoted_;
  Counter& failed_;
};

}  // namespace mc::client
