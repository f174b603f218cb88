// GPUDirect RDMA in the cuda transport, on the fake CUDA device and fake verbs: a GPU range
// registered with the NIC through a dma-buf receives remote memory replicas straight from the
// rdma transport (no device copy, no host staging), the writes are flushed to the device and
// the destination is hashed there; whatever cannot go that way is refused loudly, never OK
// without the device hash; the modes off/auto/on decide what an unusable NIC means.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/metrics.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_cuda.h"
#include "tests/fakes/fake_verbs.h"
#include "tests/fakes/in_process_rdma_connector.h"
#include "transfer/cuda/cuda_transport.h"
#include "transfer/rdma/rdma_transport.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer::cuda {
namespace {

using rdma::FakeVerbsDevice;
using rdma::FakeVerbsNetwork;
using rdma::InProcessRdmaConnector;
using rdma::RdmaTransport;
using rdma::SmallFakeDeviceAttributes;

constexpr char kSelf[] = "10.0.0.1:7000";
constexpr char kPeer[] = "10.0.0.2:7000";
constexpr char kNoRdmaPeer[] = "10.0.0.3:7000";
constexpr uint64_t kSegment = 9;
constexpr uint64_t kGpuBytes = 1 << 20;

class CudaRdmaDirect : public ::testing::Test {
 protected:
  void SetUp() override { Start("auto"); }

  void Start(const std::string& mode) {
    engine_.reset();
    server_.reset();
    remote_.assign(2 << 20, 0);
    for (size_t i = 0; i < remote_.size(); ++i) remote_[i] = static_cast<char>(i * 11 + i / 509);
    server_ = std::make_unique<RdmaTransport>(
        rdma::RdmaTransportOptions{},
        std::make_unique<FakeVerbsDevice>(network_, SmallFakeDeviceAttributes()), no_peers_);
    ASSERT_TRUE(server_->ExportSegment(kSegment, remote_.data(), remote_.size()).ok());
    connector_ = std::make_unique<InProcessRdmaConnector>();
    connector_->AddPeer(kPeer, server_.get());

    TransferEngineOptions o;
    o.local_endpoint = kSelf;
    o.metrics = &metrics_;
    o.rdma.device_factory = [this] {
      auto d = std::make_unique<FakeVerbsDevice>(network_, SmallFakeDeviceAttributes());
      verbs_ = d.get();
      return d;
    };
    o.rdma.connector = connector_.get();
    o.cuda.device = 0;
    o.cuda.gpu_direct_rdma = mode;
    o.cuda.api_factory = [this] {
      auto api = std::make_unique<FakeCudaApi>();
      fake_ = api.get();
      return api;
    };
    engine_ = std::make_unique<TransferEngine>(o, table_);
    ASSERT_NE(engine_->gpu(), nullptr) << engine_->status();
    gpu_ = fake_->AllocDevice(kGpuBytes);
    cuda().AddDeviceRange(Addr(gpu_), kGpuBytes);
  }

  GpuTransfers& cuda() { return *engine_->gpu(); }
  static uint64_t Addr(const char* p) { return reinterpret_cast<uint64_t>(p); }

  TransferRequest Read(char* local, uint64_t length, uint64_t offset,
                       const std::string& endpoint = kPeer) {
    TransferRequest r;
    r.direction = Direction::kRead;
    r.local = {LocalBuffer{local, length}};
    r.endpoint = endpoint;
    r.target = SegmentRange{kSegment, offset};
    r.proof = Proof::kDeliveredBytes;
    return r;
  }
  TransferResult Submit(TransferRequest r) {
    return engine_->Submit(std::vector<TransferRequest>{std::move(r)})[0];
  }
  uint64_t DirectBytes() {
    return metrics_.GetCounter("mc_gpu_direct_rdma_bytes_total", "").Value();
  }
  int64_t DirectRegions() { return metrics_.GetGauge("mc_gpu_direct_rdma_regions", "").Value(); }

  FakeVerbsNetwork network_;
  InProcessRdmaConnector no_peers_;  // none added: Connect answers UNAVAILABLE
  std::unique_ptr<InProcessRdmaConnector> connector_;
  std::vector<char> remote_;
  std::unique_ptr<RdmaTransport> server_;
  SegmentTable table_;
  MetricsRegistry metrics_;
  std::unique_ptr<TransferEngine> engine_;
  FakeVerbsDevice* verbs_ = nullptr;
  FakeCudaApi* fake_ = nullptr;
  char* gpu_ = nullptr;
};

TEST_F(CudaRdmaDirect, RegisteredGpuMemoryReceivesRemoteReplicasProvedByTheDeviceHash) {
  absl::StatusOr<bool> registered = cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_TRUE(*registered);
  EXPECT_EQ(fake_->dmabuf_exports(), 1u);
  EXPECT_EQ(verbs_->dmabuf_regions(), 1u);
  EXPECT_EQ(DirectRegions(), 1);
  EXPECT_TRUE(cuda().CanReadDirect(kPeer, gpu_ + 4096, 65536));

  const uint64_t hashes = fake_->hash_launches();
  TransferResult r = Submit(Read(gpu_ + 4096, 65536, 12345));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, 65536u);
  EXPECT_EQ(std::memcmp(gpu_ + 4096, remote_.data() + 12345, 65536), 0);
  ASSERT_TRUE(r.checksum.has_value());
  EXPECT_EQ(*r.checksum, Checksum(remote_.data() + 12345, 65536));
  EXPECT_EQ(fake_->copies(), 0u) << "the NIC wrote the bytes, no device copy";
  EXPECT_EQ(fake_->hash_launches(), hashes + 1) << "hashed on the device";
  EXPECT_EQ(fake_->rdma_flushes(), 1u) << "flushed before the hash";
  EXPECT_EQ(cuda().direct_reads(), 1u);
  EXPECT_EQ(DirectBytes(), 65536);

  cuda().UnregisterRdmaDirect(Addr(gpu_));
  EXPECT_EQ(verbs_->dmabuf_regions(), 0u);
  EXPECT_EQ(DirectRegions(), 0);
  EXPECT_FALSE(cuda().CanReadDirect(kPeer, gpu_ + 4096, 65536));
  r = Submit(Read(gpu_, 4096, 0));
  EXPECT_EQ(ToCode(r.status), Code::kTransferFailed);
  EXPECT_NE(r.status.message().find("GPUDirect RDMA"), std::string::npos);
}

TEST_F(CudaRdmaDirect, RegisteredGpuMemoryIsWrittenToRemoteReplicasAndItsSourceHashedAfter) {
  ASSERT_TRUE(cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes).value_or(false));
  for (uint64_t i = 0; i < 40000; ++i) gpu_[8192 + i] = static_cast<char>(i * 13 + 5);
  EXPECT_TRUE(cuda().CanWriteDirect(kPeer, gpu_ + 8192, 40000));
  const uint64_t hashes = fake_->hash_launches();
  TransferRequest write = Read(gpu_ + 8192, 40000, 777);
  write.direction = Direction::kWrite;
  write.proof = Proof::kWrittenReplica;
  TransferResult r = Submit(write);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, 40000u);
  EXPECT_EQ(std::memcmp(remote_.data() + 777, gpu_ + 8192, 40000), 0);
  EXPECT_EQ(r.checksum, Checksum(gpu_ + 8192, 40000));
  EXPECT_EQ(fake_->copies(), 0u) << "the NIC read GPU memory, no device copy";
  EXPECT_EQ(fake_->hash_launches(), hashes + 1) << "the source hashed on the device";
  EXPECT_EQ(fake_->rdma_flushes(), 0u) << "nothing written into GPU memory: no flush";
  EXPECT_EQ(cuda().direct_writes(), 1u);
  EXPECT_EQ(metrics_.GetCounter("mc_gpu_direct_rdma_write_bytes_total", "").Value(), 40000);
  EXPECT_EQ(DirectBytes(), 0);
  // A failed work request or a hash that differs is not OK / not equal.
  verbs_->FailNthWr(0);
  EXPECT_EQ(ToCode(Submit(write).status), Code::kTransferFailed);
  fake_->CorruptNextHash();
  r = Submit(write);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_NE(r.checksum, Checksum(gpu_ + 8192, 40000)) << "for the caller to reject";
  // A read and a write in one submission: one flush, for the read.
  std::vector<TransferRequest> both{Read(gpu_, 4096, 0), write};
  std::vector<TransferResult> rs = engine_->Submit(both);
  ASSERT_TRUE(rs[0].status.ok()) << rs[0].status;
  ASSERT_TRUE(rs[1].status.ok()) << rs[1].status;
  EXPECT_EQ(fake_->rdma_flushes(), 1u);
  EXPECT_EQ(cuda().direct_writes(), 3u);
  // Unregistered: neither served.
  cuda().UnregisterRdmaDirect(Addr(gpu_));
  EXPECT_FALSE(cuda().CanWriteDirect(kPeer, gpu_ + 8192, 40000));
  EXPECT_EQ(ToCode(Submit(write).status), Code::kTransferFailed);
}

TEST_F(CudaRdmaDirect, ManyReadsInOneSubmitAreFlushedOnceAndEachHashed) {
  ASSERT_TRUE(cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes).value_or(false));
  std::vector<TransferRequest> reads;
  for (int i = 0; i < 32; ++i) reads.push_back(Read(gpu_ + i * 16384, 16384, i * 20000));
  std::vector<TransferResult> results = engine_->Submit(reads);
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].checksum, Checksum(remote_.data() + i * 20000, 16384)) << i;
  }
  EXPECT_EQ(fake_->rdma_flushes(), 1u);
  EXPECT_LE(fake_->hash_launches(), 4u) << "one hash launch per stream, not one per block";
}

TEST_F(CudaRdmaDirect, ADeviceHashThatDiffersIsReturnedForTheCallerToReject) {
  ASSERT_TRUE(cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes).value_or(false));
  fake_->CorruptNextHash();
  TransferResult r = Submit(Read(gpu_, 8192, 0));
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_TRUE(r.checksum.has_value());
  EXPECT_NE(*r.checksum, Checksum(remote_.data(), 8192));
}

TEST_F(CudaRdmaDirect, AFailedFlushOrWorkRequestIsNeverOk) {
  ASSERT_TRUE(cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes).value_or(false));
  fake_->FailRdmaFlush(McError(Code::kTransferFailed, "flush failed (injected)"));
  TransferResult r = Submit(Read(gpu_, 8192, 0));
  EXPECT_EQ(ToCode(r.status), Code::kTransferFailed);
  EXPECT_NE(r.status.message().find("flush"), std::string::npos);
  EXPECT_FALSE(r.checksum.has_value());

  fake_->FailRdmaFlush(absl::OkStatus());
  verbs_->FailNthWr(0);
  r = Submit(Read(gpu_, 8192, 0));
  EXPECT_FALSE(r.status.ok());
  EXPECT_FALSE(r.checksum.has_value());
  // The transport reconnects its queue pair and the next read is served.
  r = Submit(Read(gpu_, 8192, 100));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.checksum, Checksum(remote_.data() + 100, 8192));
}

TEST_F(CudaRdmaDirect, WhatGpuDirectCannotServeIsRefusedWithoutTouchingMemory) {
  ASSERT_TRUE(cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes).value_or(false));
  const uint64_t posted = verbs_->wrs_posted();
  // Scattered: the device hash covers one contiguous range.
  TransferRequest scattered = Read(gpu_, 4096, 0);
  scattered.local.push_back(LocalBuffer{gpu_ + 8192, 4096});
  EXPECT_EQ(ToCode(Submit(scattered).status), Code::kTransferFailed);
  // A peer without rdma, an SSD replica (two-sided, over tcp), a write.
  EXPECT_FALSE(cuda().CanReadDirect(kNoRdmaPeer, gpu_, 4096));
  EXPECT_EQ(ToCode(Submit(Read(gpu_, 4096, 0, kNoRdmaPeer)).status), Code::kTransferFailed);
  TransferRequest disk = Read(gpu_, 4096, 0);
  disk.target = DiskRecord{1, 0, 0};
  EXPECT_EQ(ToCode(Submit(disk).status), Code::kTransferFailed);
  TransferRequest write = Read(gpu_, 4096, 0, kNoRdmaPeer);
  write.direction = Direction::kWrite;
  write.proof = Proof::kWrittenReplica;
  EXPECT_FALSE(cuda().CanWriteDirect(kNoRdmaPeer, gpu_, 4096));
  EXPECT_EQ(ToCode(Submit(write).status), Code::kTransferFailed);
  // Past the registered range.
  EXPECT_FALSE(cuda().CanReadDirect(kPeer, gpu_ + kGpuBytes - 100, 4096));
  EXPECT_EQ(verbs_->wrs_posted(), posted);
  EXPECT_EQ(fake_->copies(), 0u);
  for (uint64_t i = 0; i < kGpuBytes; ++i) ASSERT_EQ(gpu_[i], 0) << i;
}

TEST_F(CudaRdmaDirect, OnlyTheImportsWholePagesAreRegistered) {
  // An allocation of 1 MiB - 100 bytes: its last page is partly another's, never handed to a NIC.
  absl::StatusOr<bool> r = cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes - 100);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
  EXPECT_TRUE(cuda().CanReadDirect(kPeer, gpu_, kGpuBytes - 4096));
  EXPECT_FALSE(cuda().CanReadDirect(kPeer, gpu_ + kGpuBytes - 4096, 100)) << "staged instead";
  TransferResult t = Submit(Read(gpu_ + kGpuBytes - 4096, 100, 0));
  EXPECT_EQ(ToCode(t.status), Code::kTransferFailed) << t.status;
  // Less than a page: nothing to register, nothing exported.
  char* small = fake_->AllocDevice(4096);
  cuda().AddDeviceRange(Addr(small), 100);
  const uint64_t exports = fake_->dmabuf_exports();
  r = cuda().RegisterRdmaDirect(Addr(small), 100);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(fake_->dmabuf_exports(), exports);
}

TEST_F(CudaRdmaDirect, AutoFallsBackQuietlyWhereTheNicOrDeviceCannot) {
  fake_->FailDmaBufExport(McError(Code::kUnavailable, "no dma-buf support (injected)"));
  absl::StatusOr<bool> r = cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  fake_->FailDmaBufExport(absl::OkStatus());
  verbs_->FailDmaBuf(McError(Code::kUnavailable, "ibv_reg_dmabuf_mr: Operation not supported"));
  r = cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(verbs_->dmabuf_regions(), 0u);
  // Not page-aligned: never exported.
  const uint64_t exports = fake_->dmabuf_exports();
  r = cuda().RegisterRdmaDirect(Addr(gpu_) + 256, 4096);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(fake_->dmabuf_exports(), exports);
  EXPECT_FALSE(cuda().CanReadDirect(kPeer, gpu_, 4096));
}

TEST_F(CudaRdmaDirect, OnRefusesABufferTheNicCannotRegister) {
  Start("on");
  verbs_->FailDmaBuf(McError(Code::kUnavailable, "ibv_reg_dmabuf_mr: Operation not supported"));
  absl::StatusOr<bool> r = cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ToCode(r.status()), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("--gpu_direct_rdma=on"), std::string::npos);
  verbs_->FailDmaBuf(absl::OkStatus());
  EXPECT_TRUE(cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes).value_or(false));
}

TEST_F(CudaRdmaDirect, OffNeverExportsNorReadsDirectly) {
  Start("off");
  absl::StatusOr<bool> r = cuda().RegisterRdmaDirect(Addr(gpu_), kGpuBytes);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(fake_->dmabuf_exports(), 0u);
  EXPECT_FALSE(cuda().CanReadDirect(kPeer, gpu_, 4096));
}

TEST(CudaRdmaDirectOptions, OnWithoutAnRdmaTransportAndUnknownModesFailTheEngine) {
  SegmentTable table;
  for (const std::string mode : {"on", "sometimes"}) {
    TransferEngineOptions o;
    o.local_endpoint = kSelf;
    o.transport = "tcp";
    o.cuda.device = 0;
    o.cuda.gpu_direct_rdma = mode;
    o.cuda.api_factory = [] { return std::make_unique<FakeCudaApi>(); };
    TransferEngine engine(o, table);
    EXPECT_FALSE(engine.status().ok()) << mode;
  }
  EXPECT_EQ(ParseGpuDirectRdma("auto").value_or(GpuDirectRdma::kOff), GpuDirectRdma::kAuto);
  EXPECT_FALSE(ParseGpuDirectRdma("").ok());
}

}  // namespace
}  // namespace mc::transfer::cuda
