// Promoter: writes SSD hits back into memory (mc-client --promote_on_hit), so the next get of a
// hot object is a memory read. Best effort and batched: the bytes the get delivered are first
// copied into private staging memory and hashed on the way; only a copy whose XXH3 equals the
// recorded checksum is promoted (the application owns the get's destination and may already be
// writing into it). Then one PromoteStart for the items, their staged bytes written through the
// transfer engine before the master's write deadline, one PromoteEnd that attaches the written
// replicas and gives back the rest. Staging is bounded per round (staging_bytes; a larger
// object goes alone). A failure only means the object stays on SSD. With an IndexNotifier, the
// owner of each written replica learns what it holds before PromoteEnd (as for a put).
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "client/session/index_service.h"
#include "client/session/master_client.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

class Promoter {
 public:
  struct Item {
    std::string_view key;
    uint64_t generation = 0;
    uint64_t checksum = 0;                     // recorded at put (XXH3-64)
    std::vector<transfer::LocalBuffer> bytes;  // the object as the get delivered it
  };
  static constexpr uint64_t kDefaultStagingBytes = 64ull << 20;

  // `staging_bytes`: private copies made per round (mc-client --promote_staging_bytes).
  Promoter(std::string client_id, MasterClient& master, transfer::TransferEngine& engine,
           const Clock& clock, MetricsRegistry& metrics,
           uint64_t staging_bytes = kDefaultStagingBytes);

  // Returns how many items now have a memory replica.
  size_t Promote(const std::vector<Item>& items);
  // Owners' index notices (borrowed; null = none, the default). Before the first Promote.
  void SetIndexNotifier(IndexNotifier* notifier) { notifier_ = notifier; }

 private:
  // One round: stage, verify, place, write, attach.
  size_t PromoteRound(const std::vector<const Item*>& items);
  // PromoteRound's steps. Stage: private copies of the items whose bytes still match their
  // checksum (the others count as failed). NotifyOwners: tells the holders of the replicas
  // written (writes[w] of items[owner[w]], as placed) what they hold.
  struct Staging;
  void Stage(const std::vector<const Item*>& candidates, Staging& staging);
  void NotifyOwners(const std::vector<const Item*>& items,
                    const std::vector<transfer::TransferRequest>& writes,
                    const std::vector<size_t>& owner,
                    const std::vector<transfer::TransferResult>& done,
                    const v1::PromoteStartResponse& placed, int64_t deadline);

  const std::string client_id_;
  const uint64_t staging_bytes_;
  MasterClient& master_;
  transfer::TransferEngine& engine_;
  const Clock& clock_;
  Counter& promoted_;
  Counter& failed_;
  IndexNotifier* notifier_ = nullptr;
};

}  // namespace mc::client
