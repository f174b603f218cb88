// Direct GPU puts through the Store service (docs/gpu.md, "What BatchPut does with a GPU slice"),
// on the fake CUDA device: an item that is one GPU slice is hashed on the device and written
// straight into this daemon's segment by the cuda transport, OK only when the segment's bytes
// hash to that device hash; a replica the cuda transport cannot write (a peer over TCP) makes the
// item go through a staged host copy that must hash the same; scattered items and
// --gpu_put_direct=false stage as before. (GPUDirect RDMA writes: gpu_store_rdma_test.cc.)
#include <cstring>
#include <string>
#include <vector>

#include "tests/unit/client/gpu/gpu_store_fixture.h"

namespace mc::client::testing {
namespace {

class GpuStoreDirectPut : public GpuStore {
 protected:
  explicit GpuStoreDirectPut(bool direct = true)
      : direct_(cuda_.api(), cuda_.mover(),
                GpuPutStagerOptions{.max_staging_bytes = kStagingBytes, .direct = direct},
                RealClock::Get(), &cuda_) {
    service_.SetGpuBuffers(&gpu_, &direct_);
    putter_.SetGpuStager(&direct_);
  }

  // `pk` written into the device at `offset`, a buffer registered over the whole allocation.
  uint64_t DeviceHolds(const std::string& pk, uint64_t offset) {
    std::memcpy(device_ + offset, pk.data(), pk.size());
    return RegisterGpu();
  }

  GpuPutStager direct_;
};

TEST_F(GpuStoreDirectPut, AOneSliceGpuPutIsWrittenIntoTheLocalSegmentAndProved) {
  const std::string pk = Payload(70000, 31);
  const uint64_t id = DeviceHolds(pk, 4096);
  const uint64_t pinned = fake_.pinned_allocations();
  const uint64_t copies = fake_.copies();
  const uint64_t hashes = fake_.hash_launches();
  sv1::BatchPutResponse resp = Put({{"direct", {{id, 4096, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(fake_.pinned_allocations(), pinned) << "no staging pool: written from GPU memory";
  EXPECT_EQ(fake_.copies(), copies + 1) << "one device copy into the segment";
  EXPECT_EQ(fake_.hash_launches(), hashes + 1) << "the source hashed once on the device";
  EXPECT_EQ(metrics_.gpu_put_direct.Value(), 1u);
  EXPECT_EQ(metrics_.gpu_put_direct_staged.Value(), 0u);
  v1::KeyReplicas kr = Lookup("direct");
  ASSERT_EQ(kr.code(), v1::OK);
  EXPECT_EQ(kr.replicas(0).data_endpoint(), kLocalEndpoint);
  EXPECT_EQ(kr.checksum(), Checksum(pk));
  EXPECT_EQ(GetInline("direct"), pk);
  // Two replicas (both segments of this daemon), several items in one batch.
  const std::string other = Payload(3000, 32);
  std::memcpy(device_ + 200000, other.data(), other.size());
  resp = Put({{"a", {{id, 4096, pk.size()}}}, {"b", {{id, 200000, other.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  ASSERT_EQ(resp.results(1).code(), sv1::OK) << resp.results(1).message();
  EXPECT_EQ(GetInline("a"), pk);
  EXPECT_EQ(GetInline("b"), other);
  EXPECT_EQ(metrics_.gpu_put_direct.Value(), 3u);
}

TEST_F(GpuStoreDirectPut, AReplicaThatDiffersFromTheDeviceHashIsNeverStored) {
  const std::string pk = Payload(5000, 33);
  const uint64_t id = DeviceHolds(pk, 0);
  // The copy into the segment "succeeds" one hundred bytes short.
  fake_.ShortenNextCopy(100);
  sv1::BatchPutResponse resp = Put({{"short", {{id, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::CHECKSUM_MISMATCH) << resp.results(0).message();
  EXPECT_EQ(Lookup("short").code(), v1::NOT_FOUND) << "revoked";
  // Every n-th copy lands with a flipped byte (a device that lies about what it wrote).
  fake_.CorruptEveryNthCopy(1);
  resp = Put({{"flipped", {{id, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::CHECKSUM_MISMATCH) << resp.results(0).message();
  EXPECT_EQ(Lookup("flipped").code(), v1::NOT_FOUND);
  fake_.CorruptEveryNthCopy(0);
  // The device's hash of the source is wrong: the replica cannot match it.
  fake_.CorruptNextHash();
  resp = Put({{"bad-hash", {{id, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::CHECKSUM_MISMATCH) << resp.results(0).message();
  EXPECT_EQ(Lookup("bad-hash").code(), v1::NOT_FOUND);
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 3u);
  // The same source written intact is stored.
  resp = Put({{"short", {{id, 0, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(GetInline("short"), pk);
  // A failed copy (last: the fake's stream stays failed, as CUDA's context does).
  fake_.FailNthCopy(0);
  resp = Put({{"failed", {{id, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::TRANSFER_FAILED) << resp.results(0).message();
  EXPECT_EQ(Lookup("failed").code(), v1::NOT_FOUND);
}

TEST_F(GpuStoreDirectPut, ScatteredGpuItemsAreStagedAsBefore) {
  const std::string pk = Payload(6000, 34);
  const uint64_t id = DeviceHolds(pk, 0);
  const uint64_t pinned = fake_.pinned_allocations();
  sv1::BatchPutResponse resp = Put({{"two", {{id, 0, 1000}, {id, 1000, pk.size() - 1000}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(fake_.pinned_allocations(), pinned + 1) << "the staging pool";
  EXPECT_EQ(metrics_.gpu_put_direct.Value(), 0u);
  EXPECT_EQ(GetInline("two"), pk);
  EXPECT_EQ(direct_.staged_bytes_in_use(), 0u);
}

// Every replica on another daemon, reached over TCP: the cuda transport cannot write it.
class GpuStoreDirectPutRemote : public GpuStoreDirectPut {
 protected:
  void SetUp() override {
    local_ = Register(kLocalId, kLocalEndpoint, local_table_, 0, 0);
    StartRemote();
  }
};

TEST_F(GpuStoreDirectPutRemote, AReplicaOverTcpIsWrittenFromAHostCopyThatHashesTheSame) {
  const std::string pk = Payload(9000, 35);
  const uint64_t id = DeviceHolds(pk, 8192);
  sv1::BatchPutResponse resp = Put({{"remote", {{id, 8192, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(metrics_.gpu_put_direct.Value(), 0u);
  EXPECT_EQ(metrics_.gpu_put_direct_staged.Value(), 1u);
  EXPECT_EQ(Lookup("remote").replicas(0).data_endpoint(), remote_->endpoint);
  EXPECT_EQ(GetInline("remote"), pk);
  EXPECT_EQ(direct_.staged_bytes_in_use(), 0u) << "the host copy goes with the put";
  // The device hashed the source wrongly before the put (as if the buffer changed after): the
  // staged copy hashes differently, and the put fails instead of recording the wrong checksum.
  fake_.CorruptNextHash();
  resp = Put({{"changed", {{id, 8192, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::CHECKSUM_MISMATCH) << resp.results(0).message();
  EXPECT_NE(resp.results(0).message().find("changed during the put"), std::string::npos);
  EXPECT_EQ(Lookup("changed").code(), v1::NOT_FOUND) << "revoked";
  // A staging pool too small for the item: it fails alone, naming the flag, and is revoked.
  resp = Put({{"big", {{id, 0, kStagingBytes + 1}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::INVALID_ARGUMENT) << resp.results(0).message();
  EXPECT_NE(resp.results(0).message().find("--gpu_put_staging_bytes"), std::string::npos);
  EXPECT_EQ(Lookup("big").code(), v1::NOT_FOUND);
}

class GpuStoreDirectPutOff : public GpuStoreDirectPut {
 protected:
  GpuStoreDirectPutOff() : GpuStoreDirectPut(/*direct=*/false) {}
};

TEST_F(GpuStoreDirectPutOff, WithDirectPutsOffEveryGpuItemIsStaged) {
  const std::string pk = Payload(5000, 36);
  const uint64_t id = DeviceHolds(pk, 0);
  const uint64_t pinned = fake_.pinned_allocations();
  ASSERT_EQ(Put({{"k", {{id, 0, pk.size()}}}}).results(0).code(), sv1::OK);
  EXPECT_EQ(fake_.pinned_allocations(), pinned + 1);
  EXPECT_EQ(metrics_.gpu_put_direct.Value(), 0u);
  EXPECT_EQ(GetInline("k"), pk);
}

}  // namespace
}  // namespace mc::client::testing
