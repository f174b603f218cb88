// Index notices: how the owners of a put's replicas learn which object their bytes are.
//
// IndexNotifier (the writer's side): after every replica of an item was written and before its
// PutEnd / PromoteEnd, BatchPutter and Promoter hand it the item's replicas. Replicas in this
// daemon's own segments go straight into the local ObjectIndex; for each remote owner the
// entries go in INDEX frames (transfer/tcp/frame.h; at most kMaxIndexNoticeEntries and
// kMaxIndexNoticeBytes each) through the transfer engine, each entry with its replica's WRITE
// capability. A refused or failed notice is counted (mc_client_index_notices_failed_total) and
// logged, rate-limited; the put goes on: its bytes are in place, the object only would not
// survive a master restart.
//
// IndexNoticeHandler (the owner's side): serves INDEX requests for the data-plane server
// (transfer/data_server.h; they come over tcp). Per entry: with authentication, the capability
// must grant WRITE on exactly that segment, offset, length and generation (checked as a WRITE
// frame's is); the segment id must be one this daemon publishes now (an id of an earlier
// registration or master run is refused and counted in
// mc_dataplane_unknown_segment_total{op="index"}); then the entry goes into the ObjectIndex.
// Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "client/session/object_index.h"
#include "common/capability.h"
#include "common/metrics.h"
#include "transfer/data_server.h"
#include "transfer/index_notice.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

// Maps a segment id this daemon publishes now to its local index (SegmentPool::LocalIndexOf).
using SegmentResolver = std::function<std::optional<size_t>(uint64_t segment_id)>;

// One replica a writer wrote, as its owner must record it.
struct WrittenReplica {
  std::string_view key;
  uint64_t generation = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::string_view endpoint;  // the owner's data-plane endpoint
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  std::string_view capability;  // the master's WRITE grant (kCapabilitySize bytes) or empty
};

class IndexNotifier {
 public:
  // `local_endpoint`: this daemon's data-plane endpoint; replicas there go to `local_index`
  // (borrowed, null when this daemon has no index) through `resolve`.
  IndexNotifier(std::string local_endpoint, ObjectIndex* local_index, SegmentResolver resolve,
                transfer::TransferEngine& engine, MetricsRegistry& metrics);

  // What became of one replica's notice.
  enum class Outcome : uint8_t {
    kRecorded,  // its owner's index holds it: a master restart finds it in the owner's report
    kNoIndex,   // its owner keeps no index (--object_index=false there, NOT_READY): not an error
    kFailed,    // refused, undelivered or past the deadline (counted and logged)
  };

  // Tells every owner of `replicas` about them; blocks until the notices are answered or
  // `deadline_ms` (steady ms, 0 = none) passed. Returns one outcome per replica, in order.
  std::vector<Outcome> Notify(std::span<const WrittenReplica> replicas, int64_t deadline_ms);

  uint64_t failed_notices() const { return failed_.Value(); }

 private:
  void Failed(size_t entries, std::string_view owner, std::string_view why);
  // Notify's steps. RecordLocal: a replica this daemon holds, into its own index. Encode: the
  // INDEX payloads of the other owners' entries, cut at the notice bounds (an entry that cannot
  // be encoded sets out[k] to kFailed).
  struct OwnerEntries;
  struct Notices;
  Outcome RecordLocal(const WrittenReplica& r);
  Notices Encode(const std::map<std::string_view, OwnerEntries>& remote, std::vector<Outcome>& out);

  const std::string local_endpoint_;
  ObjectIndex* const local_index_;
  const SegmentResolver resolve_;
  transfer::TransferEngine& engine_;
  Counter& sent_;
  Counter& failed_;
};

class IndexNoticeHandler {
 public:
  // `verifier`: null without authentication (capabilities then ignored). Borrowed.
  IndexNoticeHandler(ObjectIndex& index, SegmentResolver resolve,
                     const auth::CapabilityVerifier* verifier, MetricsRegistry& metrics);

  // The data-plane server's handler for DataOp::kIndex: the payload is an index notice
  // (transfer/index_notice.h). One above kMaxIndexNoticeBytes closes the connection.
  absl::Status Serve(const transfer::DataRequest& request, transfer::RequestStream& stream);
  // The handler for DataOp::kIndex of a daemon that keeps no index: drains the payload and
  // answers NOT_READY, so a writer learns that rather than losing its connection.
  static absl::Status ServeWithoutIndex(const transfer::DataRequest& request,
                                        transfer::RequestStream& stream);
  // Records the entries it may; OK, or the first refusal (PERMISSION_DENIED, NOT_FOUND,
  // INVALID_ARGUMENT). Every acceptable entry is recorded even when another is refused.
  absl::Status Apply(std::span<const transfer::IndexNoticeEntry> entries);

 private:
  absl::Status ApplyOne(const transfer::IndexNoticeEntry& entry);

  ObjectIndex& index_;
  const SegmentResolver resolve_;
  const auth::CapabilityVerifier* const verifier_;
  Counter& recorded_;
  Counter& refused_;
  Counter& unknown_segment_;
  // mc_data_capability_denied_total{reason}, shared with the data-plane server's frame checks.
  std::array<Counter*, static_cast<size_t>(auth::Denial::kCount)> denials_{};
};

}  // namespace mc::client
