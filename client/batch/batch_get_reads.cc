// BatchGetter's replica reads: rounds over each key's replicas (preferred first, a holder that
// refused connections moments ago skipped) with fallback to the next on failure, our own SSD
// records read through the DiskReader, fault reports (checksum mismatches confirmed on a private
// copy, unreachable holders) and promotion of SSD hits. Lookup, destinations, fan-out and leases
// are in batch_get.cc.
#include <algorithm>
#include <limits>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/batch/batch_get.h"
#include "client/batch/batch_get_plan.h"
#include "common/keys.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc::client {

using batch_get_internal::kNone;

void BatchGetter::TransferRounds(Batch& batch) {
  for (int round = 0; round < options_.max_replica_rounds; ++round) {
    std::vector<transfer::TransferRequest> reqs;
    std::vector<size_t> owner;  // plan index per request
    reqs.reserve(batch.plans.size());
    owner.reserve(batch.plans.size());
    int64_t deadline = std::numeric_limits<int64_t>::max();
    for (size_t p = 0; p < batch.plans.size(); ++p) {
      std::optional<transfer::TransferRequest> req = NextRead(batch, batch.plans[p]);
      if (!req.has_value()) continue;
      reqs.push_back(*std::move(req));
      owner.push_back(p);
      deadline = std::min(deadline, batch.plans[p].deadline_ms);
    }
    if (reqs.empty()) return;
    std::vector<transfer::TransferResult> results = SubmitReads(batch, reqs, owner, deadline);
    int64_t now = clock_.NowMs();
    for (size_t i = 0; i < reqs.size(); ++i) {
      SettleRead(batch, owner[i], reqs[i].endpoint, results[i], now);
    }
  }
}

std::optional<transfer::TransferRequest> BatchGetter::NextRead(Batch& batch, KeyPlan& plan) {
  if (!plan.status.ok() || plan.done || plan.primary == kNone) return std::nullopt;
  while (plan.next < plan.order.size() && HolderBackingOff(plan, plan.order[plan.next]) &&
         !IsLocalMemory(plan, plan.order[plan.next])) {
    metrics_.holder_backoff_skips.Inc();  // refused earlier in this call
    ++plan.next;
  }
  if (plan.next >= plan.order.size()) {
    if (plan.status.ok() && plan.next > 0 && !plan.done) {
      plan.status =
          McError(Code::kTransferFailed, "its other holders refused connections (backing off)");
    }
    return std::nullopt;  // status says why
  }
  if (plan.staging.empty() && !batch.items[plan.primary].gpu.empty() &&
      !IsDirectSource(batch, plan, plan.order[plan.next])) {
    // A direct GPU read whose direct sources all failed: the rest go through staging.
    if (absl::Status s = ReserveStaging(plan); !s.ok()) {
      plan.status = McError(ToCode(s), absl::StrCat("this daemon's replicas failed and the "
                                                    "others need staging: ",
                                                    s.message()));
      plan.next = plan.order.size();
      return std::nullopt;
    }
  }
  const auto& rep = plan.lookup->replicas(plan.order[plan.next]);
  transfer::TransferRequest req;
  if (rep.tier() == v1::MEMORY) {
    req = {transfer::Direction::kRead, ReadInto(batch, plan), rep.data_endpoint(),
           transfer::SegmentRange{rep.segment_id(), rep.offset()}};
  } else {
    // DISK: the owner reads and verifies the record (generation, locator, key tag).
    req = {transfer::Direction::kRead, ReadInto(batch, plan), rep.data_endpoint(),
           transfer::DiskRecord{plan.lookup->generation(), rep.offset(), DiskKeyTag(plan.key)}};
  }
  req.capability = rep.capability();             // the master's read grant, if any
  req.proof = transfer::Proof::kDeliveredBytes;  // hashed as the bytes land
  return req;
}

void BatchGetter::SettleRead(Batch& batch, size_t p, const std::string& endpoint,
                             const transfer::TransferResult& res, int64_t now) {
  KeyPlan& plan = batch.plans[p];
  plan.moved = res.bytes;
  ++plan.next;
  bool more = plan.next < plan.order.size();
  if (now > plan.deadline_ms) {
    if (!res.status.ok()) {
      // The owner did not answer before the lease ended (stalled or unreachable): that is
      // a failed transfer, not an expired lease; no fallback, the lease is over.
      plan.status =
          McError(Code::kTransferFailed,
                  absl::StrCat("replica on ", endpoint,
                               " did not answer before the read lease ended (owner stalled?): ",
                               res.status.message()));
      return;
    }
    plan.status = McError(Code::kLeaseExpired, "the transfer ended after the read lease expired");
    metrics_.lease_expiries.Inc();
    return;
  }
  const int replica = plan.order[plan.next - 1];
  if (!res.status.ok()) NoteFault(batch, p, replica, res.status, false);
  if (ToCode(res.status) == Code::kChecksumMismatch) {
    // The replica's owner read its SSD record and it failed verification: its verdict, not a
    // transport failure (the owner drops the record and tells the master).
    metrics_.checksum_mismatches.Inc();
    plan.status = McError(Code::kChecksumMismatch, absl::StrCat("replica on ", endpoint, ": ",
                                                                std::string(res.status.message())));
    if (more) metrics_.replica_fallbacks.Inc(), plan.status = absl::OkStatus();
    return;
  }
  if (!res.status.ok() || res.bytes != plan.lookup->size()) {
    plan.status = McError(
        Code::kTransferFailed,
        absl::StrCat("replica on ", endpoint, ": ",
                     res.status.ok() ? "short transfer" : std::string(res.status.message())));
    if (more) metrics_.replica_fallbacks.Inc(), plan.status = absl::OkStatus();
    return;
  }
  // The transport's hash is of the destination bytes as delivered; without one, hash here,
  // but never GPU memory: the CPU cannot read it, and only the device hash proves it.
  if (!res.checksum.has_value() && plan.staging.empty() && !batch.items[plan.primary].gpu.empty()) {
    plan.status =
        McError(Code::kTransferFailed,
                absl::StrCat("replica on ", endpoint, ": no device hash of the GPU destination"));
    if (more) metrics_.replica_fallbacks.Inc(), plan.status = absl::OkStatus();
    return;
  }
  const uint64_t got =
      res.checksum.has_value() ? *res.checksum : ScatterChecksum(ReadInto(batch, plan));
  if (got != plan.lookup->checksum()) {
    metrics_.checksum_mismatches.Inc();
    Logger("client").error("checksum mismatch reading {} from {} (generation {})",
                           KeyForLog(plan.key), endpoint, plan.lookup->generation());
    NoteFault(batch, p, replica, absl::OkStatus(), /*mismatch=*/true);
    plan.status = McError(Code::kChecksumMismatch,
                          absl::StrCat("replica on ", endpoint, " failed the checksum"));
    if (more) metrics_.replica_fallbacks.Inc(), plan.status = absl::OkStatus();
    return;
  }
  plan.done = true;
}

std::vector<transfer::TransferResult> BatchGetter::SubmitReads(
    const Batch& batch, std::vector<transfer::TransferRequest>& reqs,
    const std::vector<size_t>& owner, int64_t deadline_ms) {
  // Our own SSD records are read through the tier, the rest through the engine.
  std::vector<transfer::TransferResult> results(reqs.size());
  std::vector<transfer::TransferRequest> remote;
  std::vector<size_t> remote_index;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (transfer::AsDiskRecord(reqs[i]) != nullptr && reqs[i].endpoint == options_.local_endpoint) {
      continue;
    }
    remote.push_back(std::move(reqs[i]));
    remote_index.push_back(i);
  }
  if (!remote.empty()) {
    std::vector<transfer::TransferResult> r = engine_.Submit(remote, deadline_ms);
    for (size_t k = 0; k < remote.size(); ++k) {
      results[remote_index[k]] = std::move(r[k]);
      reqs[remote_index[k]] = std::move(remote[k]);
    }
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    const transfer::DiskRecord* record = transfer::AsDiskRecord(reqs[i]);
    if (record == nullptr || reqs[i].endpoint != options_.local_endpoint) continue;
    uint64_t length = TotalLength(reqs[i].local);
    uint64_t checksum = 0;
    results[i].status = disk_reader_->ReadLocal(batch.plans[owner[i]].key, record->generation,
                                                record->locator, length, reqs[i].local, &checksum);
    results[i].bytes = results[i].status.ok() ? length : 0;
    // The tier hashed the destination as it wrote it: the same proof a transport gives.
    if (results[i].status.ok()) results[i].checksum = checksum;
  }
  return results;
}

bool BatchGetter::HolderBackingOff(const KeyPlan& plan, int r) const {
  return backoff_ != nullptr && backoff_->BackingOff(plan.lookup->replicas(r).data_endpoint());
}

void BatchGetter::NoteFault(Batch& batch, size_t plan, int r, const absl::Status& status,
                            bool mismatch) {
  const v1::Replica& rep = batch.plans[plan].lookup->replicas(r);
  if (mismatch) {
    if (rep.tier() == v1::MEMORY) batch.mismatched.emplace_back(plan, r);
    return;  // a DISK record's owner verifies and drops it itself
  }
  if (!IsPeerUnreachable(status) || rep.data_endpoint() == options_.local_endpoint) return;
  // Reported once per back-off period, not once per block.
  if (backoff_ != nullptr && !backoff_->Refused(rep.data_endpoint())) return;
  Logger("client").warn("holder {} at {} refused the connection: skipped for a while, reported",
                        rep.client_id(), rep.data_endpoint());
  batch.unreachable.push_back(rep.client_id());
}

void BatchGetter::RepairReplicas(Batch& batch) {
  if (batch.mismatched.empty() && batch.unreachable.empty()) return;
  v1::ReportReplicaFaultsRequest report;
  report.set_client_id(options_.client_id);
  // A mismatch may be the application changing its own destination under the read: the
  // replica is condemned only if a copy into memory nobody else can write fails too.
  std::vector<std::unique_ptr<char[]>> copies;
  std::vector<transfer::TransferRequest> reads;
  std::vector<std::pair<size_t, int>> read_of;
  uint64_t bytes = 0;
  int64_t deadline = std::numeric_limits<int64_t>::max();
  for (const auto& [p, r] : batch.mismatched) {
    const KeyPlan& plan = batch.plans[p];
    const uint64_t size = plan.lookup->size();
    if (reads.size() >= options_.max_confirm_reads || size > options_.max_confirm_bytes - bytes) {
      break;
    }
    bytes += size;
    copies.push_back(std::make_unique<char[]>(size));
    const v1::Replica& rep = plan.lookup->replicas(r);
    reads.push_back({transfer::Direction::kRead,
                     {LocalBuffer{copies.back().get(), size}},
                     rep.data_endpoint(),
                     transfer::SegmentRange{rep.segment_id(), rep.offset()}});
    reads.back().capability = rep.capability();
    reads.back().proof = transfer::Proof::kDeliveredBytes;
    read_of.emplace_back(p, r);
    deadline = std::min(deadline, plan.deadline_ms);
  }
  if (!reads.empty() && clock_.NowMs() < deadline) {
    std::vector<transfer::TransferResult> again = engine_.Submit(reads, deadline);
    for (size_t k = 0; k < reads.size(); ++k) {
      const KeyPlan& plan = batch.plans[read_of[k].first];
      const transfer::TransferResult& res = again[k];
      if (!res.status.ok() || res.bytes != plan.lookup->size()) continue;  // no verdict
      const uint64_t got =
          res.checksum.has_value() ? *res.checksum : ScatterChecksum(reads[k].local);
      if (got == plan.lookup->checksum()) {
        metrics_.mismatches_unconfirmed.Inc();  // the replica is fine; the destination changed
        continue;
      }
      const v1::Replica& rep = plan.lookup->replicas(read_of[k].second);
      v1::ReplicaFaultItem* item = report.add_items();
      item->set_fault(v1::CORRUPT);
      item->set_key(plan.key);
      item->set_generation(plan.lookup->generation());
      item->set_holder(rep.client_id());
      item->set_segment_id(rep.segment_id());
      item->set_offset(rep.offset());
      metrics_.faults_reported_corrupt.Inc();
    }
  }
  for (const std::string& holder : batch.unreachable) {
    v1::ReplicaFaultItem* item = report.add_items();
    item->set_fault(v1::UNREACHABLE);
    item->set_holder(holder);
    metrics_.faults_reported_unreachable.Inc();
  }
  if (report.items_size() == 0) return;
  v1::ReportReplicaFaultsResponse resp;
  absl::Status s = master_.ReportReplicaFaults(report, &resp);
  if (!s.ok()) {
    MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn,
                 "reporting {} replica fault(s) to the master failed: {}", report.items_size(),
                 s.ToString());
  }
}

void BatchGetter::PromoteDiskHits(Batch& batch) {
  if (promoter_ == nullptr) return;
  std::vector<Promoter::Item> hits;
  for (const KeyPlan& plan : batch.plans) {
    if (!plan.done || plan.next == 0) continue;
    if (plan.lookup->replicas(plan.order[plan.next - 1]).tier() != v1::DISK) continue;
    hits.push_back(
        {plan.key, plan.lookup->generation(), plan.lookup->checksum(), ReadInto(batch, plan)});
  }
  promoter_->Promote(hits);
}

}  // namespace mc::client
