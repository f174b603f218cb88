#include "client/batch/batch_get.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include <google/protobuf/arena.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/batch/batch_get_plan.h"
#include "common/checksum.h"
#include "common/keys.h"
#include "common/logging.h"
#include "common/status.h"
#include "proto/packed_lookups.h"
#include "proto/status_convert.h"

namespace mc::client {

using batch_get_internal::kNone;

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
      metrics_(metrics),
      packed_keys_(clock, options_.packed_keys_retry_ms) {}

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
    OrderReplicas(batch);
    AssignDestinations(batch, sink);
    SettleSpeculation(batch);
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
    asked.push_back(p);
  }
  if (asked.empty()) return;
  std::vector<std::string_view> names;
  names.reserve(asked.size());
  for (size_t p : asked) names.push_back(batch.plans[p].key);
  // Keys packed and the answer as columns, unless turned off or an older master was met lately.
  bool packed = options_.pack_master_keys && !packed_keys_.Resting();
  SetRequestKeys(names, packed, &req);
  req.set_packed(packed);
  StartSpeculation(batch, asked);  // copies our own keys while the lookup is in flight
  int64_t sent_ms = clock_.NowMs();
  auto& resp = *google::protobuf::Arena::CreateMessage<v1::GetReplicasResponse>(&batch.arena);
  absl::Status s = master_.GetReplicas(req, &resp);
  using Seen = PackedKeysGate::Seen;
  if (s.ok() && packed && PackedKeysGate::Classify(resp.keys_seen(), asked.size()) == Seen::kNone) {
    // A master older than packed keys saw none (and so leased nothing): ask again key by key.
    packed_keys_.OlderMaster(resp.keys_seen(), asked.size(), "gets");
    packed = false;
    SetRequestKeys(names, packed, &req);
    req.set_packed(packed);
    resp.Clear();
    sent_ms = clock_.NowMs();
    s = master_.GetReplicas(req, &resp);
  }
  const bool reached = s.ok();  // the master answered (it may have leased keys)
  // The answer's rows: the columns of `packed` (a master older than that answers records).
  std::optional<PackedLookupsReader> rows;
  if (s.ok() && resp.has_packed()) {
    absl::StatusOr<PackedLookupsReader> reader = PackedLookupsReader::Open(resp.packed());
    if (reader.ok()) {
      rows = *std::move(reader);
    } else {
      s = reader.status();
    }
  }
  const size_t row_count =
      rows.has_value() ? rows->rows() : static_cast<size_t>(resp.results_size());
  if (s.ok() && packed && PackedKeysGate::Classify(resp.keys_seen(), asked.size()) != Seen::kAll) {
    // kSome (kNone was asked again unpacked): a master that may have leased some keys.
    s = McError(Code::kInternal, absl::StrCat("master saw ", resp.keys_seen(), " of ", asked.size(),
                                              " packed keys"));
  } else if (s.ok() && row_count != asked.size()) {
    s = McError(Code::kInternal, "master answered a different number of keys");
  }
  // An answer this daemon cannot read still leased what the master found: those leases are
  // given back with the others (the master ignores keys it did not lease under this id) rather
  // than left to pin the keys for the whole TTL.
  const bool unreadable = reached && !s.ok() && resp.lease_id() != 0;
  batch.master_lease_id = resp.lease_id();
  for (size_t i = 0; i < asked.size(); ++i) {
    KeyPlan& plan = batch.plans[asked[i]];
    if (!s.ok()) {
      plan.status = McError(Code::kUnavailable, absl::StrCat("master lookup: ", s.message()));
      plan.leased_here = unreadable;
      continue;
    }
    if (rows.has_value()) {
      auto* record = google::protobuf::Arena::CreateMessage<v1::KeyReplicas>(&batch.arena);
      rows->Unpack(i, record);
      plan.lookup = record;
    } else {
      plan.lookup = &resp.results(static_cast<int>(i));
    }
    plan.leased_here = plan.lookup->code() == v1::OK;
    // The lease began after we sent the request, so this deadline is never late.
    plan.deadline_ms = sent_ms + static_cast<int64_t>(resp.lease_ttl_ms());
  }
}

void BatchGetter::OrderReplicas(Batch& batch) {
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

}  // namespace mc::client
