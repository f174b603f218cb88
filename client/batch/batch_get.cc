#include "client/batch/batch_get.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include <google/protobuf/arena.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/keys.h"
#include "common/logging.h"
#include "common/status.h"
#include "proto/status_convert.h"

namespace mc::client {

namespace {
constexpr size_t kNone = std::numeric_limits<size_t>::max();
}  // namespace

struct BatchGetter::KeyPlan {
  std::string key;
  std::vector<size_t> items;                // request positions, ascending
  absl::Status status;                      // key-level outcome (lookup, transfer, verification)
  const v1::KeyReplicas* lookup = nullptr;  // in Batch's arena, or `pinned`; set when status ok
  std::optional<v1::KeyReplicas> pinned;    // a MatchPrefix lease's copy
  int64_t deadline_ms = 0;                  // lease end on the local clock
  bool leased_here = false;                 // this call took the lease (and releases it)
  std::vector<int> order;                   // replica indices, preferred first
  size_t next = 0;                          // next position in `order` to try
  size_t primary = kNone;                   // item receiving the transfer
  uint64_t moved = 0;                       // bytes moved into the primary by the last transfer
  bool done = false;
  // GPU destinations that need staging (GpuGetStager): the key is read into `staging` (pinned
  // host memory held by `staging_lease`) and every destination is filled from there in FanOut.
  // Empty: the key is read into the primary's own destination.
  GpuGetStager::Lease staging_lease;
  std::vector<LocalBuffer> staging;
};

struct BatchGetter::Batch {
  explicit Batch(std::vector<GetRequestItem>& requested)
      : items(requested), results(requested.size()), dest(requested.size()) {}
  std::vector<GetRequestItem>& items;
  std::vector<GetItemResult> results;
  std::vector<std::vector<LocalBuffer>> dest;
  std::vector<KeyPlan> plans;
  uint64_t master_lease_id = 0;
  // Self-repair (RepairReplicas): memory replicas that failed the checksum, as (plan, replica),
  // and the holders (client ids) that refused a connection.
  std::vector<std::pair<size_t, int>> mismatched;
  std::vector<std::string> unreachable;
  // The master's answer is parsed onto this arena (thousands of small messages and strings per
  // batch, freed at once); plans point into it.
  google::protobuf::Arena arena;
};

// Where a key's transfer lands: its staging memory, else its primary destination.
const std::vector<LocalBuffer>& BatchGetter::ReadInto(const Batch& batch, const KeyPlan& plan) {
  return plan.staging.empty() ? batch.dest[plan.primary] : plan.staging;
}

BatchGetter::BatchGetter(BatchGetOptions options, MasterClient& master,
                         transfer::TransferEngine& engine, PrefixLeases& prefix_leases,
                         const Clock& clock, ClientMetrics& metrics)
    : options_(std::move(options)),
      master_(master),
      engine_(engine),
      prefix_leases_(prefix_leases),
      clock_(clock),
      metrics_(metrics) {}

uint64_t ScatterCopy(const std::vector<LocalBuffer>& from, const std::vector<LocalBuffer>& to) {
  size_t fi = 0, ti = 0;
  uint64_t fo = 0, to_off = 0, copied = 0;
  while (fi < from.size() && ti < to.size()) {
    uint64_t n = std::min(from[fi].length - fo, to[ti].length - to_off);
    if (n > 0) std::memcpy(to[ti].data + to_off, from[fi].data + fo, n);
    copied += n;
    fo += n;
    to_off += n;
    if (fo == from[fi].length) ++fi, fo = 0;
    if (to_off == to[ti].length) ++ti, to_off = 0;
  }
  return copied;
}

uint64_t ScatterCopyChecksum(const std::vector<LocalBuffer>& from,
                             const std::vector<LocalBuffer>& to, uint64_t* copied) {
  constexpr uint64_t kChunk = 256 << 10;  // hashed from the destination while cache-hot
  StreamingChecksum sum;
  size_t fi = 0, ti = 0;
  uint64_t fo = 0, to_off = 0;
  *copied = 0;
  while (fi < from.size() && ti < to.size()) {
    uint64_t n = std::min({from[fi].length - fo, to[ti].length - to_off, kChunk});
    if (n > 0) {
      std::memcpy(to[ti].data + to_off, from[fi].data + fo, n);
      sum.Update(to[ti].data + to_off, n);
    }
    *copied += n;
    fo += n;
    to_off += n;
    if (fo == from[fi].length) ++fi, fo = 0;
    if (to_off == to[ti].length) ++ti, to_off = 0;
  }
  return sum.Digest();
}

uint64_t ScatterChecksum(const std::vector<LocalBuffer>& pieces) {
  if (pieces.size() == 1) return Checksum(pieces[0].data, pieces[0].length);
  StreamingChecksum sum;
  for (const LocalBuffer& p : pieces) sum.Update(p.data, p.length);
  return sum.Digest();
}

void RejectOverlappingDestinations(std::vector<GetRequestItem>& items) {
  struct Range {
    uintptr_t begin, end;
    size_t item;
  };
  std::vector<Range> ranges;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].input_error.ok()) continue;
    for (const LocalBuffer& b : items[i].slices) {
      if (b.length == 0) continue;
      auto begin = reinterpret_cast<uintptr_t>(b.data);
      ranges.push_back({begin, begin + b.length, i});
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  uintptr_t max_end = 0;
  size_t max_item = kNone;
  for (const Range& r : ranges) {
    if (max_item != kNone && r.begin < max_end) {
      for (size_t i : {r.item, max_item}) {
        items[i].input_error =
            McError(Code::kInvalidArgument, "destination slices overlap another destination");
      }
    }
    if (r.end > max_end) {
      max_end = r.end;
      max_item = r.item;
    }
  }
}

std::vector<GetItemResult> BatchGetter::Get(std::vector<GetRequestItem>& items, uint64_t lease_id,
                                            InlineSink* sink) {
  RejectOverlappingDestinations(items);
  Batch batch(items);
  absl::flat_hash_map<std::string_view, size_t> plan_of;
  plan_of.reserve(items.size());
  batch.plans.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    GetItemResult& r = batch.results[i];
    r.status = items[i].input_error;
    if (r.status.ok()) r.status = ValidateKey(items[i].key);
    if (!r.status.ok()) continue;
    auto [it, inserted] = plan_of.emplace(items[i].key, batch.plans.size());
    if (inserted) {
      batch.plans.emplace_back();
      batch.plans.back().key = std::string(items[i].key);
    }
    batch.plans[it->second].items.push_back(i);
  }
  if (!batch.plans.empty()) {
    Lookup(batch, lease_id);
    AssignDestinations(batch, sink);
    TransferRounds(batch);
    FanOut(batch);
    PromoteDiskHits(batch);
    RepairReplicas(batch);
    ReleaseLeases(batch);
  }
  return std::move(batch.results);
}

void BatchGetter::Lookup(Batch& batch, uint64_t lease_id) {
  auto& req = *google::protobuf::Arena::CreateMessage<v1::GetReplicasRequest>(&batch.arena);
  req.set_client_id(options_.client_id);
  req.set_lease_ttl_ms(options_.lease_ttl_ms);
  std::vector<size_t> asked;
  for (size_t p = 0; p < batch.plans.size(); ++p) {
    KeyPlan& plan = batch.plans[p];
    if (lease_id != 0) {
      if (auto pinned = prefix_leases_.Find(lease_id, plan.key, &plan.deadline_ms)) {
        plan.pinned = std::move(*pinned);
        plan.lookup = &*plan.pinned;
        continue;
      }
    }
    req.add_keys(plan.key);
    asked.push_back(p);
  }
  if (!asked.empty()) {
    int64_t sent_ms = clock_.NowMs();
    auto& resp = *google::protobuf::Arena::CreateMessage<v1::GetReplicasResponse>(&batch.arena);
    absl::Status s = master_.GetReplicas(req, &resp);
    if (s.ok() && resp.results_size() != static_cast<int>(asked.size())) {
      s = McError(Code::kInternal, "master answered a different number of keys");
    }
    batch.master_lease_id = resp.lease_id();
    for (size_t i = 0; i < asked.size(); ++i) {
      KeyPlan& plan = batch.plans[asked[i]];
      if (!s.ok()) {
        plan.status = McError(Code::kUnavailable, absl::StrCat("master lookup: ", s.message()));
        continue;
      }
      plan.lookup = &resp.results(static_cast<int>(i));
      plan.leased_here = plan.lookup->code() == v1::OK;
      // The lease began after we sent the request, so this deadline is never late.
      plan.deadline_ms = sent_ms + static_cast<int64_t>(resp.lease_ttl_ms());
    }
  }
  for (KeyPlan& plan : batch.plans) {
    if (!plan.status.ok()) continue;
    if (plan.lookup->code() != v1::OK) {
      plan.status = McError(FromProtoCode(plan.lookup->code()), plan.lookup->message());
      continue;
    }
    // Replica preference: own memory, remote memory, own SSD tier, remote SSD tiers. Holders
    // that refused a connection moments ago are not dialled again (HolderBackoff).
    size_t skipped = 0;
    auto add = [&](bool memory, bool local) {
      for (int r = 0; r < plan.lookup->replicas_size(); ++r) {
        const auto& rep = plan.lookup->replicas(r);
        if ((rep.tier() == v1::MEMORY) != memory) continue;
        if ((rep.data_endpoint() == options_.local_endpoint) != local) continue;
        if (!memory && local && disk_reader_ == nullptr) continue;
        if (!local && HolderBackingOff(plan, r)) {
          ++skipped;
          continue;
        }
        plan.order.push_back(r);
      }
    };
    add(true, true);
    add(true, false);
    add(false, true);
    add(false, false);
    if (skipped > 0) metrics_.holder_backoff_skips.Inc(skipped);
    if (plan.order.empty()) {
      plan.status = skipped > 0 ? McError(Code::kTransferFailed,
                                          "every holder of this key refused a connection moments "
                                          "ago (backing off; the master was told)")
                                : McError(Code::kNotFound, "no readable replica");
    }
  }
}

void BatchGetter::AssignDestinations(Batch& batch, InlineSink* sink) {
  for (KeyPlan& plan : batch.plans) {
    for (size_t i : plan.items) {
      GetItemResult& r = batch.results[i];
      if (!plan.status.ok()) {
        r.status = plan.status;
        continue;
      }
      uint64_t size = plan.lookup->size();
      r.size = size;
      GetRequestItem& item = batch.items[i];
      if (item.inline_data) {
        char* mem = sink == nullptr ? nullptr : sink->Allocate(i, size);
        if (mem == nullptr) {
          r.status = McError(
              Code::kInvalidArgument,
              absl::StrCat("object of ", size, " bytes exceeds the inline limit; use slices"));
          continue;
        }
        batch.dest[i] = {LocalBuffer{mem, size}};
      } else if (TotalLength(item.slices) != size) {
        r.status = McError(
            Code::kSizeMismatch,
            absl::StrCat("slices hold ", TotalLength(item.slices), " bytes, object has ", size));
        continue;
      } else {
        batch.dest[i] = item.slices;
      }
      if (plan.primary == kNone) plan.primary = i;
    }
    if (plan.primary != kNone) PlanGpuDestinations(batch, plan);
  }
}

void BatchGetter::PlanGpuDestinations(Batch& batch, KeyPlan& plan) const {
  size_t valid = 0;
  bool gpu = false;
  for (size_t i : plan.items) {
    if (!batch.results[i].status.ok()) continue;
    ++valid;
    gpu |= !batch.items[i].gpu.empty();
  }
  if (!gpu) return;
  if (valid == 1 && batch.items[plan.primary].gpu.single() && !plan.order.empty() &&
      IsDirectSource(batch, plan, plan.order.front())) {
    // Direct: the cuda transport copies a local segment into the GPU destination, or the NIC
    // reads a remote one into it (GPUDirect RDMA), and the device hashes what landed (local
    // memory replicas come first in `order`). Should the direct sources all fail, TransferRounds
    // stages the key for the remaining replicas.
    return;
  }
  // Staged: the key's replica may be anywhere (remote memory, an SSD tier), or the key has
  // further destinations, which the CPU fills from staging memory, never from GPU memory.
  const absl::Status refused = ReserveStaging(plan);
  if (refused.ok()) return;
  // No staging: the key's GPU destinations fail, its host destinations go on.
  plan.primary = kNone;
  for (size_t i : plan.items) {
    GetItemResult& r = batch.results[i];
    if (!r.status.ok()) continue;
    if (!batch.items[i].gpu.empty()) {
      r.status = refused;
      batch.dest[i].clear();
    } else if (plan.primary == kNone) {
      plan.primary = i;
    }
  }
}

bool BatchGetter::IsLocalMemory(const KeyPlan& plan, int replica) const {
  const auto& rep = plan.lookup->replicas(replica);
  return rep.tier() == v1::MEMORY && rep.data_endpoint() == options_.local_endpoint;
}

bool BatchGetter::IsDirectSource(const Batch& batch, const KeyPlan& plan, int replica) const {
  if (IsLocalMemory(plan, replica)) return true;
  const auto& rep = plan.lookup->replicas(replica);
  const std::vector<LocalBuffer>& dest = batch.dest[plan.primary];
  transfer::GpuTransfers* gpu = engine_.gpu();
  return rep.tier() == v1::MEMORY && gpu != nullptr && dest.size() == 1 &&
         gpu->CanReadDirect(rep.data_endpoint(), dest[0].data, dest[0].length);
}

absl::Status BatchGetter::ReserveStaging(KeyPlan& plan) const {
  if (gpu_stager_ == nullptr) {
    return McError(Code::kInvalidArgument,
                   "this GPU destination needs staging (a further destination of its key, or no "
                   "replica in this daemon's memory) and this mc-client has no GPU get staging");
  }
  absl::StatusOr<GpuGetStager::Lease> lease = gpu_stager_->Reserve(plan.lookup->size());
  if (!lease.ok()) return lease.status();
  plan.staging_lease = *std::move(lease);
  plan.staging = {LocalBuffer{plan.staging_lease.data(), plan.staging_lease.length()}};
  return absl::OkStatus();
}

void BatchGetter::TransferRounds(Batch& batch) {
  for (int round = 0; round < options_.max_replica_rounds; ++round) {
    std::vector<transfer::TransferRequest> reqs;
    std::vector<size_t> owner;  // plan index per request
    reqs.reserve(batch.plans.size());
    owner.reserve(batch.plans.size());
    int64_t deadline = std::numeric_limits<int64_t>::max();
    for (size_t p = 0; p < batch.plans.size(); ++p) {
      KeyPlan& plan = batch.plans[p];
      if (!plan.status.ok() || plan.done || plan.primary == kNone) continue;
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
        continue;  // status says why
      }
      if (plan.staging.empty() && !batch.items[plan.primary].gpu.empty() &&
          !IsDirectSource(batch, plan, plan.order[plan.next])) {
        // A direct GPU read whose direct sources all failed: the rest go through staging.
        if (absl::Status s = ReserveStaging(plan); !s.ok()) {
          plan.status = McError(ToCode(s), absl::StrCat("this daemon's replicas failed and the "
                                                        "others need staging: ",
                                                        s.message()));
          plan.next = plan.order.size();
          continue;
        }
      }
      const auto& rep = plan.lookup->replicas(plan.order[plan.next]);
      if (rep.tier() == v1::MEMORY) {
        reqs.push_back({transfer::Direction::kRead, ReadInto(batch, plan), rep.data_endpoint(),
                        transfer::SegmentRange{rep.segment_id(), rep.offset()}});
      } else {
        // DISK: the owner reads and verifies the record (generation, locator, key tag).
        reqs.push_back(
            {transfer::Direction::kRead, ReadInto(batch, plan), rep.data_endpoint(),
             transfer::DiskRecord{plan.lookup->generation(), rep.offset(), DiskKeyTag(plan.key)}});
      }
      reqs.back().capability = rep.capability();             // the master's read grant, if any
      reqs.back().proof = transfer::Proof::kDeliveredBytes;  // hashed as the bytes land
      owner.push_back(p);
      deadline = std::min(deadline, plan.deadline_ms);
    }
    if (reqs.empty()) return;
    std::vector<transfer::TransferResult> results = SubmitReads(batch, reqs, owner, deadline);
    int64_t now = clock_.NowMs();
    for (size_t i = 0; i < reqs.size(); ++i) {
      KeyPlan& plan = batch.plans[owner[i]];
      const transfer::TransferResult& res = results[i];
      plan.moved = res.bytes;
      ++plan.next;
      bool more = plan.next < plan.order.size();
      if (now > plan.deadline_ms) {
        if (!res.status.ok()) {
          // The owner did not answer before the lease ended (stalled or unreachable): that is
          // a failed transfer, not an expired lease; no fallback, the lease is over.
          plan.status =
              McError(Code::kTransferFailed,
                      absl::StrCat("replica on ", reqs[i].endpoint,
                                   " did not answer before the read lease ended (owner stalled?): ",
                                   res.status.message()));
          continue;
        }
        plan.status =
            McError(Code::kLeaseExpired, "the transfer ended after the read lease expired");
        metrics_.lease_expiries.Inc();
        continue;
      }
      const int replica = plan.order[plan.next - 1];
      if (!res.status.ok()) NoteFault(batch, owner[i], replica, res.status, false);
      if (ToCode(res.status) == Code::kChecksumMismatch) {
        // The replica's owner read its SSD record and it failed verification: its verdict, not a
        // transport failure (the owner drops the record and tells the master).
        metrics_.checksum_mismatches.Inc();
        plan.status = McError(
            Code::kChecksumMismatch,
            absl::StrCat("replica on ", reqs[i].endpoint, ": ", std::string(res.status.message())));
        if (more) metrics_.replica_fallbacks.Inc(), plan.status = absl::OkStatus();
        continue;
      }
      if (!res.status.ok() || res.bytes != plan.lookup->size()) {
        plan.status = McError(
            Code::kTransferFailed,
            absl::StrCat("replica on ", reqs[i].endpoint, ": ",
                         res.status.ok() ? "short transfer" : std::string(res.status.message())));
        if (more) metrics_.replica_fallbacks.Inc(), plan.status = absl::OkStatus();
        continue;
      }
      // The transport's hash is of the destination bytes as delivered; without one, hash here,
      // but never GPU memory: the CPU cannot read it, and only the device hash proves it.
      if (!res.checksum.has_value() && plan.staging.empty() &&
          !batch.items[plan.primary].gpu.empty()) {
        plan.status =
            McError(Code::kTransferFailed, absl::StrCat("replica on ", reqs[i].endpoint,
                                                        ": no device hash of the GPU destination"));
        if (more) metrics_.replica_fallbacks.Inc(), plan.status = absl::OkStatus();
        continue;
      }
      const uint64_t got =
          res.checksum.has_value() ? *res.checksum : ScatterChecksum(ReadInto(batch, plan));
      if (got != plan.lookup->checksum()) {
        metrics_.checksum_mismatches.Inc();
        Logger("client").error("checksum mismatch reading {} from {} (generation {})",
                               KeyForLog(plan.key), reqs[i].endpoint, plan.lookup->generation());
        NoteFault(batch, owner[i], replica, absl::OkStatus(), /*mismatch=*/true);
        plan.status = McError(Code::kChecksumMismatch, absl::StrCat("replica on ", reqs[i].endpoint,
                                                                    " failed the checksum"));
        if (more) metrics_.replica_fallbacks.Inc(), plan.status = absl::OkStatus();
        continue;
      }
      plan.done = true;
    }
  }
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

void BatchGetter::FanOut(Batch& batch) {
  // GPU slices of staged keys, copied and proved on the device in one batch at the end.
  std::vector<GpuGetStager::Copy> gpu_copies;
  std::vector<size_t> gpu_items;  // item of each copy
  for (KeyPlan& plan : batch.plans) {
    const bool staged = !plan.staging.empty();
    for (size_t i : plan.items) {
      GetItemResult& r = batch.results[i];
      if (!r.status.ok()) continue;
      if (!plan.done) {
        r.status = plan.status.ok() ? McError(Code::kTransferFailed, "no replica could be read")
                                    : plan.status;
        r.bytes_written = i == plan.primary && !staged ? plan.moved : 0;
        continue;
      }
      if (i != plan.primary) metrics_.duplicate_keys.Inc();
      if (i == plan.primary && !staged) {
        r.bytes_written = plan.moved;  // verified in TransferRounds
      } else if (!batch.items[i].gpu.empty()) {
        // Staged (PlanGpuDestinations): the staging bytes were verified against the object's
        // checksum; each slice is filled from its range of them and proved equal to it.
        const size_t copies = gpu_copies.size();
        r.status = StageOut(plan, batch.items[i], batch.dest[i], &r.bytes_written, &gpu_copies);
        gpu_items.resize(gpu_copies.size(), i);
        if (!r.status.ok() || gpu_copies.size() > copies) continue;  // counted once copied
      } else {
        const uint64_t sum =
            ScatterCopyChecksum(ReadInto(batch, plan), batch.dest[i], &r.bytes_written);
        if (r.bytes_written != plan.lookup->size() || sum != plan.lookup->checksum()) {
          r.status = McError(Code::kInternal, "destination failed verification after copy");
          continue;
        }
      }
      metrics_.bytes_out.Inc(r.bytes_written);
    }
  }
  if (gpu_copies.empty()) return;
  const std::vector<GpuGetStager::Result> copied = gpu_stager_->CopyToDevice(gpu_copies);
  for (size_t k = 0; k < gpu_items.size(); ++k) {
    GetItemResult& r = batch.results[gpu_items[k]];
    r.bytes_written += copied[k].bytes;
    if (!copied[k].status.ok() && r.status.ok()) {
      r.status = copied[k].status;
      if (ToCode(r.status) == Code::kChecksumMismatch) {
        metrics_.checksum_mismatches.Inc();
        Logger("client").error(
            "a GPU destination of {} failed the device checksum after its copy from staging: {}",
            KeyForLog(batch.items[gpu_items[k]].key), std::string(r.status.message()));
      }
    }
    const bool last_of_item = k + 1 == gpu_items.size() || gpu_items[k + 1] != gpu_items[k];
    if (last_of_item && r.status.ok()) metrics_.bytes_out.Inc(r.bytes_written);
  }
}

absl::Status BatchGetter::StageOut(const KeyPlan& plan, const GetRequestItem& item,
                                   const std::vector<LocalBuffer>& dest, uint64_t* bytes_written,
                                   std::vector<GpuGetStager::Copy>* gpu_copies) const {
  *bytes_written = 0;
  if (item.gpu.on_device.size() != dest.size() || TotalLength(dest) != plan.lookup->size()) {
    return McError(Code::kInternal, "a GPU destination's slices do not match its item");
  }
  const char* from = plan.staging[0].data;
  if (item.gpu.single()) {  // the whole object: the recorded checksum is the proof
    gpu_copies->push_back({dest[0].data, from, dest[0].length, plan.lookup->checksum()});
    return absl::OkStatus();
  }
  uint64_t host_bytes = 0;
  for (size_t s = 0; s < dest.size(); ++s) {
    const LocalBuffer& d = dest[s];
    if (d.length > 0 && item.gpu.on_device[s]) {
      gpu_copies->push_back({d.data, from, d.length, Checksum(from, d.length)});
    } else if (d.length > 0) {
      std::memcpy(d.data, from, d.length);
      if (std::memcmp(d.data, from, d.length) != 0) {
        return McError(Code::kInternal, "destination failed verification after copy");
      }
      host_bytes += d.length;
    }
    from += d.length;
  }
  *bytes_written = host_bytes;
  return absl::OkStatus();
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

void BatchGetter::ReleaseLeases(Batch& batch) {
  v1::ReleaseLeasesRequest req;
  req.set_lease_id(batch.master_lease_id);
  for (const KeyPlan& plan : batch.plans) {
    if (plan.leased_here) req.add_keys(plan.key);
  }
  if (req.keys_size() == 0) return;
  // Our transfers are over and verified: the answer need not wait for the master's reply.
  const int keys = req.keys_size();
  master_.ReleaseLeasesAsync(std::move(req), [keys](absl::Status s) {
    if (s.ok()) return;
    MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn,
                 "releasing {} lease(s) failed: {}; they expire by TTL", keys, s.ToString());
  });
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
