#include "client/tier/offload_driver.h"

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/status.h"
#include "proto/status_convert.h"

namespace mc::client {

namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("offload");
  return log;
}

Counter& OffloadCounter(MetricsRegistry& m, const char* result) {
  return m.GetCounter("mc_client_offloads_total", "OFFLOAD tasks run, by result",
                      {{"result", result}});
}

// A RemoveDiskReplicas request for `records` of this client's SSD tier; `corrupt`: they failed
// verification (the master drops them), else they are reclaim candidates (it answers which may
// go).
v1::RemoveDiskReplicasRequest RemoveRequest(const std::string& client_id,
                                            const std::vector<offload::DiskTierVictim>& records,
                                            bool corrupt) {
  v1::RemoveDiskReplicasRequest req;
  req.set_client_id(client_id);
  req.set_corrupt(corrupt);
  for (const auto& v : records) {
    auto* item = req.add_items();
    item->set_key(v.key);
    item->set_generation(v.generation);
    item->set_locator(v.locator);
    item->set_length(v.length);
  }
  return req;
}

Counter& DiskReadCounter(MetricsRegistry& m, const char* result) {
  return m.GetCounter("mc_client_disk_reads_total", "SSD records read for readers, by result",
                      {{"result", result}});
}

}  // namespace

uint32_t DiskKeyTag(std::string_view key) {
  return static_cast<uint32_t>(Checksum(key.data(), key.size()));
}

OffloadDriver::OffloadDriver(OffloadDriverOptions options, offload::DiskTier& tier,
                             MasterClient& master, transfer::SegmentTable& segments,
                             std::function<uint64_t()> session, MetricsRegistry& metrics)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : RealClock::Get()),
      tier_(tier),
      master_(master),
      segments_(segments),
      session_(std::move(session)),
      offloads_ok_(OffloadCounter(metrics, "ok")),
      offloads_changed_(OffloadCounter(metrics, "changed")),
      offloads_failed_(OffloadCounter(metrics, "failed")),
      offloads_gone_(OffloadCounter(metrics, "gone")),
      offloads_no_space_(OffloadCounter(metrics, "no_space")),
      drops_(metrics.GetCounter("mc_client_disk_drops_total", "Records deleted on DROP tasks")),
      reports_(metrics.GetCounter("mc_client_disk_records_reported_total",
                                  "Records re-reported to the master after registration")),
      disk_reads_served_(DiskReadCounter(metrics, "ok")),
      disk_read_failures_(DiskReadCounter(metrics, "error")),
      corrupt_dropped_(metrics.GetCounter(
          "mc_client_disk_corrupt_dropped_total",
          "SSD records that failed verification when read, reported to the master and deleted")),
      // While the master has work for us, take the next tasks at once (bursts), else wait a poll.
      thread_(clock_, [this] { return RunOnce() ? 0 : options_.poll_interval_ms; }) {
  for (const auto& e : tier_.List()) Remember(e.key, e.generation, e.ref.length);
}

OffloadDriver::~OffloadDriver() { Stop(); }

void OffloadDriver::Start() { thread_.Start(options_.poll_interval_ms); }

void OffloadDriver::Stop() { thread_.Stop(); }

void OffloadDriver::Remember(const std::string& key, uint64_t generation, uint64_t length) {
  absl::MutexLock lock(&keys_mu_);
  keys_[generation] = KnownRecord{key, length};
}

void OffloadDriver::Forget(uint64_t generation) {
  absl::MutexLock lock(&keys_mu_);
  keys_.erase(generation);
}

bool OffloadDriver::RunOnce() {
  uint64_t session = session_();
  if (session == 0) return false;
  for (const auto& e : tier_.TakeEvicted()) Forget(e.generation);
  if (report_pending_.exchange(false)) ReportAll();
  DropCorrupt();
  v1::TakeOffloadTasksRequest req;
  req.set_client_id(options_.client_id);
  req.set_session(session);
  req.set_max_tasks(options_.max_tasks_per_poll);
  v1::TakeOffloadTasksResponse resp;
  absl::Status s = master_.TakeOffloadTasks(req, &resp);
  if (!s.ok()) {
    MC_LOG_EVERY(std::chrono::seconds(10), Log(), warn, "TakeOffloadTasks failed: {}",
                 s.ToString());
    return false;
  }
  std::vector<v1::OffloadTask> tasks;
  {
    absl::MutexLock lock(&retry_mu_);
    tasks.swap(retry_drops_);
  }
  tasks.insert(tasks.end(), resp.tasks().begin(), resp.tasks().end());
  if (!tasks.empty()) RunTasks(tasks);
  return resp.tasks_size() > 0;
}

void OffloadDriver::ReportAll() {
  std::vector<offload::DiskTier::Entry> entries = tier_.List();
  for (size_t begin = 0; begin < entries.size(); begin += options_.report_batch) {
    size_t end = std::min(entries.size(), begin + options_.report_batch);
    v1::AddDiskReplicasRequest req;
    req.set_client_id(options_.client_id);
    req.set_recovered(true);
    for (size_t i = begin; i < end; ++i) {
      auto* item = req.add_items();
      item->set_key(entries[i].key);
      item->set_generation(entries[i].generation);
      item->set_locator(entries[i].ref.locator);
      item->set_length(entries[i].ref.length);
      item->set_checksum(entries[i].checksum);
    }
    v1::AddDiskReplicasResponse resp;
    absl::Status s = master_.AddDiskReplicas(req, &resp);
    if (!s.ok() || resp.results_size() != req.items_size()) {
      Log().warn("reporting {} record(s) to the master failed: {}; will retry", req.items_size(),
                 s.ToString());
      report_pending_ = true;
      return;
    }
    for (int i = 0; i < resp.results_size(); ++i) {
      const auto& r = resp.results(i);
      const auto& e = entries[begin + i];
      if (r.code() == v1::OK) continue;
      // The master knows a newer generation of the key (or nothing consistent): drop ours.
      Log().info("record {} generation {} refused by the master ({}): deleting it",
                 KeyForLog(e.key), e.generation, r.message());
      if (tier_.Remove(e.key, e.generation).ok()) Forget(e.generation);
    }
    reports_.Inc(req.items_size());
  }
  if (!entries.empty()) Log().info("reported {} SSD record(s) to the master", entries.size());
}

absl::Status OffloadDriver::Offload(const v1::OffloadTask& task, v1::DiskReplicaItem* item) {
  absl::StatusOr<char*> mem = segments_.Resolve(task.segment_id(), task.offset(), task.size());
  if (!mem.ok()) return mem.status();
  // Straight from the segment: the tier hashes the bytes as it stages them and writes the record
  // only if that hash (of exactly what goes to disk) is the object's checksum, so a replica
  // evicted and overwritten meanwhile is never persisted (kChecksumMismatch: "changed").
  absl::StatusOr<offload::RecordRef> ref =
      tier_.Write(task.key(), task.generation(), {{*mem, task.size()}}, task.checksum());
  if (!ref.ok()) return ref.status();
  Remember(task.key(), task.generation(), ref->length);
  item->set_key(task.key());
  item->set_generation(task.generation());
  item->set_locator(ref->locator);
  item->set_length(ref->length);
  item->set_checksum(task.checksum());
  return absl::OkStatus();
}

void OffloadDriver::RunTasks(const std::vector<v1::OffloadTask>& tasks) {
  std::vector<const v1::OffloadTask*> offloads;
  for (const v1::OffloadTask& task : tasks) {
    if (task.kind() != v1::DROP) {
      offloads.push_back(&task);
      continue;
    }
    absl::Status s = tier_.Remove(task.key(), task.generation());
    if (s.ok() || ToCode(s) == Code::kNotFound) {
      Forget(task.generation());
      drops_.Inc();
    } else {
      // Being read (pinned) or written: try again on the next poll, so it cannot come back.
      Log().info("dropping record {} generation {} later: {}", KeyForLog(task.key()),
                 task.generation(), s.ToString());
      absl::MutexLock lock(&retry_mu_);
      retry_drops_.push_back(task);
    }
  }
  if (!offloads.empty()) RunOffloads(offloads);
}

void OffloadDriver::RunOffloads(const std::vector<const v1::OffloadTask*>& tasks) {
  // `parallelism` workers take tasks in order; whichever worker completes the
  // `task_report_batch`-th record since the last report (or the last record) reports them while
  // the others keep the disk busy: memory is released while the burst is still being written.
  const size_t step = std::max<size_t>(1, options_.task_report_batch);
  std::atomic<size_t> next{0};
  absl::Mutex done_mu;
  std::vector<OffloadResult> done;
  size_t finished = 0;
  auto work = [&] {
    for (size_t k = next++; k < tasks.size(); k = next++) {
      OffloadResult r{tasks[k], {}, {}};
      r.status = Offload(*tasks[k], &r.item);
      std::vector<OffloadResult> batch;
      {
        absl::MutexLock lock(&done_mu);
        done.push_back(std::move(r));
        ++finished;
        if (done.size() >= step || finished == tasks.size()) batch.swap(done);
      }
      if (!batch.empty()) Report(batch);
    }
  };
  const size_t threads =
      std::min(tasks.size(), static_cast<size_t>(std::max(1, options_.parallelism)));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
}

void OffloadDriver::Report(std::vector<OffloadResult>& results) {
  v1::AddDiskReplicasRequest report;
  report.set_client_id(options_.client_id);
  for (OffloadResult& r : results) {
    const Code code = ToCode(r.status);
    if (r.status.ok()) {
      *report.add_items() = std::move(r.item);
    } else if (code == Code::kChecksumMismatch || code == Code::kNotFound ||
               code == Code::kInvalidArgument) {
      offloads_changed_.Inc();  // evicted or re-registered meanwhile: nothing to persist
    } else {
      // The tier cannot take it (full of records it may not reclaim, or failing): tell the master
      // so the object's memory is not held for a write-back that is not coming.
      (code == Code::kNoSpace ? offloads_no_space_ : offloads_failed_).Inc();
      MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn, "offload of {} failed: {}",
                   KeyForLog(r.task->key()), r.status.ToString());
      auto* failed = report.add_failed();
      failed->set_key(r.task->key());
      failed->set_generation(r.task->generation());
    }
  }
  if (report.items_size() == 0 && report.failed_size() == 0) return;
  v1::AddDiskReplicasResponse resp;
  absl::Status s = master_.AddDiskReplicas(report, &resp);
  if (!s.ok() || resp.results_size() != report.items_size()) {
    // The records stay; the next registration's report (or a later task) tells the master.
    Log().warn("reporting {} offloaded record(s) failed: {}", report.items_size(), s.ToString());
    offloads_failed_.Inc(report.items_size());
    return;
  }
  for (int i = 0; i < resp.results_size(); ++i) {
    const auto& item = report.items(i);
    if (resp.results(i).code() == v1::OK) {
      offloads_ok_.Inc();
      continue;
    }
    offloads_gone_.Inc();  // removed or superseded while we wrote it
    if (tier_.Remove(item.key(), item.generation()).ok()) Forget(item.generation());
  }
}

std::vector<bool> OffloadDriver::MayReclaim(const std::vector<offload::DiskTierVictim>& victims) {
  std::vector<bool> allowed(victims.size(), false);
  if (session_() == 0) return allowed;
  if (clock_.NowMs() < reclaim_blocked_until_ms_.load()) return allowed;
  const v1::RemoveDiskReplicasRequest req =
      RemoveRequest(options_.client_id, victims, /*corrupt=*/false);
  v1::RemoveDiskReplicasResponse resp;
  absl::Status s = master_.RemoveDiskReplicas(req, &resp);
  if (!s.ok()) {
    reclaim_blocked_until_ms_ = clock_.NowMs() + options_.reclaim_backoff_ms;
    MC_LOG_EVERY(std::chrono::seconds(10), Log(), warn,
                 "cannot ask the master before reclaiming SSD records: {}; no reclaim for {} ms",
                 s.ToString(), options_.reclaim_backoff_ms);
    return allowed;
  }
  if (resp.results_size() != req.items_size()) return allowed;
  for (size_t i = 0; i < victims.size(); ++i) {
    allowed[i] = resp.results(static_cast<int>(i)).code() == v1::OK;
    if (allowed[i]) Forget(victims[i].generation);
  }
  return allowed;
}

absl::Status OffloadDriver::ReadLocal(std::string_view key, uint64_t generation, uint64_t locator,
                                      uint64_t length,
                                      const std::vector<transfer::LocalBuffer>& dst,
                                      uint64_t* checksum) {
  std::vector<std::pair<char*, uint64_t>> pieces;
  for (const auto& b : dst) pieces.emplace_back(b.data, b.length);
  absl::Status s =
      tier_.Read(offload::RecordRef{locator, length}, key, generation, pieces, checksum);
  (s.ok() ? disk_reads_served_ : disk_read_failures_).Inc();
  if (ToCode(s) == Code::kChecksumMismatch) {
    Log().error("SSD record {} generation {} failed verification: {}; dropping it", KeyForLog(key),
                generation, std::string(s.message()));
    {
      absl::MutexLock lock(&retry_mu_);
      corrupt_.push_back({std::string(key), generation, locator, length});
    }
    thread_.WakeNow();  // dropped by the driver's thread, now
  }
  return s;
}

void OffloadDriver::DropCorrupt() {
  std::vector<offload::DiskTierVictim> corrupt;
  {
    absl::MutexLock lock(&retry_mu_);
    corrupt.swap(corrupt_);
  }
  // Confirm first, into private memory: a local reader's verdict covers its own destination,
  // which its application could have changed under the read; only the record itself counts.
  std::erase_if(corrupt, [&](const offload::DiskTierVictim& v) {
    std::unique_ptr<char[]> buffer(new (std::nothrow) char[std::max<uint64_t>(v.length, 1)]);
    if (!buffer) return false;  // cannot check: trust the verdict
    absl::Status again = tier_.Read(offload::RecordRef{v.locator, v.length}, v.key, v.generation,
                                    {{buffer.get(), v.length}});
    if (ToCode(again) == Code::kChecksumMismatch) return false;
    Log().info("SSD record {} generation {} verifies again ({}): kept", KeyForLog(v.key),
               v.generation, again.ToString());
    return true;
  });
  if (corrupt.empty()) return;
  const v1::RemoveDiskReplicasRequest req =
      RemoveRequest(options_.client_id, corrupt, /*corrupt=*/true);
  v1::RemoveDiskReplicasResponse resp;
  absl::Status s = master_.RemoveDiskReplicas(req, &resp);
  std::vector<offload::DiskTierVictim> again;
  if (!s.ok() || resp.results_size() != req.items_size()) {
    MC_LOG_EVERY(std::chrono::seconds(10), Log(), warn,
                 "cannot report corrupt SSD records to the master: {}; will retry", s.ToString());
    again = std::move(corrupt);
  } else {
    for (const auto& v : corrupt) {
      absl::Status r = tier_.Remove(v.key, v.generation);
      if (r.ok() || ToCode(r) == Code::kNotFound) {
        if (r.ok()) corrupt_dropped_.Inc();
        Forget(v.generation);
      } else {
        again.push_back(v);  // still being read: next poll
      }
    }
  }
  if (!again.empty()) {
    absl::MutexLock lock(&retry_mu_);
    corrupt_.insert(corrupt_.end(), again.begin(), again.end());
  }
}

absl::Status OffloadDriver::ServeReadDisk(const transfer::DataRequest& request,
                                          transfer::RequestStream& stream) {
  std::string key;
  uint64_t length = 0;
  {
    absl::MutexLock lock(&keys_mu_);
    auto it = keys_.find(request.segment_id);
    if (it != keys_.end()) {
      key = it->second.key;
      length = it->second.length;
    }
  }
  if (key.empty() || DiskKeyTag(key) != request.key_tag) {
    disk_read_failures_.Inc();
    return stream.Respond(Code::kNotFound);
  }
  // Checked before the buffer is allocated: a request's length is the peer's word (up to the
  // frame limit), the record's is ours.
  if (request.length != length) {
    disk_read_failures_.Inc();
    return stream.Respond(Code::kSizeMismatch);
  }
  std::unique_ptr<char[]> buffer(new (std::nothrow) char[request.length]);
  if (!buffer) return stream.Respond(Code::kNoSpace);
  absl::Status s = ReadLocal(key, request.segment_id, request.offset, request.length,
                             {{buffer.get(), request.length}}, /*checksum=*/nullptr);
  if (!s.ok()) return stream.Respond(ToCode(s));
  iovec payload{buffer.get(), request.length};
  return stream.Respond(Code::kOk, {&payload, 1});
}

}  // namespace mc::client
