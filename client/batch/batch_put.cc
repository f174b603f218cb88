#include "client/batch/batch_put.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <optional>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/batch/batch_get.h"
#include "common/keys.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "proto/status_convert.h"

namespace mc::client {
namespace {

constexpr int64_t kMaxNoSpacePauseMs = 16;

}  // namespace

BatchPutter::BatchPutter(BatchPutOptions options, MasterClient& master,
                         transfer::TransferEngine& engine, const Clock& clock,
                         ClientMetrics& metrics)
    : options_(std::move(options)),
      master_(master),
      engine_(engine),
      clock_(clock),
      metrics_(metrics) {}

std::vector<absl::Status> BatchPutter::Put(const std::vector<PutRequestItem>& items,
                                           uint32_t replicas) {
  std::vector<absl::Status> out(items.size());
  if (replicas == 0) replicas = 1;
  std::vector<size_t> todo;
  for (size_t i = 0; i < items.size(); ++i) {
    out[i] = items[i].input_error;
    uint64_t size = TotalLength(items[i].pieces);
    if (out[i].ok()) out[i] = ValidateKey(items[i].key);
    if (out[i].ok() && size == 0) out[i] = McError(Code::kInvalidArgument, "empty payload");
    if (out[i].ok() && replicas > options_.max_replicas) {
      out[i] = McError(Code::kInvalidArgument, absl::StrCat(replicas, " replicas asked"));
    }
    if (!out[i].ok()) continue;
    // No checksum yet: it comes from the writes (SettleChecksums), one pass over the bytes.
    out[i] = CheckBuffersIntact(items[i].buffers);
    if (out[i].ok()) todo.push_back(i);
  }
  // NO_SPACE is often transient: the master may not evict what reads hold leased or what puts
  // (this batch's own included) are still writing, and both end within moments. Retry such
  // items alone, after the batch's other items have ended, for a bounded time.
  const int64_t started_ms = clock_.NowMs();
  int64_t pause_ms = 1;
  int64_t rounds = 0;
  std::vector<NoSpaceKind> kind(items.size(), NoSpaceKind::kTransient);
  // Holders that refused a write in this call: placed around from then on. An item gets one
  // more placement after such a refusal.
  std::vector<std::string> avoid;
  std::vector<uint8_t> replaced(items.size(), 0);
  std::vector<absl::Status> refusal(items.size());
  // Items whose NO_SPACE waits for write-back to SSD may wait longer (invariant 7: memory holds
  // them until offloads end); the others only for no_space_wait_ms.
  while (!todo.empty()) {
    const size_t refusers = avoid.size();
    PutOnce(items, todo, replicas, out, kind, avoid);
    if (avoid.size() > refusers) {
      ReportUnreachable({avoid.begin() + static_cast<std::ptrdiff_t>(refusers), avoid.end()});
    }
    const int64_t elapsed = clock_.NowMs() - started_ms;
    std::erase_if(todo, [&](size_t i) {
      if (IsPeerUnreachable(out[i]) && !replaced[i]) {
        replaced[i] = 1;
        refusal[i] = out[i];
        metrics_.put_unreachable_retries.Inc();
        return false;  // once more, around the holder that refused
      }
      if (replaced[i] && ToCode(out[i]) == Code::kNoSpace) {
        // No other holder could take it: the refusal is the reason the put failed.
        out[i] = McError(Code::kTransferFailed,
                         absl::StrCat(refusal[i].message(),
                                      "; placed again around that holder: ", out[i].message()));
        return true;
      }
      if (ToCode(out[i]) != Code::kNoSpace || kind[i] == NoSpaceKind::kFinal) return true;
      const int64_t limit = kind[i] == NoSpaceKind::kWriteBack ? options_.write_back_wait_ms
                                                               : options_.no_space_wait_ms;
      if (elapsed < limit) return false;
      if (rounds > 0) {
        out[i] = McError(Code::kNoSpace, absl::StrCat(out[i].message(), " (still after ", rounds,
                                                      " retries over ", elapsed, " ms)"));
      }
      return true;
    });
    if (todo.empty()) break;
    for (size_t i : todo) {
      if (ToCode(out[i]) != Code::kNoSpace) continue;  // placed again after a refusal
      (kind[i] == NoSpaceKind::kWriteBack ? metrics_.put_write_back_waits
                                          : metrics_.put_no_space_retries)
          .Inc();
    }
    clock_.SleepForMs(pause_ms);
    pause_ms = std::min<int64_t>(pause_ms * 2, kMaxNoSpacePauseMs);
    ++rounds;
  }
  return out;
}

void BatchPutter::NotifyOwners(const std::vector<PutRequestItem>& items,
                               const std::vector<size_t>& started,
                               const v1::PutStartResponse& placed,
                               const std::vector<uint64_t>& checksums, int64_t deadline_ms,
                               std::vector<absl::Status>& write_status) {
  // checksums[k]: the one of items[started[k]], settled from its writes.
  std::vector<WrittenReplica> notices;
  std::vector<size_t> notice_owner;  // position in `started`
  for (size_t k = 0; k < started.size(); ++k) {
    const v1::PutStartResult& r = placed.results(static_cast<int>(k));
    const size_t i = started[k];
    if (r.code() != v1::OK || !write_status[k].ok()) continue;
    for (const auto& rep : r.replicas()) {
      notices.push_back({.key = items[i].key,
                         .generation = r.generation(),
                         .size = TotalLength(items[i].pieces),
                         .checksum = checksums[k],
                         .endpoint = rep.data_endpoint(),
                         .segment_id = rep.segment_id(),
                         .offset = rep.offset(),
                         .capability = rep.capability()});
      notice_owner.push_back(k);
    }
  }
  if (notices.empty()) return;
  // The owners learn what they hold before the objects become COMPLETE.
  const std::vector<IndexNotifier::Outcome> outcomes = notifier_->Notify(notices, deadline_ms);
  std::vector<uint8_t> recorded(started.size(), 0), failed(started.size(), 0);
  for (size_t n = 0; n < outcomes.size(); ++n) {
    if (outcomes[n] == IndexNotifier::Outcome::kRecorded) recorded[notice_owner[n]] = 1;
    if (outcomes[n] == IndexNotifier::Outcome::kFailed) failed[notice_owner[n]] = 1;
  }
  for (size_t k = 0; k < started.size(); ++k) {
    if (!failed[k] || recorded[k]) continue;
    metrics_.put_index_failed.Inc();
    write_status[k] =
        McError(Code::kTransferFailed,
                "no owner of its replicas recorded the object in its index (see the "
                "index-notice warning in this daemon's log): it would not survive a master "
                "restart, so the put is revoked; retry it");
  }
}

absl::StatusOr<const std::vector<LocalBuffer>*> BatchPutter::DirectSource(
    const PutRequestItem& item, const v1::PutStartResult& placed, uint64_t checksum,
    std::deque<GpuPutStager::HostCopy>& staged) {
  if (gpu_ == nullptr || item.pieces.size() != 1) {
    return McError(Code::kInternal, "a direct GPU put source without a GPU stager");
  }
  bool direct = true;
  for (const auto& rep : placed.replicas()) {
    direct = direct && gpu_->CanWriteDirect(rep.data_endpoint(), item.pieces[0]);
  }
  if (direct) {
    metrics_.gpu_put_direct.Inc();
    return &item.pieces;
  }
  // A replica the cuda transport cannot write (a peer over TCP, no GPUDirect RDMA): all are
  // written from a host copy, which must hash to what the device hashed before the put.
  metrics_.gpu_put_direct_staged.Inc();
  MC_ASSIGN_OR_RETURN(GpuPutStager::HostCopy copy, gpu_->StageForWrite(item, checksum));
  staged.push_back(std::move(copy));
  return &staged.back().pieces;
}

void BatchPutter::ReportUnreachable(const std::vector<std::string>& holders) {
  v1::ReportReplicaFaultsRequest report;
  report.set_client_id(options_.client_id);
  for (const std::string& holder : holders) {
    v1::ReplicaFaultItem* item = report.add_items();
    item->set_fault(v1::UNREACHABLE);
    item->set_holder(holder);
    metrics_.faults_reported_unreachable.Inc();
  }
  v1::ReportReplicaFaultsResponse resp;
  if (absl::Status s = master_.ReportReplicaFaults(report, &resp); !s.ok()) {
    MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn,
                 "reporting {} unreachable holder(s) to the master failed: {}", holders.size(),
                 s.ToString());
  }
}

// The writes of one PutOnce round: every replica of every placed item. The replicas in this
// daemon's own segments come first (`local` of them), submitted, and proved, before the others
// (see SettleChecksums).
struct BatchPutter::ReplicaWrites {
  std::vector<transfer::TransferRequest> writes;
  std::vector<size_t> owner;               // position in `started`
  std::vector<const std::string*> holder;  // the replica's client id (in the PutStart answer)
  size_t local = 0;
  // Per entry of `started`: the item has a replica in another daemon (written without a proof).
  std::vector<uint8_t> remote;
  // Per entry of `started`: the source's hash taken before the writes, for an item (host memory,
  // no checksum given) whose replicas are all in other daemons: nothing else hashes it.
  std::vector<std::optional<uint64_t>> before;
  // Direct GPU items written from a host copy after all (a deque: the writes point into it).
  std::deque<GpuPutStager::HostCopy> staged;
};

namespace {

v1::PutStartRequest PutStartOf(const std::string& client_id,
                               const std::vector<PutRequestItem>& items,
                               const std::vector<size_t>& started, uint32_t replicas,
                               const std::vector<std::string>& avoid) {
  v1::PutStartRequest start;
  start.set_client_id(client_id);
  start.set_replicas(replicas);
  for (const std::string& holder : avoid) start.add_avoid_clients(holder);
  for (size_t i : started) {  // item index per PutStart entry
    auto* entry = start.add_items();
    entry->set_key(items[i].key.data(), items[i].key.size());
    entry->set_size(TotalLength(items[i].pieces));
  }
  return start;
}

}  // namespace

void BatchPutter::PutOnce(const std::vector<PutRequestItem>& items,
                          const std::vector<size_t>& started, uint32_t replicas,
                          std::vector<absl::Status>& out, std::vector<NoSpaceKind>& kind,
                          std::vector<std::string>& avoid) {
  const v1::PutStartRequest start = PutStartOf(options_.client_id, items, started, replicas, avoid);
  int64_t sent_ms = clock_.NowMs();
  v1::PutStartResponse placed;
  absl::Status s = master_.PutStart(start, &placed);
  if (s.ok() && placed.results_size() != static_cast<int>(started.size())) {
    s = McError(Code::kInternal, "master answered a different number of items");
  }
  if (!s.ok()) {
    for (size_t i : started) {
      out[i] = McError(Code::kUnavailable, absl::StrCat("PutStart: ", s.message()));
    }
    return;
  }
  std::vector<absl::Status> write_status(started.size());
  ReplicaWrites plan;
  PlanWrites(items, started, placed, out, kind, write_status, plan);
  const int64_t allowed = std::min<int64_t>(
      static_cast<int64_t>(std::min<uint64_t>(placed.write_deadline_ms(), INT64_MAX / 4)),
      options_.write_timeout_ms > 0 ? options_.write_timeout_ms : INT64_MAX / 4);
  int64_t deadline = sent_ms + allowed;
  // The local replicas first, then the others: an item with both is hashed from its source after
  // its remote writes, and that hash must equal the one its local replica was stored with.
  const std::span<const transfer::TransferRequest> all(plan.writes);
  std::vector<transfer::TransferResult> written;
  if (plan.local > 0) written = engine_.Submit(all.first(plan.local), deadline);
  if (plan.local < all.size()) {
    std::vector<transfer::TransferResult> rest = engine_.Submit(all.subspan(plan.local), deadline);
    written.insert(written.end(), std::make_move_iterator(rest.begin()),
                   std::make_move_iterator(rest.end()));
  }
  CheckWrites(items, plan, written, started, write_status, avoid);
  std::vector<uint64_t> checksums(started.size());  // per entry of `started`
  SettleChecksums(items, started, plan, written, checksums, write_status);
  // A source buffer truncated during the writes (or the source hash) makes the replicas void:
  // never end them.
  for (size_t k = 0; k < started.size(); ++k) {
    if (placed.results(k).code() == v1::OK && write_status[k].ok()) {
      write_status[k] = CheckBuffersIntact(items[started[k]].buffers);
    }
  }
  if (notifier_ != nullptr) NotifyOwners(items, started, placed, checksums, deadline, write_status);
  EndOrRevoke(items, started, placed, checksums, write_status, out);
}

void BatchPutter::PlanWrites(const std::vector<PutRequestItem>& items,
                             const std::vector<size_t>& started, const v1::PutStartResponse& placed,
                             std::vector<absl::Status>& out, std::vector<NoSpaceKind>& kind,
                             std::vector<absl::Status>& write_status, ReplicaWrites& plan) {
  plan.remote.assign(started.size(), 0);
  plan.before.assign(started.size(), std::nullopt);
  std::vector<uint8_t> local;  // per write
  for (size_t k = 0; k < started.size(); ++k) {
    const v1::PutStartResult& r = placed.results(k);
    size_t i = started[k];
    if (r.code() != v1::OK) {
      out[i] = McError(FromProtoCode(r.code()), r.message());
      kind[i] = r.no_space_final()       ? NoSpaceKind::kFinal
                : r.write_back_pending() ? NoSpaceKind::kWriteBack
                                         : NoSpaceKind::kTransient;
      continue;
    }
    const std::vector<LocalBuffer>* source = &items[i].pieces;
    // Host memory with no checksum given: the write of the replica in our own segments returns
    // the hash of the bytes it stored (fused with the copy), the item's checksum. Written from
    // GPU memory: each write must return the item's checksum.
    const bool hashed_here = !items[i].checksum.has_value();
    bool prove = false;
    if (items[i].gpu_direct) {
      absl::StatusOr<const std::vector<LocalBuffer>*> from =
          DirectSource(items[i], r, *items[i].checksum, plan.staged);
      if (!from.ok()) {
        write_status[k] = from.status();
        continue;
      }
      prove = *from == &items[i].pieces;
      source = *from;
    }
    bool any_local = false;
    for (const auto& rep : r.replicas()) {
      const bool own = rep.client_id() == options_.client_id;
      any_local = any_local || own;
      plan.remote[k] = plan.remote[k] || !own;
      plan.writes.push_back({transfer::Direction::kWrite, *source, rep.data_endpoint(),
                             transfer::SegmentRange{rep.segment_id(), rep.offset()}});
      plan.writes.back().capability = rep.capability();  // the master's write grant, if any
      if (prove || (hashed_here && own)) {
        plan.writes.back().proof = transfer::Proof::kWrittenReplica;
      }
      plan.owner.push_back(k);
      plan.holder.push_back(&rep.client_id());
      local.push_back(own ? 1 : 0);
    }
    if (hashed_here && !any_local) {
      // Only remote replicas, which prove nothing: hashed from the source before they are sent.
      metrics_.put_source_hashes.Inc();
      plan.before[k] = ScatterChecksum(items[i].pieces);
    }
  }
  // The local writes first (stable: each item's writes keep their order).
  std::vector<size_t> order(plan.writes.size());
  for (size_t w = 0; w < order.size(); ++w) order[w] = w;
  std::stable_partition(order.begin(), order.end(), [&local](size_t w) { return local[w] != 0; });
  ReplicaWrites sorted;
  for (size_t w : order) {
    sorted.writes.push_back(std::move(plan.writes[w]));
    sorted.owner.push_back(plan.owner[w]);
    sorted.holder.push_back(plan.holder[w]);
    sorted.local += local[w];
  }
  plan.writes = std::move(sorted.writes);
  plan.owner = std::move(sorted.owner);
  plan.holder = std::move(sorted.holder);
  plan.local = sorted.local;
}

void BatchPutter::CheckWrites(const std::vector<PutRequestItem>& items, const ReplicaWrites& plan,
                              const std::vector<transfer::TransferResult>& written,
                              const std::vector<size_t>& started,
                              std::vector<absl::Status>& write_status,
                              std::vector<std::string>& avoid) {
  const std::vector<transfer::TransferRequest>& writes = plan.writes;
  for (size_t w = 0; w < writes.size(); ++w) {
    const auto& res = written[w];
    uint64_t expect = TotalLength(writes[w].local);
    if (res.status.ok() && res.bytes == expect) {
      const PutRequestItem& item = items[started[plan.owner[w]]];
      // A host write's proof, if any, is settled with its item's other replicas (below).
      if (writes[w].proof == transfer::Proof::kNone || !item.checksum.has_value()) continue;
      // Written from GPU memory: OK only with the proof that the replica is the hashed bytes.
      const uint64_t want = *item.checksum;
      if (res.checksum == want) continue;
      metrics_.checksum_mismatches.Inc();
      write_status[plan.owner[w]] = McError(
          Code::kChecksumMismatch,
          res.checksum.has_value()
              ? absl::StrFormat("the replica on %s written from GPU memory hashes to %016x, not "
                                "the source's %016x (the buffer changed during the put?); not "
                                "stored",
                                writes[w].endpoint, *res.checksum, want)
              : absl::StrCat("the replica on ", writes[w].endpoint,
                             " written from GPU memory came back without its proof; not stored"));
      continue;
    }
    write_status[plan.owner[w]] = WithPeerUnreachableOf(
        McError(
            Code::kTransferFailed,
            absl::StrCat("writing the replica on ", writes[w].endpoint, ": ",
                         res.status.ok() ? "short transfer" : std::string(res.status.message()))),
        res.status);
    if (IsPeerUnreachable(res.status) &&
        std::find(avoid.begin(), avoid.end(), *plan.holder[w]) == avoid.end()) {
      avoid.push_back(*plan.holder[w]);
      if (backoff_ != nullptr) backoff_->Refused(writes[w].endpoint);
      Logger("client").warn("holder {} at {} refused a replica write: placing around it",
                            *plan.holder[w], writes[w].endpoint);
    }
  }
}

void BatchPutter::SettleChecksums(const std::vector<PutRequestItem>& items,
                                  const std::vector<size_t>& started, const ReplicaWrites& plan,
                                  const std::vector<transfer::TransferResult>& written,
                                  std::vector<uint64_t>& checksums,
                                  std::vector<absl::Status>& write_status) {
  // Per item: the proof of its local replica (at most one: one replica per daemon).
  std::vector<std::optional<uint64_t>> proof(started.size());
  std::vector<size_t> proof_write(started.size(), 0);
  for (size_t w = 0; w < plan.local; ++w) {
    const size_t k = plan.owner[w];
    if (plan.writes[w].proof == transfer::Proof::kNone || !written[w].checksum.has_value())
      continue;
    proof[k] = written[w].checksum;
    proof_write[k] = w;
  }
  for (size_t k = 0; k < started.size(); ++k) {
    const PutRequestItem& item = items[started[k]];
    if (item.checksum.has_value()) {  // given (GPU sources): proved in CheckWrites
      checksums[k] = *item.checksum;
      continue;
    }
    if (!write_status[k].ok()) continue;
    if (plan.before[k].has_value()) {  // remote replicas only: hashed before they were sent
      checksums[k] = *plan.before[k];
      continue;
    }
    if (proof[k].has_value() && !plan.remote[k]) {
      checksums[k] = *proof[k];  // the bytes stored, hashed as they were copied: one pass
      continue;
    }
    // A local replica and remote ones, written after it (or a local write that came back
    // without its proof): the source, hashed now, must still be what the local replica stored,
    // so the remote writes in between sent those bytes too.
    metrics_.put_source_hashes.Inc();
    const uint64_t after = ScatterChecksum(item.pieces);
    checksums[k] = after;
    if (!proof[k].has_value() || *proof[k] == after) continue;
    metrics_.checksum_mismatches.Inc();
    write_status[k] = McError(
        Code::kChecksumMismatch,
        absl::StrFormat("the replica on %s was stored with checksum %016x, but the source hashes "
                        "to %016x after the writes to the other replicas: the buffer changed "
                        "during the put, so its replicas may differ; not stored",
                        plan.writes[proof_write[k]].endpoint, *proof[k], after));
  }
}

void BatchPutter::EndOrRevoke(const std::vector<PutRequestItem>& items,
                              const std::vector<size_t>& started,
                              const v1::PutStartResponse& placed,
                              const std::vector<uint64_t>& checksums,
                              const std::vector<absl::Status>& write_status,
                              std::vector<absl::Status>& out) {
  v1::PutEndRequest end;
  v1::PutRevokeRequest revoke;
  end.set_client_id(options_.client_id);
  revoke.set_client_id(options_.client_id);
  std::vector<size_t> ended, revoked;
  for (size_t k = 0; k < started.size(); ++k) {
    const v1::PutStartResult& r = placed.results(k);
    size_t i = started[k];
    if (r.code() != v1::OK) continue;
    if (write_status[k].ok()) {
      auto* e = end.add_items();
      e->set_key(items[i].key.data(), items[i].key.size());
      e->set_generation(r.generation());
      e->set_checksum(checksums[k]);
      ended.push_back(i);
    } else {
      auto* e = revoke.add_items();
      e->set_key(items[i].key.data(), items[i].key.size());
      e->set_generation(r.generation());
      revoked.push_back(i);
      out[i] = write_status[k];
    }
  }
  if (!revoked.empty()) {
    v1::PutRevokeResponse resp;
    absl::Status rs = master_.PutRevoke(revoke, &resp);
    if (!rs.ok()) {
      Logger("client").warn("PutRevoke of {} item(s) failed ({}); the put timeout frees them",
                            revoked.size(), rs.ToString());
    }
  }
  if (!ended.empty()) EndPuts(items, end, ended, out);
}

void BatchPutter::EndPuts(const std::vector<PutRequestItem>& items, const v1::PutEndRequest& end,
                          const std::vector<size_t>& ended, std::vector<absl::Status>& out) {
  v1::PutEndResponse resp;
  absl::Status es = master_.PutEnd(end, &resp);
  if (es.ok() && resp.results_size() != static_cast<int>(ended.size())) {
    es = McError(Code::kInternal, "master answered a different number of items");
  }
  for (size_t k = 0; k < ended.size(); ++k) {
    size_t i = ended[k];
    if (!es.ok()) {
      out[i] = McError(Code::kUnavailable, absl::StrCat("PutEnd: ", es.message()));
    } else {
      out[i] = FromResult(resp.results(k));
      if (ToCode(out[i]) == Code::kNotFound) {
        // The master revoked the pending put meanwhile (a replica's holder died or the put
        // timed out): the put failed for lack of a live replica, the key is not "missing".
        out[i] = McError(Code::kUnavailable,
                         absl::StrCat("the put was revoked before it ended (a replica's client "
                                      "was lost or the put timed out): ",
                                      out[i].message()));
      }
      if (out[i].ok()) metrics_.bytes_in.Inc(TotalLength(items[i].pieces));
    }
  }
}

}  // namespace mc::client
