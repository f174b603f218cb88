// VerbsDevice over libibverbs (built only when MC_WITH_RDMA).
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "transfer/rdma/verbs.h"

#if MC_WITH_RDMA
#include <infiniband/verbs.h>
#endif

namespace mc::transfer::rdma {

#if MC_WITH_RDMA
namespace {

absl::Status Errno(std::string_view what, int err) {
  return McError(Code::kUnavailable,
                 absl::StrCat("rdma: ", std::string(what), ": ", std::strerror(err)));
}

uint32_t MtuBytes(ibv_mtu mtu) { return 128u << static_cast<int>(mtu); }
ibv_mtu MtuEnum(uint32_t bytes) {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

class IbvDevice final : public VerbsDevice {
 public:
  ~IbvDevice() override {
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
    if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    if (ctx_ != nullptr) ibv_close_device(ctx_);
  }

  absl::Status Open(const std::string& name, int port, int gid_index) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr || n == 0) {
      if (list != nullptr) ibv_free_device_list(list);
      return McError(Code::kUnavailable, "rdma: no verbs device");
    }
    ibv_device* chosen = nullptr;
    for (int i = 0; i < n; ++i) {
      if (name.empty() || name == ibv_get_device_name(list[i])) {
        chosen = list[i];
        break;
      }
    }
    if (chosen == nullptr) {
      ibv_free_device_list(list);
      return McError(Code::kUnavailable, absl::StrCat("rdma: no verbs device named ", name));
    }
    attr_.name = ibv_get_device_name(chosen);
    ctx_ = ibv_open_device(chosen);
    ibv_free_device_list(list);
    if (ctx_ == nullptr) return Errno("ibv_open_device", errno);
    ibv_device_attr dev{};
    if (int rc = ibv_query_device(ctx_, &dev); rc != 0) return Errno("ibv_query_device", rc);
    ibv_port_attr pa{};
    if (int rc = ibv_query_port(ctx_, port, &pa); rc != 0) return Errno("ibv_query_port", rc);
    if (pa.state != IBV_PORT_ACTIVE) {
      return McError(Code::kUnavailable,
                     absl::StrCat("rdma: port ", port, " of ", attr_.name, " is not active"));
    }
    port_ = port;
    gid_index_ = gid_index;
    lid_ = pa.lid;
    if (int rc = ibv_query_gid(ctx_, port, gid_index, &gid_); rc != 0) {
      return Errno("ibv_query_gid", rc);
    }
    attr_.max_sge = std::max(1, std::min(dev.max_sge, 30));
    attr_.max_qp_wr = static_cast<uint32_t>(std::max(16, dev.max_qp_wr));
    attr_.max_cqe = static_cast<uint32_t>(std::max(16, dev.max_cqe));
    attr_.max_mr_size = dev.max_mr_size;
    attr_.active_mtu = MtuBytes(pa.active_mtu);
    pd_ = ibv_alloc_pd(ctx_);
    if (pd_ == nullptr) return Errno("ibv_alloc_pd", errno);
    channel_ = ibv_create_comp_channel(ctx_);
    if (channel_ == nullptr) return Errno("ibv_create_comp_channel", errno);
    const int cqe = static_cast<int>(std::min<uint32_t>(attr_.max_cqe, 65536));
    cq_ = ibv_create_cq(ctx_, cqe, nullptr, channel_, 0);
    if (cq_ == nullptr) return Errno("ibv_create_cq", errno);
    cq_size_ = static_cast<uint32_t>(cqe);
    return absl::OkStatus();
  }

  const DeviceAttributes& attributes() const override { return attr_; }

  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, uint64_t length,
                                              MemoryAccess access) override {
    const int flags =
        access == MemoryAccess::kRemote
            ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE
            : IBV_ACCESS_LOCAL_WRITE;  // an RDMA READ's sink needs local write
    ibv_mr* mr = ibv_reg_mr(pd_, base, length, flags);
    if (mr == nullptr) return Errno("ibv_reg_mr", errno);
    return MemoryRegion{reinterpret_cast<uint64_t>(base), length, mr->lkey, mr->rkey,
                        reinterpret_cast<uint64_t>(mr)};
  }
  absl::StatusOr<MemoryRegion> RegisterDmaBuf(int fd, uint64_t offset, uint64_t length,
                                              uint64_t iova, MemoryAccess access) override {
    const int flags =
        access == MemoryAccess::kRemote
            ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE
            : IBV_ACCESS_LOCAL_WRITE;
    ibv_mr* mr = ibv_reg_dmabuf_mr(pd_, offset, length, iova, fd, flags);
    if (mr == nullptr) return Errno("ibv_reg_dmabuf_mr", errno);
    return MemoryRegion{iova, length, mr->lkey, mr->rkey, reinterpret_cast<uint64_t>(mr)};
  }
  void DeregisterMemory(const MemoryRegion& region) override {
    ibv_dereg_mr(reinterpret_cast<ibv_mr*>(region.handle));
  }

  absl::StatusOr<QueuePair> CreateQp(uint32_t max_send_wr) override {
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = max_send_wr;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = attr_.max_sge;
    init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd_, &init);
    if (qp == nullptr) return Errno("ibv_create_qp", errno);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = static_cast<uint8_t>(port_);
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    if (int rc = ibv_modify_qp(
            qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        rc != 0) {
      ibv_destroy_qp(qp);
      return Errno("ibv_modify_qp(INIT)", rc);
    }
    return QueuePair{qp->qp_num, reinterpret_cast<uint64_t>(qp)};
  }

  QpAddress LocalAddress(const QueuePair& qp) override {
    QpAddress a;
    std::memcpy(a.gid.data(), gid_.raw, 16);
    a.lid = lid_;
    a.qpn = qp.qpn;
    a.psn = qp.qpn & 0xffffff;  // any 24-bit value; distinct per QP
    a.mtu = attr_.active_mtu;
    return a;
  }

  absl::Status ConnectQp(const QueuePair& q, const QpAddress& remote) override {
    ibv_qp* qp = reinterpret_cast<ibv_qp*>(q.handle);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = MtuEnum(std::min(remote.mtu, attr_.active_mtu));
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn & 0xffffff;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = static_cast<uint8_t>(port_);
    a.ah_attr.dlid = remote.lid;
    bool have_gid = false;
    for (uint8_t b : remote.gid) have_gid |= b != 0;
    if (have_gid) {
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index_);
      a.ah_attr.grh.hop_limit = 64;
    }
    if (int rc =
            ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        rc != 0) {
      return Errno("ibv_modify_qp(RTR)", rc);
    }
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTS;
    r.sq_psn = q.qpn & 0xffffff;
    r.timeout = 14;
    r.retry_cnt = 7;
    r.rnr_retry = 7;
    r.max_rd_atomic = 16;
    if (int rc = ibv_modify_qp(qp, &r,
                               IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
        rc != 0) {
      return Errno("ibv_modify_qp(RTS)", rc);
    }
    return absl::OkStatus();
  }

  absl::Status ModifyToError(const QueuePair& q) override {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (int rc = ibv_modify_qp(reinterpret_cast<ibv_qp*>(q.handle), &a, IBV_QP_STATE); rc != 0) {
      return Errno("ibv_modify_qp(ERR)", rc);
    }
    return absl::OkStatus();
  }

  void DestroyQp(const QueuePair& q) override {
    ibv_destroy_qp(reinterpret_cast<ibv_qp*>(q.handle));
  }

  absl::Status PostSend(const QueuePair& q, std::span<const SendWorkRequest> wrs,
                        size_t* posted) override {
    *posted = 0;
    if (wrs.empty()) return absl::OkStatus();
    std::vector<ibv_send_wr> chain(wrs.size());
    std::vector<ibv_sge> sges;
    size_t total_sge = 0;
    for (const SendWorkRequest& w : wrs) total_sge += w.sg.size();
    sges.resize(total_sge);
    size_t s = 0;
    for (size_t i = 0; i < wrs.size(); ++i) {
      const SendWorkRequest& w = wrs[i];
      ibv_send_wr& out = chain[i];
      out.wr_id = w.wr_id;
      out.next = i + 1 < wrs.size() ? &chain[i + 1] : nullptr;
      out.sg_list = &sges[s];
      out.num_sge = static_cast<int>(w.sg.size());
      for (const ScatterGather& g : w.sg) sges[s++] = {g.addr, g.length, g.lkey};
      out.opcode = w.opcode == WrOpcode::kRdmaRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      out.send_flags = w.signaled ? IBV_SEND_SIGNALED : 0;
      out.wr.rdma.remote_addr = w.remote_addr;
      out.wr.rdma.rkey = w.rkey;
    }
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(reinterpret_cast<ibv_qp*>(q.handle), chain.data(), &bad);
    if (rc == 0) {
      *posted = wrs.size();
      return absl::OkStatus();
    }
    *posted = bad == nullptr ? 0 : static_cast<size_t>(bad - chain.data());
    return Errno("ibv_post_send", rc);
  }

  int PollCq(std::span<WorkCompletion> out) override {
    ibv_wc wc[64];
    const int want = static_cast<int>(std::min<size_t>(out.size(), 64));
    const int n = ibv_poll_cq(cq_, want, wc);
    for (int i = 0; i < n; ++i) {
      out[i].wr_id = wc[i].wr_id;
      out[i].qpn = wc[i].qp_num;
      out[i].success = wc[i].status == IBV_WC_SUCCESS;
      out[i].vendor_status = static_cast<int>(wc[i].status);
      out[i].error = out[i].success ? "" : ibv_wc_status_str(wc[i].status);
    }
    return n < 0 ? 0 : n;
  }

  void ArmCq() override { ibv_req_notify_cq(cq_, 0); }

  void WaitCq(int timeout_ms) override {
    pollfd p{channel_->fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return;
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    if (ibv_get_cq_event(channel_, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
  }

 private:
  DeviceAttributes attr_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  uint32_t cq_size_ = 0;
  int port_ = 1;
  int gid_index_ = 0;
  uint16_t lid_ = 0;
  ibv_gid gid_{};
};

}  // namespace

absl::StatusOr<std::unique_ptr<VerbsDevice>> OpenVerbsDevice(const std::string& name, int port,
                                                             int gid_index) {
  auto device = std::make_unique<IbvDevice>();
  if (absl::Status s = device->Open(name, port, gid_index); !s.ok()) return s;
  return std::unique_ptr<VerbsDevice>(std::move(device));
}

#else

absl::StatusOr<std::unique_ptr<VerbsDevice>> OpenVerbsDevice(const std::string&, int, int) {
  return McError(Code::kUnavailable, "rdma: built without libibverbs");
}

#endif

}  // namespace mc::transfer::rdma
