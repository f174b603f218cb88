// A fake verbs layer (the seam of transfer/rdma/verbs.h) for unit tests of the rdma transport.
// Devices created on one FakeVerbsNetwork reach each other's memory regions: a WR moves bytes
// with memcpy between the local SGEs and the remote range named by (remote_addr, rkey), both
// checked against registered regions (the remote one must have remote access, as with ibv_mr
// access flags: a local-only region's rkey fails the WR with a remote access error). By default a
// WR executes when it is posted; on command the device holds WRs (executed later by Release), fails
// the n-th WR posted from now (earlier WRs of its chain move their bytes, later ones are flushed: a
// partial completion), forces a QP into ERROR, reorders pending completions across queue pairs, or
// ignores ModifyToError. Semantics kept from RC verbs: per-QP in-order execution; a completion on
// success only for signalled WRs; an error completion for the failed WR and a flush completion for
// every later WR of that QP (signalled or not); a QP in ERROR flushes whatever is posted to it.
// Thread-safe.
#pragma once

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "transfer/rdma/verbs.h"

namespace mc::transfer::rdma {

class FakeVerbsNetwork {
 public:
  struct Region {
    uint64_t addr;
    uint64_t length;
    bool remote;
  };
  uint32_t AddRegion(uint64_t addr, uint64_t length, bool remote = true) {
    absl::MutexLock lock(&mu_);
    const uint32_t key = next_key_++;
    regions_[key] = {addr, length, remote};
    return key;
  }
  void RemoveRegion(uint32_t key) {
    absl::MutexLock lock(&mu_);
    regions_.erase(key);
  }
  // The range [addr, addr+length) when it lies inside region `key` (one with remote access,
  // with `remote`).
  bool Check(uint32_t key, uint64_t addr, uint64_t length, bool remote = false) {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(key);
    if (it == regions_.end()) return false;
    const Region& r = it->second;
    if (remote && !r.remote) return false;
    return addr >= r.addr && length <= r.length && addr - r.addr <= r.length - length;
  }
  uint32_t NextQpn() {
    absl::MutexLock lock(&mu_);
    return next_qpn_++;
  }

 private:
  absl::Mutex mu_;
  uint32_t next_key_ = 0x100;
  uint32_t next_qpn_ = 0x40;
  std::map<uint32_t, Region> regions_ ABSL_GUARDED_BY(mu_);
};

// A small device ("fake0": 4 SGEs, 64 work requests per queue pair).
inline DeviceAttributes SmallFakeDeviceAttributes() {
  DeviceAttributes a;
  a.name = "fake0";
  a.max_sge = 4;
  a.max_qp_wr = 64;
  return a;
}

class FakeVerbsDevice final : public VerbsDevice {
 public:
  static constexpr int kFlushStatus = 5;          // IBV_WC_WR_FLUSH_ERR
  static constexpr int kRemoteAccessStatus = 10;  // IBV_WC_REM_ACCESS_ERR

  FakeVerbsDevice(FakeVerbsNetwork& network, DeviceAttributes attributes)
      : network_(network), attributes_(std::move(attributes)) {}

  // --- commands ---
  void SetHold(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_ = hold;
  }
  // The n-th WR posted from now on (0 = the next) fails with `status` when it executes.
  void FailNthWr(uint64_t n, int status = 12 /* IBV_WC_RETRY_EXC_ERR */) {
    absl::MutexLock lock(&mu_);
    fail_at_ = posted_ + n;
    fail_status_ = status;
  }
  // Executes up to `count` held WRs of `qpn` (all QPs when qpn is 0), in per-QP order; with
  // `reverse`, the queue pairs are taken from the highest QPN down, so completions of QPs
  // arrive in the opposite order of their posting.
  void Release(uint32_t qpn = 0, size_t count = SIZE_MAX, bool reverse = false) {
    absl::MutexLock lock(&mu_);
    std::vector<uint32_t> order;
    for (auto& [n, qp] : qps_) order.push_back(n);
    if (reverse) std::reverse(order.begin(), order.end());
    for (uint32_t n : order) {
      Qp& qp = qps_[n];
      if (qpn != 0 && n != qpn) continue;
      size_t done = 0;
      while (!qp.held.empty() && done < count) {
        Held h = std::move(qp.held.front());
        qp.held.pop_front();
        ExecuteLocked(n, qp, h);
        ++done;
      }
    }
    cv_.SignalAll();
  }
  void ForceQpError(uint32_t qpn) {
    absl::MutexLock lock(&mu_);
    auto it = qps_.find(qpn);
    if (it != qps_.end()) ToErrorLocked(it->first, it->second);
    cv_.SignalAll();
  }
  // Reverses the order of pending completions across queue pairs (per-QP order kept).
  void ReorderPendingCompletions() {
    absl::MutexLock lock(&mu_);
    std::stable_sort(cq_.begin(), cq_.end(), [](const WorkCompletion& a, const WorkCompletion& b) {
      return a.qpn > b.qpn;
    });
  }
  void SetIgnoreModifyToError(bool ignore) {
    absl::MutexLock lock(&mu_);
    ignore_modify_to_error_ = ignore;
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    size_t n = 0;
    for (auto& [qpn, qp] : qps_) n += qp.held.size();
    return n;
  }
  uint64_t wrs_posted() {
    absl::MutexLock lock(&mu_);
    return posted_;
  }
  uint64_t signaled_posted() {
    absl::MutexLock lock(&mu_);
    return signaled_;
  }
  uint32_t max_sge_seen() {
    absl::MutexLock lock(&mu_);
    return max_sge_seen_;
  }
  size_t live_qps() {
    absl::MutexLock lock(&mu_);
    return qps_.size();
  }
  size_t live_regions() {
    absl::MutexLock lock(&mu_);
    return regions_;
  }
  // RegisterDmaBuf answers `error` from now on (OK again: it registers).
  void FailDmaBuf(absl::Status error) {
    absl::MutexLock lock(&mu_);
    dmabuf_error_ = std::move(error);
  }
  size_t dmabuf_regions() {
    absl::MutexLock lock(&mu_);
    return dmabuf_regions_;
  }
  uint64_t destroyed_with_held() {
    absl::MutexLock lock(&mu_);
    return destroyed_with_held_;
  }

  // --- VerbsDevice ---
  const DeviceAttributes& attributes() const override { return attributes_; }
  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, uint64_t length,
                                              MemoryAccess access) override {
    const uint64_t addr = reinterpret_cast<uint64_t>(base);
    const uint32_t key = network_.AddRegion(addr, length, access == MemoryAccess::kRemote);
    absl::MutexLock lock(&mu_);
    ++regions_;
    return MemoryRegion{addr, length, key, key, key};
  }
  // The fake's "dma-buf" is any open fd; its bytes are the host memory at `iova` (the fake CUDA
  // device's memory is host memory at its device addresses).
  absl::StatusOr<MemoryRegion> RegisterDmaBuf(int fd, uint64_t offset, uint64_t length,
                                              uint64_t iova, MemoryAccess access) override {
    {
      absl::MutexLock lock(&mu_);
      if (!dmabuf_error_.ok()) return dmabuf_error_;
    }
    if (fd < 0 || fcntl(fd, F_GETFD) < 0 || offset != 0 || length == 0) {
      return McError(Code::kInvalidArgument, "ibv_reg_dmabuf_mr: Invalid argument (fake)");
    }
    const uint32_t key = network_.AddRegion(iova, length, access == MemoryAccess::kRemote);
    absl::MutexLock lock(&mu_);
    ++regions_;
    ++dmabuf_regions_;
    dmabuf_keys_.push_back(key);
    return MemoryRegion{iova, length, key, key, key};
  }
  void DeregisterMemory(const MemoryRegion& region) override {
    network_.RemoveRegion(region.lkey);
    absl::MutexLock lock(&mu_);
    --regions_;
    auto it = std::find(dmabuf_keys_.begin(), dmabuf_keys_.end(), region.lkey);
    if (it != dmabuf_keys_.end()) {
      dmabuf_keys_.erase(it);
      --dmabuf_regions_;
    }
  }
  absl::StatusOr<QueuePair> CreateQp(uint32_t max_send_wr) override {
    const uint32_t qpn = network_.NextQpn();
    absl::MutexLock lock(&mu_);
    qps_[qpn].depth = max_send_wr;
    return QueuePair{qpn, qpn};
  }
  QpAddress LocalAddress(const QueuePair& qp) override {
    QpAddress a;
    a.gid[15] = 1;
    a.qpn = qp.qpn;
    a.psn = qp.qpn;
    a.mtu = attributes_.active_mtu;
    return a;
  }
  absl::Status ConnectQp(const QueuePair& qp, const QpAddress& remote) override {
    absl::MutexLock lock(&mu_);
    auto it = qps_.find(qp.qpn);
    if (it == qps_.end()) return McError(Code::kInternal, "fake verbs: unknown qp");
    it->second.connected = true;
    it->second.remote_qpn = remote.qpn;
    return absl::OkStatus();
  }
  absl::Status ModifyToError(const QueuePair& qp) override {
    absl::MutexLock lock(&mu_);
    if (ignore_modify_to_error_) return absl::OkStatus();
    auto it = qps_.find(qp.qpn);
    if (it != qps_.end()) ToErrorLocked(it->first, it->second);
    cv_.SignalAll();
    return absl::OkStatus();
  }
  void DestroyQp(const QueuePair& qp) override {
    absl::MutexLock lock(&mu_);
    auto it = qps_.find(qp.qpn);
    if (it == qps_.end()) return;
    destroyed_with_held_ += it->second.held.size();  // dropped: they never move a byte
    qps_.erase(it);
  }
  absl::Status PostSend(const QueuePair& q, std::span<const SendWorkRequest> wrs,
                        size_t* posted) override {
    absl::MutexLock lock(&mu_);
    *posted = 0;
    auto it = qps_.find(q.qpn);
    if (it == qps_.end()) return McError(Code::kInternal, "fake verbs: unknown qp");
    Qp& qp = it->second;
    for (const SendWorkRequest& w : wrs) {
      if (w.sg.size() > attributes_.max_sge) {
        return McError(Code::kInvalidArgument, "fake verbs: too many SGEs");
      }
      Held h{w, posted_ == fail_at_};
      ++posted_;
      if (w.signaled) ++signaled_;
      max_sge_seen_ = std::max<uint32_t>(max_sge_seen_, static_cast<uint32_t>(w.sg.size()));
      ++*posted;
      if (qp.error) {
        Flush(q.qpn, w.wr_id);
      } else if (hold_) {
        qp.held.push_back(std::move(h));
      } else {
        ExecuteLocked(q.qpn, qp, h);
      }
    }
    cv_.SignalAll();
    return absl::OkStatus();
  }
  int PollCq(std::span<WorkCompletion> out) override {
    absl::MutexLock lock(&mu_);
    size_t n = 0;
    while (n < out.size() && !cq_.empty()) {
      out[n++] = std::move(cq_.front());
      cq_.pop_front();
    }
    return static_cast<int>(n);
  }
  void ArmCq() override {}
  void WaitCq(int timeout_ms) override {
    absl::MutexLock lock(&mu_);
    if (cq_.empty()) cv_.WaitWithTimeout(&mu_, absl::Milliseconds(timeout_ms));
  }

 private:
  struct Held {
    SendWorkRequest wr;
    bool fail;
  };
  struct Qp {
    uint32_t depth = 0;
    bool connected = false;
    bool error = false;
    uint32_t remote_qpn = 0;
    std::deque<Held> held;
  };

  void Flush(uint32_t qpn, uint64_t wr_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    cq_.push_back({wr_id, qpn, false, kFlushStatus, "WR flushed"});
  }
  void ToErrorLocked(uint32_t qpn, Qp& qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    qp.error = true;
    for (const Held& h : qp.held) Flush(qpn, h.wr.wr_id);
    qp.held.clear();
  }
  void ExecuteLocked(uint32_t qpn, Qp& qp, const Held& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const SendWorkRequest& w = h.wr;
    if (qp.error) {
      Flush(qpn, w.wr_id);
      return;
    }
    int status = h.fail ? fail_status_ : 0;
    if (status == 0 && !qp.connected) status = 12;
    uint64_t remote = w.remote_addr;
    uint64_t total = 0;
    for (const ScatterGather& g : w.sg) total += g.length;
    if (status == 0) {
      bool ok = network_.Check(w.rkey, remote, total, /*remote=*/true);
      for (const ScatterGather& g : w.sg) ok = ok && network_.Check(g.lkey, g.addr, g.length);
      if (!ok) status = kRemoteAccessStatus;
    }
    if (status == 0) {
      for (const ScatterGather& g : w.sg) {
        char* local = reinterpret_cast<char*>(g.addr);
        char* far = reinterpret_cast<char*>(remote);
        if (w.opcode == WrOpcode::kRdmaRead) {
          std::memcpy(local, far, g.length);
        } else {
          std::memcpy(far, local, g.length);
        }
        remote += g.length;
      }
      if (w.signaled) cq_.push_back({w.wr_id, qpn, true, 0, ""});
      return;
    }
    cq_.push_back({w.wr_id, qpn, false, status, "fake verbs: work request failed"});
    ToErrorLocked(qpn, qp);
  }

  FakeVerbsNetwork& network_;
  const DeviceAttributes attributes_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<uint32_t, Qp> qps_ ABSL_GUARDED_BY(mu_);
  std::deque<WorkCompletion> cq_ ABSL_GUARDED_BY(mu_);
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  bool ignore_modify_to_error_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t posted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t signaled_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fail_at_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  int fail_status_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t max_sge_seen_ ABSL_GUARDED_BY(mu_) = 0;
  size_t regions_ ABSL_GUARDED_BY(mu_) = 0;
  size_t dmabuf_regions_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> dmabuf_keys_ ABSL_GUARDED_BY(mu_);
  absl::Status dmabuf_error_ ABSL_GUARDED_BY(mu_);
  uint64_t destroyed_with_held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mc::transfer::rdma
