// The cuda transport through the TransferEngine, on the fake device: the registry sends GPU
// buffers to it, reads into GPU memory are hashed on the device, writes from GPU memory land in
// the segment, and what it cannot do yet fails loudly without touching memory.
#include "transfer/cuda/cuda_transport.h"

#include <cstring>
#include <vector>

#include "common/checksum.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_cuda.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer::cuda {
namespace {

constexpr char kSelf[] = "10.0.0.1:7000";

class CudaTransportTest : public ::testing::Test {
 protected:
  CudaTransportTest() : segment_(8 << 20) {
    for (size_t i = 0; i < segment_.size(); ++i) segment_[i] = static_cast<char>(i * 7 + i / 251);
    table_.Add(1, segment_.data(), segment_.size());
    TransferEngineOptions options;
    options.local_endpoint = kSelf;
    options.cuda.device = 0;
    options.cuda.api_factory = [this] {
      auto api = std::make_unique<FakeCudaApi>();
      fake_ = api.get();
      return api;
    };
    engine_ = std::make_unique<TransferEngine>(options, table_);
    EXPECT_TRUE(
        engine_->RegisterMemory(segment_.data(), segment_.size(), MemoryAccess::kRemote).ok());
    gpu_ = fake_->AllocDevice(4 << 20);
    engine_->gpu()->AddDeviceRange(reinterpret_cast<uint64_t>(gpu_), 4 << 20);
  }

  TransferRequest Req(Direction op, char* local, uint64_t length, uint64_t offset,
                      bool checksum = false, const std::string& endpoint = kSelf) {
    TransferRequest r;
    r.direction = op;
    r.local = {LocalBuffer{local, length}};
    r.endpoint = endpoint;
    r.target = SegmentRange{1, offset};
    if (checksum) {
      r.proof = op == Direction::kRead ? Proof::kDeliveredBytes : Proof::kWrittenReplica;
    }
    return r;
  }

  std::vector<char> segment_;
  SegmentTable table_;
  FakeCudaApi* fake_ = nullptr;
  std::unique_ptr<TransferEngine> engine_;
  char* gpu_ = nullptr;
};

TEST(GpuUuid, FormattedAsNvidiaSmiAndComparedInEitherSpelling) {
  std::vector<uint8_t> bytes(16);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(0xa0 + i);
  const std::string uuid = FormatGpuUuid(bytes);
  EXPECT_EQ(uuid, "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf");
  EXPECT_TRUE(SameGpuUuid(uuid, uuid));
  EXPECT_TRUE(SameGpuUuid("gpu-A0A1A2A3-A4A5-A6A7-A8A9-AAABACADAEAF", uuid));
  EXPECT_TRUE(SameGpuUuid("a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf", uuid));
  EXPECT_FALSE(SameGpuUuid("a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeae", uuid));
  EXPECT_FALSE(SameGpuUuid("GPU-", uuid));
  EXPECT_FALSE(SameGpuUuid("", uuid));
  EXPECT_FALSE(SameGpuUuid("GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf0", uuid));
}

// Memory reaches the transports only through the engine: a segment (kRemote) is pinned for the
// copy engines; an application buffer (kLocal) is not (GPU copies never touch it), and the
// engine without rdma says registering one changes nothing.
TEST_F(CudaTransportTest, OnlySegmentsArePinned) {
  EXPECT_EQ(fake_->host_registered(), 1u);
  std::vector<char> app(1 << 16);
  ASSERT_TRUE(engine_->RegisterMemory(app.data(), app.size(), MemoryAccess::kLocal).ok());
  EXPECT_EQ(fake_->host_registered(), 1u);
  EXPECT_FALSE(engine_->NeedsLocalRegistration());
  engine_->UnregisterMemory(app.data());
  engine_->UnregisterMemory(segment_.data());
  EXPECT_EQ(fake_->host_registered(), 0u);
}

TEST_F(CudaTransportTest, ReadsIntoGpuMemoryInBatchesWithDeviceChecksums) {
  ASSERT_NE(engine_->gpu(), nullptr);
  EXPECT_EQ(fake_->host_registered(), 1u);  // the segment was pinned
  std::vector<TransferRequest> reads;
  for (int i = 0; i < 256; ++i)
    reads.push_back(Req(Direction::kRead, gpu_ + i * 16384, 16384, i * 16384, true));
  auto results = engine_->Submit(reads);
  for (int i = 0; i < 256; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status;
    EXPECT_EQ(results[i].bytes, 16384u);
    EXPECT_EQ(results[i].checksum, Checksum(segment_.data() + i * 16384, 16384));
  }
  EXPECT_EQ(std::memcmp(gpu_, segment_.data(), 256 * 16384), 0);
  EXPECT_LE(fake_->batch_calls(), 4u);  // one per stream, not one per block
  EXPECT_LE(fake_->hash_launches(), 4u);
}

TEST_F(CudaTransportTest, WritesFromGpuMemoryLandInTheSegment) {
  for (int i = 0; i < 1000; ++i) gpu_[i] = static_cast<char>(255 - i);
  auto results =
      engine_->Submit(std::vector<TransferRequest>{Req(Direction::kWrite, gpu_, 1000, 5 << 20)});
  ASSERT_TRUE(results[0].status.ok());
  EXPECT_EQ(results[0].bytes, 1000u);
  EXPECT_EQ(std::memcmp(segment_.data() + (5 << 20), gpu_, 1000), 0);
  EXPECT_FALSE(results[0].checksum.has_value()) << "not asked";
}

TEST_F(CudaTransportTest, AWriteAskingForAChecksumGetsTheSegmentsBytesHashedAfterTheCopy) {
  for (int i = 0; i < 3000; ++i) gpu_[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(engine_->gpu()->CanWriteDirect(kSelf, gpu_, 3000));
  EXPECT_FALSE(engine_->gpu()->CanWriteDirect(kSelf, segment_.data(), 3000)) << "host memory";
  auto results = engine_->Submit(
      std::vector<TransferRequest>{Req(Direction::kWrite, gpu_, 3000, 1 << 20, /*checksum=*/true)});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[0].checksum, Checksum(gpu_, 3000));
  // A copy that "succeeds" short: the hash is of what the segment holds, not of the source.
  fake_->ShortenNextCopy(10);
  results = engine_->Submit(
      std::vector<TransferRequest>{Req(Direction::kWrite, gpu_ + 3000, 3000, 2 << 20, true)});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  ASSERT_TRUE(results[0].checksum.has_value());
  EXPECT_NE(*results[0].checksum, Checksum(gpu_ + 3000, 3000));
  EXPECT_EQ(*results[0].checksum, Checksum(segment_.data() + (2 << 20), 3000));
}

TEST_F(CudaTransportTest, AFailedCopyIsNeverOk) {
  fake_->FailNthCopy(0);
  auto results =
      engine_->Submit(std::vector<TransferRequest>{Req(Direction::kRead, gpu_, 4096, 0, true)});
  EXPECT_EQ(ToCode(results[0].status), Code::kTransferFailed);
  EXPECT_EQ(results[0].bytes, 0u);
  EXPECT_FALSE(results[0].checksum.has_value());
}

TEST_F(CudaTransportTest, AShortCompletionYieldsAChecksumTheCallerRejects) {
  // The transport returns the hash of what landed; the batch path compares it with the
  // recorded one, so a short copy the driver called complete is a mismatch, never OK.
  fake_->ShortenNextCopy(100);
  auto results =
      engine_->Submit(std::vector<TransferRequest>{Req(Direction::kRead, gpu_, 65536, 0, true)});
  ASSERT_TRUE(results[0].status.ok());
  EXPECT_NE(results[0].checksum, Checksum(segment_.data(), 65536));
}

TEST_F(CudaTransportTest, OutOfBoundsSegmentRangesAreRejectedBeforeAnyCopy) {
  auto results = engine_->Submit(
      std::vector<TransferRequest>{Req(Direction::kRead, gpu_, 4096, (8 << 20) - 100)});
  EXPECT_EQ(ToCode(results[0].status), Code::kInvalidArgument);
  EXPECT_EQ(fake_->copies(), 0u);
}

TEST_F(CudaTransportTest, RemoteSegmentsAreRefusedLoudly) {
  auto results = engine_->Submit(
      std::vector<TransferRequest>{Req(Direction::kRead, gpu_, 4096, 0, false, "10.0.0.2:7000")});
  EXPECT_EQ(ToCode(results[0].status), Code::kTransferFailed);
  EXPECT_NE(results[0].status.message().find("GPUDirect RDMA"), std::string::npos);
  EXPECT_EQ(fake_->copies(), 0u);
}

TEST_F(CudaTransportTest, ScatteredDeviceDestinationWithChecksumIsRejected) {
  TransferRequest r = Req(Direction::kRead, gpu_, 100, 0, true);
  r.local.push_back(LocalBuffer{gpu_ + 1000, 100});
  auto results = engine_->Submit(std::vector<TransferRequest>{r});
  EXPECT_EQ(ToCode(results[0].status), Code::kInvalidArgument);
}

TEST_F(CudaTransportTest, HostBuffersStillGoThroughTheLocalTransport) {
  std::vector<char> host(4096);
  auto results = engine_->Submit(
      std::vector<TransferRequest>{Req(Direction::kRead, host.data(), host.size(), 0, true)});
  ASSERT_TRUE(results[0].status.ok());
  EXPECT_EQ(fake_->copies(), 0u);
  EXPECT_EQ(results[0].checksum, Checksum(segment_.data(), 4096));
}

TEST_F(CudaTransportTest, NoCudaDeviceMeansNoCudaTransport) {
  TransferEngineOptions options;
  options.local_endpoint = kSelf;
  options.cuda.device = 0;
  options.cuda.api_factory = [] {
    auto api = std::make_unique<FakeCudaApi>();
    api->LoseDevice();
    return api;
  };
  TransferEngine engine(options, table_);
  EXPECT_EQ(engine.gpu(), nullptr);
}

}  // namespace
}  // namespace mc::transfer::cuda
