// The GPU mover (transfer/cuda/gpu_mover.h) against the fake device: batching, byte accounting,
// failed and short copies, device hashes, deadlines and a lost device.
#include "transfer/cuda/gpu_mover.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/checksum.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_cuda.h"

namespace mc::transfer::cuda {
namespace {

class GpuMoverTest : public ::testing::Test {
 protected:
  std::unique_ptr<GpuMover> Make(GpuMoverOptions o = {}) {
    o.clock = &clock_;
    o.poll_interval_us = 0;
    auto m = GpuMover::Create(api_, o);
    EXPECT_TRUE(m.ok()) << m.status();
    return *std::move(m);
  }
  // `n` host blocks of `size` bytes (distinct contents) and a device buffer for all of them.
  void Fill(size_t n, uint64_t size) {
    host_.resize(n * size);
    for (size_t i = 0; i < host_.size(); ++i) host_[i] = static_cast<char>(i * 131 + i / 7);
    device_ = api_.AllocDevice(n * size);
  }
  std::vector<GpuMoveRequest> H2D(size_t n, uint64_t size, bool hash) {
    std::vector<GpuMoveRequest> reqs(n);
    for (size_t i = 0; i < n; ++i) {
      reqs[i].copies.push_back(CopyOp{device_ + i * size, host_.data() + i * size, size});
      reqs[i].hash_destination = hash;
      if (hash) reqs[i].expected_checksum = Checksum(host_.data() + i * size, size);
    }
    return reqs;
  }

  FakeClock clock_;
  FakeCudaApi api_;
  std::vector<char> host_;
  char* device_ = nullptr;
};

TEST_F(GpuMoverTest, ManySmallBlocksGoInFewBatchedCallsAndOneHashLaunchPerStream) {
  GpuMoverOptions o;
  o.streams = 4;
  o.streams_per_move = 4;
  o.max_ops_per_batch = 256;
  auto mover = Make(o);
  Fill(2048, 4096);
  auto results = mover->Move(H2D(2048, 4096, true), 0);
  for (const auto& r : results) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.bytes, 4096u);
  }
  EXPECT_EQ(std::memcmp(device_, host_.data(), host_.size()), 0);
  EXPECT_EQ(api_.copies(), 2048u);
  EXPECT_EQ(api_.batch_calls(), 8u);  // 4 streams x 512 copies / 256 per call
  EXPECT_EQ(api_.hash_launches(), 4u);
  EXPECT_EQ(mover->batches_submitted(), 8u);
  EXPECT_EQ(api_.live_events(), 0u);  // every event destroyed
}

TEST_F(GpuMoverTest, ReturnsTheDeviceHashAndAcceptsAMatch) {
  auto mover = Make();
  Fill(3, 5000);
  auto reqs = H2D(3, 5000, true);
  reqs[1].expected_checksum.reset();  // only asked for
  auto results = mover->Move(reqs, 0);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].status.ok());
    EXPECT_EQ(results[i].checksum, Checksum(host_.data() + i * 5000, 5000));
  }
}

TEST_F(GpuMoverTest, AFailedCopyFailsItsRequestAndCountsNoBytesOfItsBatch) {
  GpuMoverOptions o;
  o.streams = 1;
  o.streams_per_move = 1;
  o.max_ops_per_batch = 4;
  auto mover = Make(o);
  Fill(12, 1024);
  api_.FailNthCopy(5);  // the second copy of the second batch
  auto results = mover->Move(H2D(12, 1024, false), 0);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i;
    EXPECT_EQ(results[i].bytes, 1024u);
  }
  for (size_t i = 4; i < 12; ++i) {  // the failed batch and everything after it on the stream
    EXPECT_EQ(ToCode(results[i].status), Code::kTransferFailed) << i;
    EXPECT_EQ(results[i].bytes, 0u) << i;
  }
}

TEST_F(GpuMoverTest, AFailedBatchCallFailsItAndEveryLaterCopyOfItsStream) {
  GpuMoverOptions o;
  o.streams = 1;
  o.streams_per_move = 1;
  o.max_ops_per_batch = 2;
  auto mover = Make(o);
  Fill(4, 100);
  api_.FailNextBatchCall();
  auto results = mover->Move(H2D(4, 100, false), 0);
  for (const auto& r : results) {
    EXPECT_EQ(ToCode(r.status), Code::kTransferFailed);  // nothing after the failed call was sent
    EXPECT_EQ(r.bytes, 0u);
  }
}

TEST_F(GpuMoverTest, AShortCopyReportedAsDoneIsCaughtByTheDeviceHash) {
  auto mover = Make();
  Fill(2, 8192);
  api_.ShortenNextCopy(1);  // the driver "completes" one byte short
  auto results = mover->Move(H2D(2, 8192, true), 0);
  EXPECT_EQ(ToCode(results[0].status), Code::kChecksumMismatch);
  EXPECT_TRUE(results[1].status.ok());
}

TEST_F(GpuMoverTest, ACorruptedHashIsNeverOk) {
  auto mover = Make();
  Fill(1, 300);
  api_.CorruptNextHash();
  auto results = mover->Move(H2D(1, 300, true), 0);
  EXPECT_EQ(ToCode(results[0].status), Code::kChecksumMismatch);
  EXPECT_EQ(results[0].bytes, 300u);  // the bytes moved; the proof failed
}

TEST_F(GpuMoverTest, ADeviceHashNeedsOneContiguousDestination) {
  auto mover = Make();
  Fill(2, 64);
  GpuMoveRequest r;
  r.copies = {CopyOp{device_, host_.data(), 64}, CopyOp{device_ + 64, host_.data() + 64, 64}};
  r.hash_destination = true;
  auto results = mover->Move(std::vector<GpuMoveRequest>{r}, 0);
  EXPECT_EQ(ToCode(results[0].status), Code::kInvalidArgument);
  EXPECT_EQ(api_.copies(), 0u);
}

TEST_F(GpuMoverTest, HashesTheDeviceSourceOfADeviceToHostCopy) {
  auto mover = Make();
  Fill(2, 4096);
  std::memcpy(device_, host_.data(), host_.size());  // the device holds the blocks
  std::vector<char> staged(host_.size(), 0);
  std::vector<GpuMoveRequest> reqs(2);
  for (size_t i = 0; i < 2; ++i) {
    reqs[i].copies.push_back(CopyOp{staged.data() + i * 4096, device_ + i * 4096, 4096});
    reqs[i].hash_source = true;
  }
  reqs[1].expected_checksum = Checksum(host_.data() + 4096, 4096);
  auto results = mover->Move(reqs, 0);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status;
    EXPECT_EQ(results[i].checksum, Checksum(host_.data() + i * 4096, 4096));
    EXPECT_EQ(results[i].bytes, 4096u);
  }
  EXPECT_EQ(staged, host_);
  // A short copy leaves the source intact: its device hash is still the source's, and only a
  // check of the staged bytes against it (client/batch/gpu_put_stager.h) catches the short copy.
  std::fill(staged.begin(), staged.end(), 0);
  api_.ShortenNextCopy(1);
  results = mover->Move(std::vector<GpuMoveRequest>{reqs[0]}, 0);
  ASSERT_TRUE(results[0].status.ok());
  EXPECT_EQ(results[0].checksum, Checksum(host_.data(), 4096));
  EXPECT_NE(Checksum(staged.data(), 4096), *results[0].checksum);
  // A mismatch with the expected value is never OK; both hashes at once are refused.
  reqs[0].expected_checksum = 1;
  EXPECT_EQ(ToCode(mover->Move(std::vector<GpuMoveRequest>{reqs[0]}, 0)[0].status),
            Code::kChecksumMismatch);
  reqs[0].hash_destination = true;
  const uint64_t copies = api_.copies();
  EXPECT_EQ(ToCode(mover->Move(std::vector<GpuMoveRequest>{reqs[0]}, 0)[0].status),
            Code::kInvalidArgument);
  EXPECT_EQ(api_.copies(), copies);
}

TEST_F(GpuMoverTest, DeadlineFailsUnfinishedWorkAfterItDrained) {
  GpuMoverOptions o;
  o.drain_grace_ms = 1000;
  auto mover = Make(o);
  Fill(8, 4096);
  api_.SetHold(true);
  api_.AdvanceClockOnPoll(&clock_, 1);
  // Work held until the clock passed the deadline, then run by the "device" while the mover
  // drains: the results say deadline, and no copy is still pending when Move returns.
  const int64_t deadline = clock_.NowMs() + 5;
  api_.RunHeldWorkAtMs(deadline + 3);
  auto results = mover->Move(H2D(8, 4096, true), deadline);
  for (const auto& r : results) {
    EXPECT_EQ(ToCode(r.status), Code::kTransferFailed);
    EXPECT_EQ(r.status.message(), "deadline");
    EXPECT_FALSE(r.checksum.has_value());
  }
  EXPECT_FALSE(mover->device_lost());
  EXPECT_EQ(std::memcmp(device_, host_.data(), host_.size()), 0);  // it all landed meanwhile
  api_.SetHold(false);
  api_.RunHeldWorkAtMs(-1);
  EXPECT_TRUE(mover->Move(H2D(8, 4096, true), 0)[0].status.ok());  // streams reusable
}

TEST_F(GpuMoverTest, StreamsThatNeverDrainDeclareTheDeviceLost) {
  GpuMoverOptions o;
  o.drain_grace_ms = 10;
  auto mover = Make(o);
  Fill(2, 4096);
  api_.SetHold(true);
  api_.AdvanceClockOnPoll(&clock_, 1);
  auto results = mover->Move(H2D(2, 4096, false), clock_.NowMs() + 5);
  for (const auto& r : results) {
    EXPECT_FALSE(r.status.ok());
    EXPECT_NE(r.status.message().find("may still land"), std::string::npos) << r.status;
    EXPECT_EQ(r.bytes, 0u);
  }
  EXPECT_TRUE(mover->device_lost());
  auto later = mover->Move(H2D(2, 4096, false), 0);
  EXPECT_EQ(ToCode(later[0].status), Code::kUnavailable);
  api_.RunPending();  // let the fake finish before the buffers go
}

TEST_F(GpuMoverTest, ALostDeviceFailsEveryRequest) {
  auto mover = Make();
  Fill(3, 128);
  api_.LoseDevice();
  auto results = mover->Move(H2D(3, 128, true), 0);
  for (const auto& r : results) {
    EXPECT_FALSE(r.status.ok());
    EXPECT_EQ(r.bytes, 0u);
  }
}

TEST_F(GpuMoverTest, DeviceToHostCopiesAndMixedSizesCountExactBytes) {
  auto mover = Make();
  Fill(1, 1 << 20);
  std::vector<char> back(1 << 20);
  std::memcpy(device_, host_.data(), host_.size());
  std::vector<GpuMoveRequest> reqs;
  uint64_t pos = 0;
  for (uint64_t size : {1ull, 17ull, 4096ull, 65536ull, 300000ull}) {
    GpuMoveRequest r;
    r.copies.push_back(CopyOp{back.data() + pos, device_ + pos, size});
    reqs.push_back(r);
    pos += size;
  }
  auto results = mover->Move(reqs, 0);
  pos = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok());
    EXPECT_EQ(results[i].bytes, reqs[i].copies[0].length);
    pos += results[i].bytes;
  }
  EXPECT_EQ(std::memcmp(back.data(), host_.data(), pos), 0);
}

}  // namespace
}  // namespace mc::transfer::cuda
