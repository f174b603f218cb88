#include "client/master_session.h"

#include "common/clock.h"
#include "common/logging.h"

namespace mc::client {

MasterSession::MasterSession(MasterSessionOptions options, MasterClient& master,
                             SegmentPool& pool, transfer::SegmentTable& table)
    : options_(std::move(options)), master_(master), pool_(pool), table_(table) {}

MasterSession::~MasterSession() { Stop(); }

absl::Status MasterSession::Register() {
  v1::RegisterClientRequest req;
  req.set_client_id(options_.client_id);
  req.set_host(options_.host);
  req.set_data_endpoint(options_.data_endpoint);
  req.set_disk_capacity(options_.disk_capacity);
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
  registered_ = true;
  ++registrations_;
  Logger("client").info("registered with the master as {} (session {}, {} segment(s))",
                        options_.client_id, resp.session(), ids.size());
  if (on_registered_) on_registered_();
  return absl::OkStatus();
}

absl::Status MasterSession::Start() {
  absl::Status s = Register();
  thread_ = std::thread([this] { Loop(); });
  return s;
}

void MasterSession::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    int64_t wait = registered_ ? heartbeat_ms_.load() : options_.retry_interval_ms;
    cv_.wait_for(lock, std::chrono::milliseconds(wait));
    if (stopping_) break;
    lock.unlock();
    if (registered_) {
      v1::HeartbeatRequest req;
      req.set_client_id(options_.client_id);
      req.set_session(session_);
      if (disk_used_) req.set_disk_used(disk_used_());
      v1::HeartbeatResponse resp;
      const int64_t sent_ms = RealClock::Get().NowMs();
      absl::Status s = master_.Heartbeat(req, &resp);
      if (s.ok() && resp.known() && on_capability_info_) {
        on_capability_info_({nullptr, resp.capability_clock_ms(), sent_ms});
      }
      if (s.ok() && !resp.known()) {
        Logger("client").warn("the master no longer knows session {}; registering again",
                              session_.load());
        registered_ = false;
      } else if (!s.ok()) {
        MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn, "heartbeat failed: {}",
                     s.ToString());
      }
    }
    if (!registered_) {
      absl::Status s = Register();
      if (!s.ok()) {
        MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn,
                     "registration failed: {}", s.ToString());
      }
    }
    lock.lock();
  }
}

void MasterSession::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (registered_) {
    v1::UnregisterClientRequest req;
    req.set_client_id(options_.client_id);
    req.set_session(session_);
    master_.UnregisterClient(req).IgnoreError();  // best effort: the TTL covers a failure
  }
}

}  // namespace mc::client
