#include "client/promoter.h"

#include "common/logging.h"

namespace mc::client {

Promoter::Promoter(std::string client_id, MasterClient& master, transfer::TransferEngine& engine,
                   const Clock& clock, MetricsRegistry& metrics)
    : client_id_(std::move(client_id)),
      master_(master),
      engine_(engine),
      clock_(clock),
      promoted_(metrics.GetCounter("mc_client_promotions_total",
                                   "SSD hits written back to memory, by result",
                                   {{"result", "ok"}})),
      failed_(metrics.GetCounter("mc_client_promotions_total",
                                 "SSD hits written back to memory, by result",
                                 {{"result", "failed"}})) {}

size_t Promoter::Promote(const std::vector<Item>& items) {
  if (items.empty()) return 0;
  v1::PromoteStartRequest start;
  start.set_client_id(client_id_);
  for (const Item& item : items) {
    auto* p = start.add_items();
    p->set_key(item.key.data(), item.key.size());
    p->set_generation(item.generation);
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
    writes.push_back({transfer::OpKind::kWrite, items[i].bytes, rep.data_endpoint(),
                      rep.segment_id(), rep.offset()});
    owner.push_back(i);
  }
  if (writes.empty()) return 0;
  std::vector<transfer::TransferResult> done =
      engine_.Submit(writes, sent_ms + static_cast<int64_t>(placed.write_deadline_ms()));
  v1::PromoteEndRequest end;
  end.set_client_id(client_id_);
  for (size_t w = 0; w < writes.size(); ++w) {
    uint64_t expect = 0;
    for (const auto& b : writes[w].local) expect += b.length;
    auto* p = end.add_items();
    p->set_key(items[owner[w]].key.data(), items[owner[w]].key.size());
    p->set_generation(items[owner[w]].generation);
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
