#include "client/session/master_session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "proto/status_convert.h"

namespace mc::client {
namespace {

// mc_client_index_reported_total{result}.
Counter& IndexReportedCounter(MetricsRegistry& metrics, const char* result) {
  return metrics.GetCounter("mc_client_index_reported_total",
                            "index entries handled by the object report after a registration, "
                            "by result",
                            {{"result", result}});
}

// What an item costs in a ReportObjects request besides its key (field tags, varints).
constexpr size_t kReportItemOverhead = 64;

}  // namespace

MasterSession::MasterSession(MasterSessionOptions options, MasterClient& master, SegmentPool& pool,
                             transfer::SegmentTable& table)
    : options_(std::move(options)),
      master_(master),
      pool_(pool),
      table_(table),
      thread_(options_.clock != nullptr ? *options_.clock : RealClock::Get(),
              [this] { return Round(); }) {
  MetricsRegistry* m = options_.metrics;
  if (m == nullptr) {
    own_metrics_ = std::make_unique<MetricsRegistry>();
    m = own_metrics_.get();
  }
  report_kept_ = &IndexReportedCounter(*m, "kept");
  report_dropped_ = &IndexReportedCounter(*m, "dropped");
  report_verify_failed_ = &m->GetCounter("mc_client_index_verify_failed_total",
                                         "index entries whose bytes no longer matched their "
                                         "checksum at report time (dropped, not reported)");
  reports_failed_ = &m->GetCounter("mc_client_index_reports_failed_total",
                                   "object reports that failed (the registration is retried)");
  forgotten_counter_ = &m->GetCounter("mc_client_index_forgotten_total",
                                      "index entries dropped because the master freed them");
  report_ms_ = &m->GetGauge("mc_client_index_report_ms", "duration of the last object report");
}

MasterSession::~MasterSession() { Stop(); }

absl::Status MasterSession::Register() {
  v1::RegisterClientRequest req;
  req.set_client_id(options_.client_id);
  req.set_host(options_.host);
  req.set_data_endpoint(options_.data_endpoint);
  req.set_disk_capacity(options_.disk_capacity);
  req.set_will_report_objects(index_ != nullptr);
  if (disk_used_) req.set_disk_used(disk_used_());  // known at once, not a heartbeat later
  for (size_t i = 0; i < pool_.segments().size(); ++i) {
    auto* seg = req.add_segments();
    seg->set_local_index(i);
    seg->set_size(pool_.segments()[i].size);
  }
  v1::RegisterClientResponse resp;
  const int64_t sent_ms = RealClock::Get().NowMs();
  absl::Status s = master_.RegisterClient(req, &resp);
  if (!s.ok()) return s;
  if (on_capability_info_) {  // before the segments are published: peers may read them next
    on_capability_info_({&resp.capability_key(), resp.capability_clock_ms(), sent_ms});
  }
  std::vector<uint64_t> ids(resp.segment_ids().begin(), resp.segment_ids().end());
  pool_.Publish(ids, table_);
  session_ = resp.session();
  if (resp.heartbeat_interval_ms() > 0) heartbeat_ms_ = resp.heartbeat_interval_ms();
  if (index_ != nullptr) {
    // The master holds our segments out of placement until the last chunk: report now.
    s = ReportObjects(resp.session());
    if (absl::IsUnimplemented(s)) {
      // An mc-master older than the report: it did not hold our segments either. Serve on; what
      // the index holds is simply not restored by this master.
      MC_LOG_EVERY(std::chrono::minutes(10), Logger("client"), warn,
                   "the master takes no object reports ({}): objects in our memory will not "
                   "survive its restart",
                   std::string(s.message()));
      s = absl::OkStatus();
    }
    if (!s.ok()) {
      reports_failed_->Inc();
      registered_ = false;
      return McError(ToCode(s), absl::StrCat("object report: ", s.message()));
    }
  }
  registered_ = true;
  ++registrations_;
  Logger("client").info("registered with the master as {} (session {}, epoch {}, {} segment(s))",
                        options_.client_id, resp.session(), resp.epoch(), ids.size());
  if (on_registered_) on_registered_();
  return absl::OkStatus();
}

absl::Status MasterSession::ReportObjects(uint64_t session) {
  const int64_t start_ms = RealClock::Get().NowMs();
  const std::vector<ObjectIndex::Entry> entries = index_->Snapshot();
  const std::vector<uint64_t> ids = pool_.published_ids();
  ReportStats stats;
  v1::ReportObjectsRequest req;
  req.set_client_id(options_.client_id);
  req.set_session(session);
  std::vector<const ObjectIndex::Entry*> chunk;
  size_t chunk_bytes = 0;
  const size_t max_items = std::max<size_t>(options_.report_chunk_items, 1);
  for (const ObjectIndex::Entry& e : entries) {
    const IndexedObject& o = e.object;
    // The bytes must still be this object's: a range reused or scribbled since is dropped.
    bool valid = e.local_index < ids.size() && e.local_index < pool_.segments().size();
    if (valid) {
      const SegmentPool::Segment& seg = pool_.segments()[e.local_index];
      valid = e.offset <= seg.size && o.size <= seg.size - e.offset &&
              Checksum(seg.base + e.offset, o.size) == o.checksum;
    }
    if (!valid) {
      index_->Erase(e.local_index, e.offset, o.generation);
      ++stats.verify_failed;
      report_verify_failed_->Inc();
      continue;
    }
    const size_t item_bytes = o.key.size() + kReportItemOverhead;
    if (!chunk.empty() &&
        (chunk.size() >= max_items || chunk_bytes + item_bytes > options_.report_chunk_bytes)) {
      MC_RETURN_IF_ERROR(SendReportChunk(req, chunk, stats));
      chunk.clear();
      chunk_bytes = 0;
    }
    auto* item = req.add_items();
    item->set_key(o.key);
    item->set_generation(o.generation);
    item->set_size(o.size);
    item->set_checksum(o.checksum);
    item->set_segment_id(ids[e.local_index]);
    item->set_offset(e.offset);
    chunk.push_back(&e);
    chunk_bytes += item_bytes;
  }
  req.set_last(true);  // the final chunk, empty when there is nothing (left) to report
  MC_RETURN_IF_ERROR(SendReportChunk(req, chunk, stats));
  stats.elapsed_ms = RealClock::Get().NowMs() - start_ms;
  report_ms_->Set(stats.elapsed_ms);
  Logger("client").info(
      "object report for session {}: reported {}, kept {}, dropped {}, failed verification {}, "
      "in {} chunk(s), {} ms",
      session, stats.reported, stats.kept, stats.dropped, stats.verify_failed, stats.chunks,
      stats.elapsed_ms);
  absl::MutexLock lock(&stats_mu_);
  last_report_ = stats;
  return absl::OkStatus();
}

absl::Status MasterSession::SendReportChunk(v1::ReportObjectsRequest& req,
                                            const std::vector<const ObjectIndex::Entry*>& entries,
                                            ReportStats& stats) {
  v1::ReportObjectsResponse resp;
  absl::Status s = master_.ReportObjects(req, &resp);
  if (s.ok() && resp.results_size() != req.items_size()) {
    s = McError(Code::kInternal, absl::StrCat("the master answered ", resp.results_size(),
                                              " results for ", req.items_size(), " items"));
  }
  if (!s.ok()) return s;
  ++stats.chunks;
  stats.reported += entries.size();
  for (size_t i = 0; i < entries.size(); ++i) {
    const v1::Result& r = resp.results(static_cast<int>(i));
    if (r.code() == v1::OK) {
      ++stats.kept;
      report_kept_->Inc();
      continue;
    }
    ++stats.dropped;
    report_dropped_->Inc();
    index_->Erase(entries[i]->local_index, entries[i]->offset, entries[i]->object.generation);
  }
  req.clear_items();
  return absl::OkStatus();
}

absl::Status MasterSession::Start() {
  absl::Status s = Register();
  thread_.Start(registered_ ? heartbeat_ms_.load() : options_.retry_interval_ms);
  return s;
}

void MasterSession::Heartbeat() {
  for (int round = 0; round < std::max(options_.max_forget_rounds, 1); ++round) {
    v1::HeartbeatRequest req;
    req.set_client_id(options_.client_id);
    req.set_session(session_);
    if (disk_used_) req.set_disk_used(disk_used_());
    v1::HeartbeatResponse resp;
    const int64_t sent_ms = RealClock::Get().NowMs();
    absl::Status s = master_.Heartbeat(req, &resp);
    if (!s.ok()) {
      MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn, "heartbeat failed: {}",
                   s.ToString());
      return;
    }
    if (!resp.known()) {
      Logger("client").warn("the master no longer knows session {}; registering again",
                            session_.load());
      registered_ = false;
      return;
    }
    if (on_capability_info_) on_capability_info_({nullptr, resp.capability_clock_ms(), sent_ms});
    ApplyForgotten(resp);
    if (!resp.more_forgotten() || thread_.stopping()) return;
  }
}

void MasterSession::ApplyForgotten(const v1::HeartbeatResponse& resp) {
  if (index_ == nullptr) return;
  for (const v1::ReplicaRef& ref : resp.forgotten()) {
    // An id of another registration names nothing of ours now: ignored.
    std::optional<size_t> local = pool_.LocalIndexOf(ref.segment_id());
    if (!local.has_value()) continue;
    // With its generation, only that object's entry goes: a later object that reused the range
    // before this answer arrived keeps its entry. (0: a master that does not say; drop whatever
    // starts there.)
    const bool dropped = ref.generation() != 0
                             ? index_->Erase(*local, ref.offset(), ref.generation())
                             : index_->Forget(*local, ref.offset());
    if (dropped) {
      forgotten_count_.fetch_add(1);
      forgotten_counter_->Inc();
    }
  }
}

int64_t MasterSession::Round() {
  if (registered_) Heartbeat();
  if (!registered_) {
    absl::Status s = Register();
    if (!s.ok()) {
      MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn, "registration failed: {}",
                   s.ToString());
    }
  }
  return registered_ ? heartbeat_ms_.load() : options_.retry_interval_ms;
}

void MasterSession::Stop() {
  if (stopped_.exchange(true)) return;
  thread_.Stop();
  if (registered_) {
    v1::UnregisterClientRequest req;
    req.set_client_id(options_.client_id);
    req.set_session(session_);
    master_.UnregisterClient(req).IgnoreError();  // best effort: the TTL covers a failure
  }
}

}  // namespace mc::client
