// GpuGetStager against the fake CUDA device: the pinned pool (lazy, first fit, aligned,
// coalesced, bounded), the batched copies into device memory proved by the device hash, and a
// lost device that must never get the pool back.
#include "client/batch/gpu_get_stager.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_cuda.h"
#include "transfer/cuda/gpu_mover.h"

namespace mc::client {
namespace {

using transfer::cuda::FakeCudaApi;
using transfer::cuda::GpuMover;
using transfer::cuda::GpuMoverOptions;

class GpuGetStagerTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kPool = 64 << 10;

  GpuGetStagerTest() {
    GpuMoverOptions o;
    o.clock = &clock_;
    o.poll_interval_us = 0;
    o.drain_grace_ms = 10;
    o.streams = 2;
    o.streams_per_move = 2;
    mover_ = *GpuMover::Create(api_, o);
    stager_ = std::make_unique<GpuGetStager>(
        api_, *mover_, GpuGetStagerOptions{.pool_bytes = kPool, .copy_timeout_ms = 5}, clock_);
    device_ = api_.AllocDevice(kPool);
  }

  GpuGetStager::Lease Take(uint64_t length) {
    absl::StatusOr<GpuGetStager::Lease> lease = stager_->Reserve(length);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() ? *std::move(lease) : GpuGetStager::Lease();
  }

  FakeClock clock_;
  FakeCudaApi api_{1};
  std::unique_ptr<GpuMover> mover_;
  std::unique_ptr<GpuGetStager> stager_;
  char* device_ = nullptr;
};

TEST_F(GpuGetStagerTest, PoolIsPinnedOnFirstUseAndRangesAreAlignedAndDisjoint) {
  const uint64_t before = api_.pinned_allocations();  // the mover's lanes
  EXPECT_EQ(stager_->bytes_in_use(), 0u);
  GpuGetStager::Lease a = Take(1000);
  EXPECT_EQ(api_.pinned_allocations(), before + 1) << "one pinned pool, allocated lazily";
  GpuGetStager::Lease b = Take(5000);
  GpuGetStager::Lease c = Take(1);
  EXPECT_EQ(api_.pinned_allocations(), before + 1);
  // Aligned within the pool (cudaHostAlloc's memory is page-aligned; the fake's need not be).
  for (const GpuGetStager::Lease* l : {&b, &c}) {
    EXPECT_EQ(static_cast<uint64_t>(l->data() - a.data()) % GpuGetStager::kAlign, 0u);
  }
  EXPECT_EQ(a.length(), 1000u);
  EXPECT_GE(b.data(), a.data() + 1000);
  EXPECT_GE(c.data(), b.data() + 5000);
  EXPECT_EQ(stager_->bytes_in_use(), 1024u + 5120u + 256u);
}

TEST_F(GpuGetStagerTest, FullPoolIsUnavailableAndReturnedRangesCoalesce) {
  std::vector<GpuGetStager::Lease> quarters;
  for (int i = 0; i < 4; ++i) quarters.push_back(Take(kPool / 4));
  absl::StatusOr<GpuGetStager::Lease> more = stager_->Reserve(1);
  EXPECT_EQ(ToCode(more.status()), Code::kUnavailable) << more.status();
  EXPECT_NE(more.status().message().find("--gpu_get_staging_bytes"), std::string::npos);
  // Returned out of order: 1 and 3, then 2 between them, then 0; the whole pool is one range
  // again only when every neighbour was merged.
  quarters[1] = GpuGetStager::Lease();
  quarters[3] = GpuGetStager::Lease();
  EXPECT_EQ(ToCode(stager_->Reserve(kPool / 2).status()), Code::kUnavailable)
      << "two free quarters that do not touch are not one half";
  quarters[2] = GpuGetStager::Lease();
  {
    GpuGetStager::Lease three_quarters = Take(kPool * 3 / 4);
    EXPECT_EQ(ToCode(stager_->Reserve(1).status()), Code::kUnavailable);
  }
  quarters[0] = GpuGetStager::Lease();
  EXPECT_EQ(stager_->bytes_in_use(), 0u);
  GpuGetStager::Lease whole = Take(kPool);
  EXPECT_EQ(whole.length(), kPool);
}

TEST_F(GpuGetStagerTest, ObjectsLargerThanThePoolOrEmptyAreRefused) {
  absl::StatusOr<GpuGetStager::Lease> big = stager_->Reserve(kPool + 1);
  EXPECT_EQ(ToCode(big.status()), Code::kInvalidArgument);
  EXPECT_NE(big.status().message().find("--gpu_get_staging_bytes"), std::string::npos);
  EXPECT_EQ(ToCode(stager_->Reserve(0).status()), Code::kInvalidArgument);
  EXPECT_EQ(stager_->bytes_in_use(), 0u);
}

TEST_F(GpuGetStagerTest, PoolNotAMultipleOfTheAlignmentIsUsableToItsLastByte) {
  GpuGetStager odd(api_, *mover_, GpuGetStagerOptions{.pool_bytes = 1000}, clock_);
  absl::StatusOr<GpuGetStager::Lease> a = odd.Reserve(700);  // takes 768
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<GpuGetStager::Lease> b = odd.Reserve(232);  // the last 232 bytes
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data(), a->data() + 768);
  EXPECT_EQ(ToCode(odd.Reserve(1).status()), Code::kUnavailable);
  *a = GpuGetStager::Lease();
  *b = GpuGetStager::Lease();
  EXPECT_EQ(odd.bytes_in_use(), 0u);
  EXPECT_TRUE(odd.Reserve(1000).ok());
}

TEST_F(GpuGetStagerTest, FailedPinnedAllocationIsUnavailableAndRetriedLater) {
  api_.FailNextAllocPinned();
  absl::StatusOr<GpuGetStager::Lease> first = stager_->Reserve(100);
  EXPECT_EQ(ToCode(first.status()), Code::kUnavailable) << first.status();
  EXPECT_EQ(ToCode(stager_->Reserve(100).status()), Code::kUnavailable)
      << "not retried on every get";
  clock_.AdvanceMs(10'001);
  EXPECT_TRUE(stager_->Reserve(100).ok());
}

TEST_F(GpuGetStagerTest, CopiesLandOnTheDeviceProvedByTheDeviceHashInOneBatch) {
  GpuGetStager::Lease a = Take(3000);
  GpuGetStager::Lease b = Take(70);
  for (uint64_t i = 0; i < 3000; ++i) a.data()[i] = static_cast<char>(i * 7 + 1);
  std::memset(b.data(), 'b', 70);
  const uint64_t batches = mover_->batches_submitted();
  std::vector<GpuGetStager::Copy> copies = {
      {device_ + 4096, a.data(), 3000, Checksum(a.data(), 3000)},
      {device_ + 100, b.data(), 70, Checksum(b.data(), 70)},
  };
  std::vector<GpuGetStager::Result> r = stager_->CopyToDevice(copies);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_TRUE(r[1].status.ok()) << r[1].status;
  EXPECT_EQ(r[0].bytes, 3000u);
  EXPECT_EQ(std::memcmp(device_ + 4096, a.data(), 3000), 0);
  EXPECT_EQ(std::string(device_ + 100, 70), std::string(70, 'b'));
  EXPECT_LE(mover_->batches_submitted() - batches, 2u) << "batched, not a submission per copy";
}

TEST_F(GpuGetStagerTest, AWrongDeviceHashOrAFailedCopyIsNeverOk) {
  GpuGetStager::Lease a = Take(512);
  std::memset(a.data(), 'x', 512);
  const uint64_t sum = Checksum(a.data(), 512);
  api_.CorruptNextHash();
  std::vector<GpuGetStager::Result> r =
      stager_->CopyToDevice(std::vector<GpuGetStager::Copy>{{device_, a.data(), 512, sum}});
  EXPECT_EQ(ToCode(r[0].status), Code::kChecksumMismatch) << r[0].status;
  // A checksum the staging bytes do not have (staging changed after it was verified).
  r = stager_->CopyToDevice(std::vector<GpuGetStager::Copy>{{device_, a.data(), 512, sum + 1}});
  EXPECT_EQ(ToCode(r[0].status), Code::kChecksumMismatch) << r[0].status;
  api_.FailNthCopy(0);
  r = stager_->CopyToDevice(std::vector<GpuGetStager::Copy>{{device_, a.data(), 512, sum}});
  EXPECT_EQ(ToCode(r[0].status), Code::kTransferFailed) << r[0].status;
  EXPECT_EQ(r[0].bytes, 0u);
  api_.ShortenNextCopy(100);
  r = stager_->CopyToDevice(std::vector<GpuGetStager::Copy>{{device_ + 1024, a.data(), 512, sum}});
  EXPECT_FALSE(r[0].status.ok()) << "a short copy reported as success";
}

TEST_F(GpuGetStagerTest, PoolIsNeverReusedOrFreedAfterTheDeviceWasLost) {
  GpuGetStager::Lease a = Take(4096);
  std::memset(a.data(), 'y', 4096);
  api_.SetHold(true);  // the copy never completes: the mover declares the device lost
  api_.AdvanceClockOnPoll(&clock_, 1);
  std::vector<GpuGetStager::Result> r = stager_->CopyToDevice(
      std::vector<GpuGetStager::Copy>{{device_, a.data(), 4096, Checksum(a.data(), 4096)}});
  EXPECT_FALSE(r[0].status.ok());
  EXPECT_TRUE(stager_->lost());
  a = GpuGetStager::Lease();
  EXPECT_EQ(stager_->bytes_in_use(), 4096u) << "left to the device, not returned";
  EXPECT_EQ(ToCode(stager_->Reserve(1).status()), Code::kUnavailable);
  // The held copy runs now and reads pinned memory still allocated (ASan would say otherwise).
  api_.SetHold(false);
  api_.RunPending();
  stager_.reset();
  EXPECT_EQ(std::string(device_, 4096), std::string(4096, 'y'));
}

}  // namespace
}  // namespace mc::client
