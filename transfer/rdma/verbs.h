// The verbs seam: the few ibverbs calls the rdma transport makes, behind an interface so that
// unit tests run the transport against tests/fakes/fake_verbs.h (which completes, fails,
// reorders and partially completes work requests on command) and production runs it over
// libibverbs (verbs_ibv.cc, built only when MC_WITH_RDMA).
//
// One VerbsDevice is one opened device port with one protection domain and one completion
// queue (with its completion channel) shared by all its queue pairs. Only reliable-connected
// (RC) queue pairs, only one-sided READ/WRITE work requests: READ_DISK stays two-sided over tcp,
// so no receive queue is ever posted to.
// Thread-safety: PostSend/ModifyToError/CreateQp/DestroyQp/RegisterMemory may be called from
// any thread; PollCq and WaitCq belong to the one completion thread of the device.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transfer/memory_access.h"

namespace mc::transfer::rdma {

struct DeviceAttributes {
  std::string name;            // "mlx5_0", "rxe0", ...
  uint32_t max_sge = 1;        // scatter/gather entries per send work request
  uint32_t max_qp_wr = 16;     // work requests per send queue
  uint32_t max_cqe = 1024;     // completion queue entries
  uint64_t max_mr_size = 0;    // bytes one memory region may cover
  uint32_t active_mtu = 1024;  // path MTU of the port, in bytes (256 .. 4096)
};

// What a peer needs to connect its RC queue pair to ours (exchanged at connection setup).
struct QpAddress {
  std::array<uint8_t, 16> gid{};  // RoCE: the port's GID at the configured index
  uint16_t lid = 0;               // InfiniBand: the port's LID (0 on RoCE)
  uint32_t qpn = 0;
  uint32_t psn = 0;     // initial packet sequence number
  uint32_t mtu = 1024;  // the sender's active MTU; both sides use the smaller
};

struct MemoryRegion {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  uint64_t handle = 0;  // implementation's identity of the region (ibv_mr*)
};

struct ScatterGather {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

enum class WrOpcode : uint8_t { kRdmaRead, kRdmaWrite };

struct SendWorkRequest {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kRdmaRead;
  std::vector<ScatterGather> sg;  // at most DeviceAttributes::max_sge entries
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  bool signaled = false;  // a completion is generated on success only when set
};

struct WorkCompletion {
  uint64_t wr_id = 0;
  uint32_t qpn = 0;
  bool success = false;
  int vendor_status = 0;  // ibv_wc_status (0 = success, 5 = flushed)
  std::string error;      // human-readable status when !success
};

// An RC queue pair of the device; the handle stays valid until DestroyQp.
struct QueuePair {
  uint32_t qpn = 0;
  uint64_t handle = 0;
};

class VerbsDevice {
 public:
  virtual ~VerbsDevice() = default;
  virtual const DeviceAttributes& attributes() const = 0;

  // kLocal: local write only (no remote READ/WRITE through the region's rkey); kRemote: also
  // remote READ and WRITE.
  virtual absl::StatusOr<MemoryRegion> RegisterMemory(void* base, uint64_t length,
                                                      MemoryAccess access) = 0;
  // Memory another driver exported as a dma-buf (GPU memory: GPUDirect RDMA), bytes [offset,
  // offset + length) of `fd`, addressed in work requests as [iova, iova + length) (the device
  // address, so that a local buffer names it as it names host memory). The fd may be closed
  // once this returned. Released with DeregisterMemory.
  virtual absl::StatusOr<MemoryRegion> RegisterDmaBuf(int fd, uint64_t offset, uint64_t length,
                                                      uint64_t iova, MemoryAccess access) = 0;
  virtual void DeregisterMemory(const MemoryRegion& region) = 0;

  // A new RC queue pair on the device's CQ, in INIT (send queue of `max_send_wr` entries).
  virtual absl::StatusOr<QueuePair> CreateQp(uint32_t max_send_wr) = 0;
  // This side's half of the connection (GID, LID, QPN, PSN, MTU).
  virtual QpAddress LocalAddress(const QueuePair& qp) = 0;
  // INIT -> RTR -> RTS towards `remote`.
  virtual absl::Status ConnectQp(const QueuePair& qp, const QpAddress& remote) = 0;
  // Moves the QP to ERROR: the hardware stops and every outstanding WR completes as flushed.
  virtual absl::Status ModifyToError(const QueuePair& qp) = 0;
  // After it returns, the hardware touches no memory on behalf of the QP any more.
  virtual void DestroyQp(const QueuePair& qp) = 0;

  // Posts a chain of work requests (one ibv_post_send). On error, none or a prefix was posted:
  // `*posted` says how many.
  virtual absl::Status PostSend(const QueuePair& qp, std::span<const SendWorkRequest> wrs,
                                size_t* posted) = 0;

  // Completion thread only. Non-blocking: up to out.size() completions, returns how many.
  virtual int PollCq(std::span<WorkCompletion> out) = 0;
  // Completion thread only. Arms the CQ's completion channel for the next completion; the
  // caller polls once more before WaitCq so that none that raced the arming is missed.
  virtual void ArmCq() = 0;
  // Completion thread only. Waits up to `timeout_ms` for the armed event (returns early on one).
  virtual void WaitCq(int timeout_ms) = 0;
};

// The first usable device (or the one named `name`), port `port`, GID index `gid_index`.
// Built only with MC_WITH_RDMA; otherwise kUnavailable.
absl::StatusOr<std::unique_ptr<VerbsDevice>> OpenVerbsDevice(const std::string& name, int port,
                                                             int gid_index);

}  // namespace mc::transfer::rdma
