// The real CUDA backend (cuda_api_cudart.cc) and the XXH3 kernel on a real device: the kernel's
// hashes equal libxxhash's for every length class and alignment, and the mover moves and
// proves blocks through cudart, and GPUDirect RDMA's device half (dma-buf export, flush). Skipped
// without a device, or failed with MC_REQUIRE_GPU=1 (bench/gpu_check.sh sets it). Label `gpu`.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "transfer/cuda/cuda_api.h"
#include "transfer/cuda/gpu_mover.h"

namespace mc::transfer::cuda {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto api = OpenCudaApi();
    if (!api.ok()) {
      if (std::getenv("MC_REQUIRE_GPU") != nullptr) FAIL() << api.status();
      GTEST_SKIP() << "no CUDA device: " << api.status();
    }
    api_ = *std::move(api);
  }
  // Device memory holding `host`.
  char* Upload(const std::vector<uint8_t>& host) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, host.size() + 64), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    allocations_.push_back(d);
    return static_cast<char*>(d);
  }
  void TearDown() override {
    for (void* d : allocations_) cudaFree(d);
  }

  std::unique_ptr<CudaApi> api_;
  std::vector<void*> allocations_;
};

TEST_F(CudaDeviceTest, DeviceUuidIsNvidiaSmisForm) {
  absl::StatusOr<std::string> uuid = api_->DeviceUuid(0);
  ASSERT_TRUE(uuid.ok()) << uuid.status();
  ASSERT_EQ(uuid->size(), 40u) << *uuid;
  EXPECT_EQ(uuid->substr(0, 4), "GPU-");
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(*uuid, FormatGpuUuid(std::span<const uint8_t>(
                       reinterpret_cast<const uint8_t*>(prop.uuid.bytes), 16)));
  std::printf("device 0: %s\n", uuid->c_str());
}

TEST_F(CudaDeviceTest, KernelHashEqualsLibxxhashForEveryLengthClassAndAlignment) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> data((4 << 20) + 64);
  for (auto& c : data) c = static_cast<uint8_t>(rng());
  char* dev = Upload(data);
  std::vector<HashRange> ranges;
  for (uint64_t len = 0; len <= 2100; ++len) ranges.push_back({len % 8, len});
  for (uint64_t blocks : {1, 2, 31, 32, 33, 64, 65, 1000, 4095}) {
    for (int64_t d : {-64, -1, 0, 1, 63, 64, 65}) {
      ranges.push_back({static_cast<uint64_t>(blocks % 5), blocks * 1024 + d});
    }
  }
  for (uint64_t len : {16u << 10, 64u << 10, 256u << 10, 4u << 20}) ranges.push_back({0, len});
  auto pinned_ranges = api_->AllocPinned(ranges.size() * sizeof(HashRange));
  auto pinned_out = api_->AllocPinned(ranges.size() * sizeof(uint64_t));
  ASSERT_TRUE(pinned_ranges.ok() && pinned_out.ok());
  auto* r = static_cast<HashRange*>(*pinned_ranges);
  auto* out = static_cast<uint64_t*>(*pinned_out);
  for (size_t i = 0; i < ranges.size(); ++i) {
    r[i] = {reinterpret_cast<uint64_t>(dev) + ranges[i].addr, ranges[i].length};
  }
  auto stream = api_->CreateStream(0);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(api_->HashAsync(*stream, r, out, static_cast<uint32_t>(ranges.size())).ok());
  ASSERT_TRUE(api_->SynchronizeStream(*stream).ok());
  int bad = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const uint64_t want = Checksum(data.data() + ranges[i].addr, ranges[i].length);
    if (out[i] != want && bad++ < 10) {
      ADD_FAILURE() << "len " << ranges[i].length << " offset " << ranges[i].addr;
    }
  }
  EXPECT_EQ(bad, 0) << "of " << ranges.size() << " ranges";
  api_->DestroyStream(*stream);
  api_->FreePinned(r);
  api_->FreePinned(out);
}

TEST_F(CudaDeviceTest, MoverRoundTripsManySmallBlocksAndProvesThemOnTheDevice) {
  constexpr size_t kBlocks = 4096, kSize = 16 << 10;
  auto host = api_->AllocPinned(kBlocks * kSize);
  auto back = api_->AllocPinned(kBlocks * kSize);
  ASSERT_TRUE(host.ok() && back.ok());
  char* h = static_cast<char*>(*host);
  char* b = static_cast<char*>(*back);
  for (size_t i = 0; i < kBlocks * kSize; ++i) h[i] = static_cast<char>(i * 2654435761u >> 13);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, kBlocks * kSize), cudaSuccess);
  allocations_.push_back(dev);
  auto mover = GpuMover::Create(*api_, GpuMoverOptions{});
  ASSERT_TRUE(mover.ok()) << mover.status();
  std::vector<GpuMoveRequest> in(kBlocks), out(kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) {
    in[i].copies = {CopyOp{static_cast<char*>(dev) + i * kSize, h + i * kSize, kSize}};
    in[i].hash_destination = true;
    in[i].expected_checksum = Checksum(h + i * kSize, kSize);
    out[i].copies = {CopyOp{b + i * kSize, static_cast<char*>(dev) + i * kSize, kSize}};
  }
  for (const auto& r : (*mover)->Move(in, 0)) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_EQ(r.bytes, kSize);
  }
  for (const auto& r : (*mover)->Move(out, 0)) ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(std::memcmp(h, b, kBlocks * kSize), 0);
  EXPECT_LE((*mover)->batches_submitted(), 2 * 8u);  // 4 streams x 1024 copies per call
  mover->reset();
  api_->FreePinned(h);
  api_->FreePinned(b);
}

// GPUDirect RDMA's device half, which needs no NIC: the dma-buf export of an allocation (or the
// driver's clear refusal), the range checks before it, the flush of NIC writes, and a hash_only
// proof of bytes already in device memory.
TEST_F(CudaDeviceTest, DmaBufExportRdmaFlushAndHashOnlyProofThroughTheDriver) {
  constexpr uint64_t kBytes = 4 << 20;
  std::vector<uint8_t> host(kBytes);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 2654435761u >> 11);
  char* dev = Upload(host);
  ASSERT_EQ(reinterpret_cast<uint64_t>(dev) % 4096, 0u) << "cudaMalloc returns page-aligned memory";

  EXPECT_TRUE(api_->FlushRdmaWrites(0).ok());
  auto mover = GpuMover::Create(*api_, GpuMoverOptions{});
  ASSERT_TRUE(mover.ok()) << mover.status();
  std::vector<GpuMoveRequest> prove(2);
  for (GpuMoveRequest& m : prove) {
    m.copies = {CopyOp{dev, nullptr, kBytes}};
    m.hash_destination = true;
    m.hash_only = true;
    m.expected_checksum = Checksum(host.data(), kBytes);
  }
  prove[1].expected_checksum = *prove[1].expected_checksum ^ 1;
  std::vector<GpuMoveResult> proved = (*mover)->Move(prove, 0);
  EXPECT_TRUE(proved[0].status.ok()) << proved[0].status;
  EXPECT_EQ(proved[0].bytes, 0u) << "nothing was copied";
  EXPECT_EQ(ToCode(proved[1].status), Code::kChecksumMismatch) << proved[1].status;

  absl::StatusOr<int> fd = api_->ExportDmaBuf(0, reinterpret_cast<uint64_t>(dev), kBytes);
  if (!fd.ok()) {
    // Proprietary kernel modules, an old driver or kernel: mc-client stages (docs/gpu.md).
    EXPECT_EQ(ToCode(fd.status()), Code::kUnavailable) << fd.status();
    std::printf("GPUDirect RDMA: device 0 exports no dma-bufs: %s\n",
                std::string(fd.status().message()).c_str());
    return;
  }
  const off_t size = lseek(*fd, 0, SEEK_END);
  std::printf("GPUDirect RDMA: device 0 exported a dma-buf of %lld bytes\n",
              static_cast<long long>(size));
  EXPECT_GE(size, static_cast<off_t>(kBytes));
  close(*fd);
  const auto refused = [&](uint64_t addr, uint64_t len) {
    absl::StatusOr<int> r = api_->ExportDmaBuf(0, addr, len);
    if (r.ok()) close(*r);
    return !r.ok() && ToCode(r.status()) == Code::kInvalidArgument;
  };
  EXPECT_TRUE(refused(reinterpret_cast<uint64_t>(dev) + 1, 4096)) << "not page-aligned";
  EXPECT_TRUE(refused(reinterpret_cast<uint64_t>(dev), 4095)) << "not whole pages";
  EXPECT_TRUE(refused(reinterpret_cast<uint64_t>(dev), kBytes + (64 << 20))) << "past the end";
}

}  // namespace
}  // namespace mc::transfer::cuda
