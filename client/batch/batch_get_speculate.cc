// BatchGetter's speculative local copies (docs/architecture.md, "Speculative local copies"):
// keys this daemon's own ObjectIndex places in its segments are copied into their destination
// while the master lookup is in flight, and kept only when the answer proves them.
#include <utility>

#include "client/batch/batch_get.h"
#include "client/batch/batch_get_plan.h"

namespace mc::client {
namespace {

bool OverlapsAny(const std::vector<LocalBuffer>& slices, const char* p, uint64_t n) {
  for (const LocalBuffer& b : slices) {
    if (b.length > 0 && b.data < p + n && p < b.data + b.length) return true;
  }
  return false;
}

}  // namespace

void BatchGetter::SetSpeculation(SpeculationSource source) {
  if (source.index == nullptr || !source.resolve) return;
  speculation_ = std::move(source);
  copier_ = std::make_unique<SpeculativeCopier>();
}

void BatchGetter::StartSpeculation(Batch& batch, const std::vector<size_t>& asked) {
  // Bounded work before the lookup is sent: a get of many keys does not even look them up.
  if (copier_ == nullptr || asked.size() > speculation_->max_job_keys) return;
  std::vector<SpeculativeCopier::Item> items;
  uint64_t budget = speculation_->max_job_bytes;
  for (size_t p : asked) {
    const KeyPlan& plan = batch.plans[p];
    // Only the key's first item, when it is host memory the get writes anyway (not inline:
    // its memory is allocated from the answer; not GPU memory: the CPU never touches it).
    const size_t i = plan.items.front();
    const GetRequestItem& item = batch.items[i];
    if (item.inline_data || !item.gpu.empty()) continue;
    std::optional<ObjectIndex::Entry> e = speculation_->index->Find(plan.key);
    if (!e.has_value() || e->local_index >= speculation_->segments.size()) continue;
    const uint64_t size = e->object.size;
    const LocalBuffer& seg = speculation_->segments[e->local_index];
    if (TotalLength(item.slices) != size || e->offset > seg.length ||
        size > seg.length - e->offset) {
      continue;
    }
    const char* src = seg.data + e->offset;
    if (OverlapsAny(item.slices, src, size)) continue;
    if (size > budget) {  // a larger get: its copies keep the transfer engine's parallel path
      batch.speculated.clear();
      return;
    }
    budget -= size;
    items.push_back({src, size, item.slices});
    batch.speculated.push_back({p, i, *std::move(e)});
  }
  if (items.empty()) return;
  batch.spec_job = copier_->TryStart(std::move(items));
  if (batch.spec_job == nullptr) {  // the helper copies for another get: no speculation here
    metrics_.get_speculative_skipped.Inc(batch.speculated.size());
    batch.speculated.clear();
  }
}

bool BatchGetter::SpeculationMatches(const Batch& batch, const Speculated& s) const {
  const KeyPlan& plan = batch.plans[s.plan];
  // Leased by this lookup, the copy's item still the key's one host destination, nothing read.
  if (!plan.status.ok() || !plan.leased_here || plan.primary != s.item || !plan.staging.empty() ||
      plan.order.empty() || plan.next != 0 || plan.done) {
    return false;
  }
  const v1::KeyReplicas& kr = *plan.lookup;
  if (kr.generation() != s.entry.object.generation || kr.size() != s.entry.object.size) {
    return false;
  }
  // The replica the get would read first: this daemon's memory, at the very range copied.
  const int r = plan.order.front();
  if (!IsLocalMemory(plan, r)) return false;
  const v1::Replica& rep = kr.replicas(r);
  if (rep.offset() != s.entry.offset || rep.length() != kr.size()) return false;
  const std::optional<size_t> local = speculation_->resolve(rep.segment_id());
  return local.has_value() && *local == s.entry.local_index;
}

void BatchGetter::SettleSpeculation(Batch& batch) {
  if (batch.spec_job == nullptr) return;
  std::vector<bool> wanted(batch.speculated.size());
  for (size_t k = 0; k < batch.speculated.size(); ++k) {
    wanted[k] = SpeculationMatches(batch, batch.speculated[k]);
  }
  // Afterwards no thread writes any of these destinations but this one.
  const std::vector<SpeculativeCopier::Item>& copies =
      SpeculativeCopier::Finish(*batch.spec_job, wanted);
  const int64_t now = clock_.NowMs();
  for (size_t k = 0; k < batch.speculated.size(); ++k) {
    KeyPlan& plan = batch.plans[batch.speculated[k].plan];
    // The bytes as written must hash to the master's checksum, judged under the lease.
    if (!wanted[k] || !copies[k].copied || copies[k].checksum != plan.lookup->checksum() ||
        now > plan.deadline_ms) {
      metrics_.get_speculative_redone.Inc();  // TransferRounds reads it from the answer
      continue;
    }
    // Kept; late: the helper had not started it, so this thread copied it after the answer.
    (copies[k].after_answer ? metrics_.get_speculative_late : metrics_.get_speculative_kept).Inc();
    plan.moved = copies[k].size;
    plan.next = 1;  // its first replica, the one copied
    plan.done = true;
  }
  batch.spec_job.reset();
  batch.speculated.clear();
}

}  // namespace mc::client
