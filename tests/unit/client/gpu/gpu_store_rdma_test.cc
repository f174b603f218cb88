// GPUDirect RDMA through the Store service (docs/gpu.md), on the fake CUDA device and fake verbs:
// a GPU buffer registered with GpuBuffers is also registered with the NIC (a dma-buf), and a
// key whose only replica is in another daemon's memory is read by the NIC straight into the
// GPU slice, proved by the device hash, without the staging pool; a corrupted hash or a failed
// work request is never OK; scattered GPU destinations still go through staging; the NIC
// registration lives exactly as long as the buffer; a direct put of one GPU slice is written by
// the NIC from GPU memory to the remote replica, its source hashed again after.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/fakes/fake_verbs.h"
#include "tests/fakes/in_process_rdma_connector.h"
#include "tests/unit/client/gpu/gpu_store_fixture.h"
#include "transfer/rdma/rdma_transport.h"

namespace mc::client::testing {
namespace {

using transfer::rdma::FakeVerbsDevice;
using transfer::rdma::FakeVerbsNetwork;
using transfer::rdma::InProcessRdmaConnector;
using transfer::rdma::RdmaTransport;
using transfer::rdma::SmallFakeDeviceAttributes;

// The verbs world, built before the fixture's engine opens its device in it.
struct VerbsWorld {
  FakeVerbsNetwork network;
  InProcessRdmaConnector connector;
  InProcessRdmaConnector no_peers;  // none added: Connect answers UNAVAILABLE
  FakeVerbsDevice* local_device = nullptr;
};

class GpuStoreRdma : protected VerbsWorld, public GpuStore {
 protected:
  GpuStoreRdma() : GpuStore(RdmaEngineOptions(*this)) {}

  static transfer::TransferEngineOptions RdmaEngineOptions(VerbsWorld& world) {
    transfer::TransferEngineOptions o = GpuEngineOptions();
    o.rdma.device_factory = [&world] {
      auto d = std::make_unique<FakeVerbsDevice>(world.network, SmallFakeDeviceAttributes());
      world.local_device = d.get();
      return d;
    };
    o.rdma.connector = &world.connector;
    return o;
  }

  void SetUp() override {
    local_ = Register(kLocalId, kLocalEndpoint, local_table_, 0, 0);  // every replica is remote
    StartRemote();
    // The remote daemon serves its segments over rdma too.
    server_ = std::make_unique<RdmaTransport>(
        transfer::rdma::RdmaTransportOptions{},
        std::make_unique<FakeVerbsDevice>(network, SmallFakeDeviceAttributes()), no_peers);
    for (size_t i = 0; i < remote_->ids.size(); ++i) {
      ASSERT_TRUE(server_
                      ->ExportSegment(remote_->ids[i], remote_->backing[i].data(),
                                      remote_->backing[i].size())
                      .ok());
    }
    connector.AddPeer(remote_->endpoint, server_.get());
  }
  void TearDown() override {
    gpu_.ReleaseOwner("");  // before the rdma transports go
  }

  std::unique_ptr<RdmaTransport> server_;
};

TEST_F(GpuStoreRdma, ARemoteReplicaIsReadStraightIntoGpuMemoryAndProvedOnTheDevice) {
  const std::string pk = Payload(6000, 4);
  PutOk("k", pk);
  ASSERT_EQ(Lookup("k").replicas(0).data_endpoint(), remote_->endpoint);
  const uint64_t id = RegisterGpu();
  EXPECT_EQ(local_device->dmabuf_regions(), 1u) << "the buffer was registered with the NIC";
  const uint64_t pinned = fake_.pinned_allocations();
  const uint64_t copies = fake_.copies();
  const uint64_t hashes = fake_.hash_launches();
  sv1::BatchGetResponse resp = Get({{"k", {{id, 8192, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(resp.results(0).bytes_written(), pk.size());
  EXPECT_EQ(std::string(device_ + 8192, pk.size()), pk);
  EXPECT_TRUE(DeviceUntouched(0, 8192));
  EXPECT_EQ(cuda_.direct_reads(), 1u);
  EXPECT_EQ(fake_.copies(), copies) << "no device copy: the NIC wrote GPU memory";
  EXPECT_EQ(fake_.pinned_allocations(), pinned) << "the staging pool was never needed";
  EXPECT_GT(fake_.hash_launches(), hashes) << "proved by the device hash";
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
}

TEST_F(GpuStoreRdma, ACorruptedDeviceHashOrAFailedWorkRequestIsNeverOk) {
  const std::string pk = Payload(3000, 5);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  fake_.CorruptNextHash();
  sv1::BatchGetResponse resp = Get({{"k", {{id, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::CHECKSUM_MISMATCH) << resp.results(0).message();
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 1u);
  local_device->FailNthWr(0);
  resp = Get({{"k", {{id, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::TRANSFER_FAILED) << resp.results(0).message();
  // And the next get is served again.
  resp = Get({{"k", {{id, 0, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(std::string(device_, pk.size()), pk);
  EXPECT_EQ(cuda_.direct_reads(), 2u);
}

TEST_F(GpuStoreRdma, ScatteredGpuDestinationsAndFurtherDestinationsStillGoThroughStaging) {
  const std::string pk = Payload(4000, 6);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  sv1::BatchGetResponse resp =
      Get({{"k", {{id, 0, 1000}, {id, 50000, pk.size() - 1000}}}, {"k", {}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  ASSERT_EQ(resp.results(1).code(), sv1::OK) << resp.results(1).message();
  EXPECT_EQ(std::string(device_, 1000), pk.substr(0, 1000));
  EXPECT_EQ(std::string(device_ + 50000, pk.size() - 1000), pk.substr(1000));
  EXPECT_EQ(resp.results(1).data(), pk);
  EXPECT_EQ(cuda_.direct_reads(), 0u);
  EXPECT_EQ(get_stager_.bytes_in_use(), 0u);
}

TEST_F(GpuStoreRdma, TheNicRegistrationLivesExactlyAsLongAsTheBuffer) {
  const uint64_t a = RegisterGpu();
  EXPECT_EQ(local_device->dmabuf_regions(), 1u);
  sv1::UnregisterGpuBufferRequest req;
  req.set_buffer_id(a);
  sv1::UnregisterGpuBufferResponse resp;
  ASSERT_TRUE(gpu_service_.UnregisterGpuBuffer(nullptr, &req, &resp).ok());
  EXPECT_EQ(local_device->dmabuf_regions(), 0u);
  EXPECT_EQ(fake_.imports_open(), 0u);
  // A buffer whose allocation the NIC cannot register is still served (auto): staged.
  local_device->FailDmaBuf(McError(Code::kUnavailable, "ibv_reg_dmabuf_mr: not supported"));
  const std::string pk = Payload(2500, 7);
  PutOk("k", pk);
  const uint64_t b = RegisterGpu();
  EXPECT_EQ(local_device->dmabuf_regions(), 0u);
  sv1::BatchGetResponse got = Get({{"k", {{b, 0, pk.size()}}}});
  ASSERT_EQ(got.results(0).code(), sv1::OK) << got.results(0).message();
  EXPECT_EQ(std::string(device_, pk.size()), pk);
  EXPECT_EQ(cuda_.direct_reads(), 0u);
}

// With direct GPU puts (mc-client's default, --gpu_put_direct).
class GpuStoreRdmaPut : public GpuStoreRdma {
 protected:
  GpuStoreRdmaPut()
      : direct_(cuda_.api(), cuda_.mover(), GpuPutStagerOptions{.max_staging_bytes = kStagingBytes},
                RealClock::Get(), &cuda_) {
    service_.SetGpuBuffers(&gpu_, &direct_);
    putter_.SetGpuStager(&direct_);
  }
  GpuPutStager direct_;
};

TEST_F(GpuStoreRdmaPut, AOneSliceGpuPutIsWrittenByTheNicStraightFromGpuMemory) {
  const std::string pk = Payload(50000, 8);
  std::memcpy(device_ + 12288, pk.data(), pk.size());
  const uint64_t id = RegisterGpu();
  const uint64_t pinned = fake_.pinned_allocations();
  const uint64_t copies = fake_.copies();
  const uint64_t hashes = fake_.hash_launches();
  sv1::BatchPutResponse resp = Put({{"k", {{id, 12288, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(cuda_.direct_writes(), 1u);
  EXPECT_EQ(fake_.copies(), copies) << "no device copy: the NIC read GPU memory";
  EXPECT_EQ(fake_.pinned_allocations(), pinned) << "no staging";
  EXPECT_EQ(fake_.hash_launches(), hashes + 2) << "the source hashed before and after";
  EXPECT_EQ(metrics_.gpu_put_direct.Value(), 1u);
  v1::KeyReplicas kr = Lookup("k");
  ASSERT_EQ(kr.code(), v1::OK);
  EXPECT_EQ(kr.replicas(0).data_endpoint(), remote_->endpoint);
  EXPECT_EQ(GetInline("k"), pk);
  // A failed work request, and a source hash that differs (as if the buffer changed during the
  // put): neither is stored.
  local_device->FailNthWr(0);
  resp = Put({{"failed-wr", {{id, 12288, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::TRANSFER_FAILED) << resp.results(0).message();
  EXPECT_EQ(Lookup("failed-wr").code(), v1::NOT_FOUND);
  fake_.CorruptNextHash();
  resp = Put({{"bad-hash", {{id, 12288, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::CHECKSUM_MISMATCH) << resp.results(0).message();
  EXPECT_EQ(Lookup("bad-hash").code(), v1::NOT_FOUND);
  // A buffer the NIC has not registered is staged instead.
  sv1::UnregisterGpuBufferRequest unregister;
  unregister.set_buffer_id(id);
  sv1::UnregisterGpuBufferResponse unregistered_resp;
  ASSERT_TRUE(gpu_service_.UnregisterGpuBuffer(nullptr, &unregister, &unregistered_resp).ok());
  local_device->FailDmaBuf(McError(Code::kUnavailable, "ibv_reg_dmabuf_mr: not supported"));
  const uint64_t unregistered = RegisterGpu();
  resp = Put({{"staged", {{unregistered, 12288, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(metrics_.gpu_put_direct_staged.Value(), 1u);
  EXPECT_EQ(GetInline("staged"), pk);
}

}  // namespace
}  // namespace mc::client::testing
