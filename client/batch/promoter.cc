#include "client/batch/promoter.h"

#include <memory>

#include "client/batch/batch_get.h"
#include "common/logging.h"

namespace mc::client {
namespace {

// mc_client_promotions_total{result}.
Counter& PromotionsCounter(MetricsRegistry& metrics, const char* result) {
  return metrics.GetCounter("mc_client_promotions_total",
                            "SSD hits written back to memory, by result", {{"result", result}});
}

}  // namespace

Promoter::Promoter(std::string client_id, MasterClient& master, transfer::TransferEngine& engine,
                   const Clock& clock, MetricsRegistry& metrics, uint64_t staging_bytes)
    : client_id_(std::move(client_id)),
      staging_bytes_(staging_bytes),
      master_(master),
      engine_(engine),
      clock_(clock),
      promoted_(PromotionsCounter(metrics, "ok")),
      failed_(PromotionsCounter(metrics, "failed")) {}

size_t Promoter::Promote(const std::vector<Item>& items) {
  size_t ok = 0;
  std::vector<const Item*> round;
  uint64_t staged = 0;
  for (const Item& item : items) {
    const uint64_t size = TotalLength(item.bytes);
    if (!round.empty() && staged + size > staging_bytes_) {
      ok += PromoteRound(round);
      round.clear();
      staged = 0;
    }
    round.push_back(&item);
    staged += size;
  }
  if (!round.empty()) ok += PromoteRound(round);
  return ok;
}

// Private, verified copies of the round's items: the get's destinations belong to the
// application.
struct Promoter::Staging {
  std::vector<const Item*> items;
  std::vector<std::unique_ptr<char[]>> copies;
  std::vector<std::vector<transfer::LocalBuffer>> staged;  // per item: its copy
};

void Promoter::Stage(const std::vector<const Item*>& candidates, Staging& staging) {
  for (const Item* item : candidates) {
    const uint64_t size = TotalLength(item->bytes);
    auto copy = std::make_unique_for_overwrite<char[]>(size);
    std::vector<transfer::LocalBuffer> to{transfer::LocalBuffer{copy.get(), size}};
    uint64_t copied = 0;
    const uint64_t sum = ScatterCopyChecksum(item->bytes, to, &copied);
    if (copied != size || sum != item->checksum) {
      failed_.Inc();
      Logger("client").warn(
          "not promoting {}: the get's destination changed before it could be staged",
          KeyForLog(item->key));
      continue;
    }
    staging.items.push_back(item);
    staging.copies.push_back(std::move(copy));
    staging.staged.push_back(std::move(to));
  }
}

void Promoter::NotifyOwners(const std::vector<const Item*>& items,
                            const std::vector<transfer::TransferRequest>& writes,
                            const std::vector<size_t>& owner,
                            const std::vector<transfer::TransferResult>& done,
                            const v1::PromoteStartResponse& placed, int64_t deadline) {
  std::vector<WrittenReplica> notices;
  for (size_t w = 0; w < writes.size(); ++w) {
    const Item& item = *items[owner[w]];
    const uint64_t size = TotalLength(item.bytes);
    if (!done[w].status.ok() || done[w].bytes != size) continue;
    const auto& rep = placed.results(static_cast<int>(owner[w])).replicas(0);
    notices.push_back({.key = item.key,
                       .generation = item.generation,
                       .size = size,
                       .checksum = item.checksum,
                       .endpoint = rep.data_endpoint(),
                       .segment_id = rep.segment_id(),
                       .offset = rep.offset(),
                       .capability = rep.capability()});
  }
  // Best effort: a promoted copy its owner did not record is forgotten by a master restart,
  // which loses nothing (the object's SSD record stays and is reported).
  (void)notifier_->Notify(notices, deadline);
}

size_t Promoter::PromoteRound(const std::vector<const Item*>& candidates) {
  Staging staging;
  Stage(candidates, staging);
  const std::vector<const Item*>& items = staging.items;
  const std::vector<std::vector<transfer::LocalBuffer>>& staged = staging.staged;
  if (items.empty()) return 0;
  v1::PromoteStartRequest start;
  start.set_client_id(client_id_);
  for (const Item* item : items) {
    auto* p = start.add_items();
    p->set_key(item->key.data(), item->key.size());
    p->set_generation(item->generation);
  }
  int64_t sent_ms = clock_.NowMs();
  v1::PromoteStartResponse placed;
  absl::Status s = master_.PromoteStart(start, &placed);
  if (!s.ok() || placed.results_size() != static_cast<int>(items.size())) {
    failed_.Inc(items.size());
    return 0;
  }
  std::vector<transfer::TransferRequest> writes;
  std::vector<size_t> owner;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& r = placed.results(static_cast<int>(i));
    if (r.code() != v1::OK || r.replicas_size() != 1) continue;
    const auto& rep = r.replicas(0);
    writes.push_back({transfer::Direction::kWrite, staged[i], rep.data_endpoint(),
                      transfer::SegmentRange{rep.segment_id(), rep.offset()}});
    writes.back().capability = rep.capability();  // the master's write grant, if any
    owner.push_back(i);
  }
  if (writes.empty()) return 0;
  const int64_t deadline = sent_ms + static_cast<int64_t>(placed.write_deadline_ms());
  std::vector<transfer::TransferResult> done = engine_.Submit(writes, deadline);
  if (notifier_ != nullptr) NotifyOwners(items, writes, owner, done, placed, deadline);
  v1::PromoteEndRequest end;
  end.set_client_id(client_id_);
  for (size_t w = 0; w < writes.size(); ++w) {
    uint64_t expect = 0;
    for (const auto& b : writes[w].local) expect += b.length;
    auto* p = end.add_items();
    p->set_key(items[owner[w]]->key.data(), items[owner[w]]->key.size());
    p->set_generation(items[owner[w]]->generation);
    p->set_written(done[w].status.ok() && done[w].bytes == expect);
  }
  v1::PromoteEndResponse ended;
  s = master_.PromoteEnd(end, &ended);
  size_t ok = 0;
  if (s.ok() && ended.results_size() == end.items_size()) {
    for (int i = 0; i < ended.results_size(); ++i) {
      if (end.items(i).written() && ended.results(i).code() == v1::OK) ++ok;
    }
  }
  promoted_.Inc(ok);
  failed_.Inc(items.size() - ok);
  return ok;
}

}  // namespace mc::client
