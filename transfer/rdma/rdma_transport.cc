#include "transfer/rdma/rdma_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "transfer/rdma/handshake.h"

namespace mc::transfer::rdma {

namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("rdma");
  return log;
}

constexpr uint64_t kMaxSgeBytes = 1ull << 31;  // an SGE length is 32 bits; stay well inside

int64_t NowMs() {
  static RealClock clock;
  return clock.NowMs();
}

}  // namespace

// The requests of one Submit call. Completions reach it through Posted entries.
struct RdmaTransport::Batch {
  struct Req {
    absl::Status status;
    uint64_t bytes = 0;        // bytes of WRs that completed successfully
    uint32_t outstanding = 0;  // WRs posted and not completed
    bool all_posted = false;   // no more WRs will be posted for it
    bool done = false;
  };
  absl::Mutex mu;
  absl::CondVar cv;
  std::vector<Req> reqs ABSL_GUARDED_BY(mu);
  size_t pending ABSL_GUARDED_BY(mu) = 0;  // requests not done

  void MaybeFinish(Req& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!r.done && r.outstanding == 0 && (r.all_posted || !r.status.ok())) {
      r.done = true;
      r.all_posted = true;
      --pending;
      cv.SignalAll();
    }
  }
  // One WR of request `i` completed (`status` OK or its error).
  void Complete(size_t i, uint64_t bytes, const absl::Status& status) {
    absl::MutexLock lock(&mu);
    Req& r = reqs[i];
    --r.outstanding;
    if (status.ok()) {
      r.bytes += bytes;
    } else if (r.status.ok()) {
      r.status = status;
    }
    MaybeFinish(r);
  }
};

namespace {
struct Posted {
  uint64_t wr_id;
  std::shared_ptr<void> batch_owner;  // keeps the batch alive while the WR is posted
  void* batch;
  size_t index;
  uint64_t bytes;
};
}  // namespace

struct RdmaTransport::Qp {
  QueuePair qp;
  std::atomic<bool> broken{false};
  std::atomic<bool> retired{false};
  int64_t retired_at_ms = 0;  // guarded by the transport's qps_mu_
  absl::Mutex mu;
  std::deque<Posted> inflight ABSL_GUARDED_BY(mu);  // in post order
};

struct RdmaTransport::Peer {
  std::vector<std::shared_ptr<Qp>> qps;
  absl::flat_hash_map<uint64_t, RemoteSegment> segments;
  size_t next = 0;
};

// One request turned into work requests on one queue pair.
struct RdmaTransport::RequestPlan {
  size_t position;  // index into Submit's requests/results
  std::shared_ptr<Qp> qp;
  std::vector<SendWorkRequest> wrs;
  std::vector<uint64_t> wr_bytes;
  size_t next = 0;  // first WR not posted yet
};

RdmaTransport::RdmaTransport(RdmaTransportOptions options, std::unique_ptr<VerbsDevice> device,
                             RdmaConnector& connector)
    : options_(std::move(options)), device_(std::move(device)), connector_(connector) {
  depth_ =
      std::max<uint32_t>(2, std::min(options_.send_queue_depth, device_->attributes().max_qp_wr));
  completion_thread_ = std::thread([this] { CompletionLoop(); });
}

RdmaTransport::~RdmaTransport() {
  stop_.store(true);
  completion_thread_.join();
  absl::MutexLock peers(&peers_mu_);
  absl::MutexLock qps(&qps_mu_);
  for (auto& [qpn, qp] : by_qpn_) device_->DestroyQp(qp->qp);
  for (auto& [remote, qp] : accepted_) device_->DestroyQp(qp);
  absl::MutexLock mrs(&mr_mu_);
  for (auto& [addr, region] : local_mrs_) device_->DeregisterMemory(region.mr);
  for (auto& [id, mr] : exported_) device_->DeregisterMemory(mr);
}

absl::StatusOr<PeerHandshake> RdmaTransport::Accept(std::span<const QpAddress> remote,
                                                    std::span<const uint32_t> retired) {
  PeerHandshake out;
  std::vector<QueuePair> created;
  absl::Status failure;
  for (const QpAddress& r : remote) {
    absl::StatusOr<QueuePair> qp = device_->CreateQp(depth_);
    if (!qp.ok()) {
      failure = qp.status();
      break;
    }
    created.push_back(*qp);
    if (absl::Status s = device_->ConnectQp(*qp, r); !s.ok()) {
      failure = s;
      break;
    }
    out.qps.push_back(device_->LocalAddress(*qp));
  }
  if (!failure.ok()) {
    for (const QueuePair& qp : created) device_->DestroyQp(qp);
    return failure;
  }
  {
    absl::MutexLock lock(&qps_mu_);
    for (uint32_t qpn : retired) {
      auto it = accepted_.find(qpn);
      if (it == accepted_.end()) continue;
      device_->DestroyQp(it->second);
      accepted_.erase(it);
    }
    for (size_t i = 0; i < created.size(); ++i) {
      auto [it, inserted] = accepted_.try_emplace(remote[i].qpn, created[i]);
      if (!inserted) {  // the peer reused a QPN: its old QP is gone
        device_->DestroyQp(it->second);
        it->second = created[i];
      }
    }
  }
  absl::MutexLock lock(&mr_mu_);
  for (const auto& [id, mr] : exported_) out.segments[id] = {mr.addr, mr.length, mr.rkey};
  if (served_table_ != nullptr) {
    for (const SegmentTable::Entry& e : served_table_->List()) {
      // Only remote-access regions: a local-only one (an application buffer) is never served.
      const LocalRegion* region = FindLocal(e.base, e.size, false);
      if (region == nullptr || region->access != MemoryAccess::kRemote) continue;
      out.segments.try_emplace(
          e.segment_id, RemoteSegment{reinterpret_cast<uint64_t>(e.base), e.size, region->mr.rkey});
    }
  }
  return out;
}

bool RdmaTransport::Claims(const TransferRequest& request) {
  // SSD records and index notices are two-sided: tcp (transfer/data_server.h says why).
  if (AsSegmentRange(request) == nullptr || !LocalBuffersRegistered(request)) return false;
  return options_.no_fallback || PeerReachable(request.endpoint);
}

absl::Status RdmaTransport::ServeDataOp(const DataRequest& request, RequestStream& stream) {
  if (request.op != DataOp::kRdmaConnect) return RefuseDataOp(request, stream);
  return ServeRdmaConnect(*this, request, stream);
}

bool RdmaTransport::PeerReachable(const std::string& endpoint) {
  absl::MutexLock lock(&peers_mu_);
  auto it = peers_.find(endpoint);
  if (it != peers_.end() && !it->second->qps.empty()) return true;
  auto bad = unreachable_.find(endpoint);
  const int64_t now = NowMs();
  if (bad != unreachable_.end() && now - bad->second < options_.retry_unreachable_ms) {
    return false;
  }
  auto peer = std::make_unique<Peer>();
  if (absl::Status s = ConnectPeer(*peer, endpoint); !s.ok()) {
    Log().info("rdma: peer {} not reachable over rdma ({}); using tcp", endpoint, s.ToString());
    unreachable_[endpoint] = now;
    return false;
  }
  unreachable_.erase(endpoint);
  peers_[endpoint] = std::move(peer);
  return true;
}

absl::Status RdmaTransport::ConnectPeer(Peer& peer, const std::string& endpoint) {
  std::vector<QueuePair> created;
  std::vector<QpAddress> addresses;
  auto destroy_created = [&] {
    for (const QueuePair& qp : created) device_->DestroyQp(qp);
  };
  for (int i = 0; i < std::max(1, options_.qps_per_peer); ++i) {
    absl::StatusOr<QueuePair> qp = device_->CreateQp(depth_);
    if (!qp.ok()) {
      destroy_created();
      return qp.status();
    }
    created.push_back(*qp);
    addresses.push_back(device_->LocalAddress(*qp));
  }
  absl::StatusOr<PeerHandshake> hs = connector_.Connect(endpoint, addresses, {});
  if (!hs.ok() || hs->qps.size() != created.size()) {
    destroy_created();
    return hs.ok() ? McError(Code::kTransferFailed, "rdma: peer answered a wrong QP count")
                   : hs.status();
  }
  for (size_t i = 0; i < created.size(); ++i) {
    if (absl::Status s = device_->ConnectQp(created[i], hs->qps[i]); !s.ok()) {
      destroy_created();
      return s;
    }
  }
  peer.segments = std::move(hs->segments);
  absl::MutexLock lock(&qps_mu_);
  for (const QueuePair& q : created) {
    auto qp = std::make_shared<Qp>();
    qp->qp = q;
    by_qpn_[q.qpn] = qp;
    peer.qps.push_back(std::move(qp));
  }
  qps_created_.fetch_add(created.size());
  return absl::OkStatus();
}

void RdmaTransport::RetireQp(const std::shared_ptr<Qp>& qp) {
  qp->broken.store(true);
  if (qp->retired.exchange(true)) return;
  device_->ModifyToError(qp->qp).IgnoreError();  // flushes what it still carries, if anything
  absl::MutexLock lock(&qps_mu_);
  qp->retired_at_ms = NowMs();
  retiring_.push_back(qp);
}

absl::StatusOr<std::shared_ptr<RdmaTransport::Qp>> RdmaTransport::PickQp(
    const std::string& endpoint, RemoteSegment* segment, uint64_t segment_id) {
  absl::MutexLock lock(&peers_mu_);
  std::unique_ptr<Peer>& peer = peers_[endpoint];
  if (peer == nullptr) peer = std::make_unique<Peer>();
  if (peer->qps.empty()) {
    if (absl::Status s = ConnectPeer(*peer, endpoint); !s.ok()) {
      peers_.erase(endpoint);
      return McError(Code::kTransferFailed,
                     absl::StrCat("rdma: connecting to ", endpoint, ": ", s.message()));
    }
  }
  auto seg = peer->segments.find(segment_id);
  if (seg == peer->segments.end()) {  // exported after we connected? ask again once
    absl::StatusOr<PeerHandshake> hs = connector_.Connect(endpoint, {}, {});
    if (hs.ok()) peer->segments = std::move(hs->segments);
    seg = peer->segments.find(segment_id);
    if (seg == peer->segments.end()) {
      return McError(Code::kNotFound,
                     absl::StrCat("rdma: segment ", segment_id, " not exported by ", endpoint));
    }
  }
  *segment = seg->second;
  const size_t slot = peer->next++ % peer->qps.size();
  std::shared_ptr<Qp> qp = peer->qps[slot];
  if (!qp->broken.load()) return qp;
  // Re-establish: a fresh QP replaces the broken one, which is drained and destroyed.
  RetireQp(qp);
  absl::StatusOr<QueuePair> fresh = device_->CreateQp(depth_);
  if (!fresh.ok()) return fresh.status();
  const QpAddress local = device_->LocalAddress(*fresh);
  const uint32_t retired = qp->qp.qpn;
  absl::StatusOr<PeerHandshake> hs = connector_.Connect(
      endpoint, std::span<const QpAddress>(&local, 1), std::span<const uint32_t>(&retired, 1));
  absl::Status s = hs.ok() ? (hs->qps.size() == 1 ? device_->ConnectQp(*fresh, hs->qps[0])
                                                  : McError(Code::kTransferFailed,
                                                            "rdma: peer answered a wrong QP count"))
                           : hs.status();
  if (!s.ok()) {
    device_->DestroyQp(*fresh);
    return McError(Code::kTransferFailed, absl::StrCat("rdma: re-establishing a queue pair to ",
                                                       endpoint, ": ", s.message()));
  }
  peer->segments = std::move(hs->segments);
  auto replacement = std::make_shared<Qp>();
  replacement->qp = *fresh;
  {
    absl::MutexLock q(&qps_mu_);
    by_qpn_[fresh->qpn] = replacement;
  }
  qps_created_.fetch_add(1);
  peer->qps[slot] = replacement;
  Log().info("rdma: queue pair {} to {} re-established as {}", retired, endpoint, fresh->qpn);
  seg = peer->segments.find(segment_id);
  if (seg == peer->segments.end()) {
    return McError(Code::kNotFound,
                   absl::StrCat("rdma: segment ", segment_id, " not exported by ", endpoint));
  }
  *segment = seg->second;
  return replacement;
}

void RdmaTransport::Drain(Qp& qp, uint64_t wr_id, const absl::Status& error, bool all) {
  absl::MutexLock lock(&qp.mu);
  if (!all) {
    const bool known = std::any_of(qp.inflight.begin(), qp.inflight.end(),
                                   [&](const Posted& p) { return p.wr_id == wr_id; });
    if (!known) return;  // already drained (e.g. completed through a later signalled WR)
  }
  while (!qp.inflight.empty()) {
    Posted p = std::move(qp.inflight.front());
    qp.inflight.pop_front();
    const bool named = p.wr_id == wr_id;
    // In-order completion: WRs before the named one completed successfully.
    static_cast<Batch*>(p.batch)->Complete(p.index, p.bytes,
                                           (all || named) ? error : absl::OkStatus());
    if (named && !all) break;
  }
}

void RdmaTransport::HandleCompletion(const WorkCompletion& wc) {
  std::shared_ptr<Qp> qp;
  {
    absl::MutexLock lock(&qps_mu_);
    auto it = by_qpn_.find(wc.qpn);
    if (it == by_qpn_.end()) return;  // a destroyed QP's late completion
    qp = it->second;
  }
  if (wc.success) {
    Drain(*qp, wc.wr_id, absl::OkStatus(), false);
    return;
  }
  if (!qp->broken.exchange(true)) {
    Log().warn("rdma: queue pair {} failed: {} (status {})", wc.qpn, wc.error, wc.vendor_status);
    device_->ModifyToError(qp->qp).IgnoreError();
  }
  Drain(*qp, wc.wr_id,
        McError(Code::kTransferFailed,
                absl::StrCat("rdma: work request failed on queue pair ", wc.qpn, ": ", wc.error)),
        false);
}

void RdmaTransport::DestroyDrained() {
  std::vector<std::shared_ptr<Qp>> destroy;
  const int64_t now = NowMs();
  {
    absl::MutexLock lock(&qps_mu_);
    for (auto it = retiring_.begin(); it != retiring_.end();) {
      bool empty;
      {
        absl::MutexLock q(&(*it)->mu);
        empty = (*it)->inflight.empty();
      }
      if (empty || now - (*it)->retired_at_ms >= options_.flush_grace_ms) {
        destroy.push_back(*it);
        by_qpn_.erase((*it)->qp.qpn);
        it = retiring_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const std::shared_ptr<Qp>& qp : destroy) {
    device_->DestroyQp(qp->qp);  // no DMA on its behalf after this
    Drain(*qp, 0,
          McError(Code::kTransferFailed, "rdma: queue pair destroyed before its work completed"),
          true);
  }
}

void RdmaTransport::CompletionLoop() {
  std::vector<WorkCompletion> wcs(64);
  int idle = 0;
  bool armed = false;
  while (!stop_.load(std::memory_order_relaxed)) {
    const int n = device_->PollCq(wcs);
    for (int i = 0; i < n; ++i) HandleCompletion(wcs[i]);
    if (n > 0) {
      idle = 0;
      continue;
    }
    if (++idle % 256 == 0) DestroyDrained();
    if (idle < options_.busy_poll_iterations) continue;
    if (!armed) {  // arm, then poll once more before sleeping (a completion may have raced)
      device_->ArmCq();
      armed = true;
      continue;
    }
    DestroyDrained();
    device_->WaitCq(options_.event_wait_ms);
    armed = false;
  }
}

void RdmaTransport::Submit(std::span<const TransferRequest* const> requests,
                           std::span<TransferResult> results, int64_t deadline_ms) {
  auto batch = std::make_shared<Batch>();
  std::vector<RequestPlan> plans;
  const DeviceAttributes& attr = device_->attributes();
  const uint64_t wr_limit = std::max<uint64_t>(1, std::min(options_.max_wr_bytes, kMaxSgeBytes));
  const uint32_t max_sge = std::max<uint32_t>(1, attr.max_sge);

  // Plan: resolve segment and local keys, cut the request into WRs. The local regions stay
  // held until every WR of this call ended (UnpinLocal at the end).
  std::vector<uint64_t> held;
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& request = *requests[i];
    TransferResult& result = results[i];
    const uint64_t total = TotalLength(request);
    const SegmentRange* range = AsSegmentRange(request);
    if (range == nullptr) {
      result.status = McError(Code::kInvalidArgument,
                              "rdma: SSD records and index notices are served over tcp");
      continue;
    }
    if (total == 0) continue;
    RemoteSegment segment;
    absl::StatusOr<std::shared_ptr<Qp>> qp = PickQp(request.endpoint, &segment, range->segment_id);
    if (!qp.ok()) {
      result.status = qp.status();
      continue;
    }
    if (range->offset > segment.length || total > segment.length - range->offset) {
      result.status =
          McError(Code::kInvalidArgument, absl::StrCat("rdma: range [", range->offset, ", +", total,
                                                       ") outside segment ", range->segment_id));
      continue;
    }
    RequestPlan plan;
    plan.position = i;
    plan.qp = *std::move(qp);
    absl::Status bad;
    uint64_t remote = segment.addr + range->offset;
    SendWorkRequest wr;
    uint64_t wr_bytes = 0;
    auto flush_wr = [&] {
      if (wr.sg.empty()) return;
      wr.opcode =
          request.direction == Direction::kRead ? WrOpcode::kRdmaRead : WrOpcode::kRdmaWrite;
      wr.rkey = segment.rkey;
      wr.remote_addr = remote;
      remote += wr_bytes;
      plan.wrs.push_back(std::move(wr));
      plan.wr_bytes.push_back(wr_bytes);
      wr = SendWorkRequest();
      wr_bytes = 0;
    };
    for (const LocalBuffer& b : request.local) {
      if (b.length == 0) continue;
      absl::StatusOr<uint32_t> lkey = PinLocal(b.data, b.length, &held);
      if (!lkey.ok()) {
        bad = lkey.status();
        break;
      }
      uint64_t done = 0;
      while (done < b.length) {
        if (wr.sg.size() == max_sge || wr_bytes == wr_limit) flush_wr();
        const uint64_t piece = std::min(b.length - done, wr_limit - wr_bytes);
        wr.sg.push_back(
            {reinterpret_cast<uint64_t>(b.data + done), static_cast<uint32_t>(piece), *lkey});
        wr_bytes += piece;
        done += piece;
      }
    }
    flush_wr();
    if (!bad.ok()) {
      result.status = bad;
      continue;
    }
    plans.push_back(std::move(plan));
  }
  {
    absl::MutexLock lock(&batch->mu);
    batch->reqs.resize(plans.size());
    batch->pending = plans.size();
  }

  // Post: chains of at most the free send-queue slots, the last WR of each chain signalled.
  auto deadline_passed = [&] { return deadline_ms > 0 && NowMs() >= deadline_ms; };
  for (;;) {
    bool blocked = false;
    bool posted_any = false;
    for (size_t k = 0; k < plans.size() && !deadline_passed(); ++k) {
      RequestPlan& plan = plans[k];
      if (plan.next == plan.wrs.size()) continue;
      Qp& qp = *plan.qp;
      absl::MutexLock qlock(&qp.mu);
      size_t n = 0;
      {
        absl::MutexLock block(&batch->mu);
        Batch::Req& r = batch->reqs[k];
        if (r.status.ok() && qp.broken.load()) {
          r.status = McError(Code::kTransferFailed, "rdma: queue pair failed");
        }
        if (!r.status.ok()) {
          plan.next = plan.wrs.size();
          r.all_posted = true;
          batch->MaybeFinish(r);
          continue;
        }
        const size_t space = depth_ > qp.inflight.size() ? depth_ - qp.inflight.size() : 0;
        n = std::min(space, plan.wrs.size() - plan.next);
        if (n == 0) {
          blocked = true;
          continue;
        }
        r.outstanding += n;
        if (plan.next + n == plan.wrs.size()) r.all_posted = true;
      }
      std::span<SendWorkRequest> chain(plan.wrs.data() + plan.next, n);
      for (size_t j = 0; j < n; ++j) {
        chain[j].wr_id = next_wr_id_.fetch_add(1);
        chain[j].signaled = j + 1 == n;
        qp.inflight.push_back(
            {chain[j].wr_id, batch, batch.get(), k, plan.wr_bytes[plan.next + j]});
      }
      size_t posted = 0;
      absl::Status s = device_->PostSend(qp.qp, chain, &posted);
      if (!s.ok()) {
        qp.broken.store(true);
        const absl::Status error = McError(
            Code::kTransferFailed, absl::StrCat("rdma: posting work requests: ", s.message()));
        for (size_t j = posted; j < n; ++j) {
          qp.inflight.pop_back();
          batch->Complete(k, 0, error);
        }
        // The posted prefix ends unsignalled: move the QP to ERROR so it is flushed.
        if (posted > 0) device_->ModifyToError(qp.qp).IgnoreError();
        plan.next = plan.wrs.size();
      } else {
        plan.next += n;
        if (plan.next < plan.wrs.size()) blocked = true;  // the rest waits for free slots
      }
      posted_any = true;
    }
    if (deadline_passed() || !blocked) break;
    if (!posted_any) {
      absl::MutexLock lock(&batch->mu);
      batch->cv.WaitWithTimeout(&batch->mu, absl::Milliseconds(1));
    }
  }

  // Wait for every request, then at the deadline stop the QPs that still carry ours.
  {
    absl::MutexLock lock(&batch->mu);
    while (batch->pending > 0) {
      if (deadline_ms > 0) {
        const int64_t left = deadline_ms - NowMs();
        if (left <= 0) break;
        batch->cv.WaitWithTimeout(&batch->mu, absl::Milliseconds(left));
      } else {
        batch->cv.Wait(&batch->mu);
      }
    }
  }
  std::vector<std::shared_ptr<Qp>> stop;
  {
    absl::MutexLock lock(&batch->mu);
    for (size_t k = 0; k < plans.size(); ++k) {
      Batch::Req& r = batch->reqs[k];
      if (r.done) continue;
      r.status = DeadlineError();
      r.all_posted = true;
      plans[k].next = plans[k].wrs.size();
      batch->MaybeFinish(r);
      if (!r.done) stop.push_back(plans[k].qp);
    }
  }
  for (const std::shared_ptr<Qp>& qp : stop) RetireQp(qp);  // flushed, then destroyed
  {
    absl::MutexLock lock(&batch->mu);
    while (batch->pending > 0) batch->cv.Wait(&batch->mu);
  }

  UnpinLocal(held);  // no WR of this call is outstanding any more

  absl::MutexLock lock(&batch->mu);
  for (size_t k = 0; k < plans.size(); ++k) {
    const TransferRequest& request = *requests[plans[k].position];
    TransferResult& result = results[plans[k].position];
    const Batch::Req& r = batch->reqs[k];
    result.bytes = r.bytes;
    const uint64_t total = TotalLength(request);
    if (r.status.ok() && r.bytes != total) {
      result.status = McError(Code::kTransferFailed,
                              absl::StrCat("rdma: short transfer: ", r.bytes, " of ", total));
    } else {
      result.status = r.status;
    }
    if (result.status.ok() && request.proof == Proof::kDeliveredBytes) {
      StreamingChecksum sum;
      for (const LocalBuffer& b : request.local) sum.Update(b.data, b.length);
      result.checksum = sum.Digest();
    }
  }
}

}  // namespace mc::transfer::rdma
