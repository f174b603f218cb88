// GPU put sources wired into the Store service (docs/gpu.md, "What BatchPut does with a GPU
// slice"), against the fake CUDA device: an item's GPU pieces are staged into host memory and
// stored only when each staged piece hashes to the device's hash of its source; the staging
// budget is bounded, shared and returned, and never freed under a lost device.
#include <cstring>
#include <string>
#include <vector>

#include "tests/unit/client/gpu/gpu_store_fixture.h"

namespace mc::client::testing {
namespace {

TEST_F(GpuStore, PutFromAGpuBufferStoresTheDeviceBytesProvedEqualOnTheHost) {
  const std::string pk = Payload(70000, 21);
  std::memcpy(device_ + 8192, pk.data(), pk.size());
  const uint64_t id = RegisterGpu();
  const uint64_t hashes = fake_.hash_launches();
  sv1::BatchPutResponse resp = Put({{"from-gpu", {{id, 8192, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_GT(fake_.hash_launches(), hashes) << "the source is hashed on the device";
  EXPECT_EQ(GetInline("from-gpu"), pk);
  v1::KeyReplicas kr = Lookup("from-gpu");
  ASSERT_EQ(kr.code(), v1::OK);
  EXPECT_EQ(kr.size(), pk.size());
  EXPECT_EQ(stager_.staged_bytes_in_use(), 0u) << "staging memory goes with the request";
  // And back into the GPU buffer, elsewhere, by the device-verified get path.
  sv1::BatchGetResponse back = Get({{"from-gpu", {{id, 131072, pk.size()}}}});
  ASSERT_EQ(back.results(0).code(), sv1::OK) << back.results(0).message();
  EXPECT_EQ(std::string(device_ + 131072, pk.size()), pk);
}

TEST_F(GpuStore, GpuPutSourceWhoseHostCopyDiffersIsNeverStored) {
  const std::string pk = Payload(5000, 22);
  std::memcpy(device_, pk.data(), pk.size());
  const uint64_t id = RegisterGpu();
  // The copy "succeeds" one hundred bytes short: the staged bytes are not the device's.
  fake_.ShortenNextCopy(100);
  sv1::BatchPutResponse short_copy = Put({{"short", {{id, 0, pk.size()}}}});
  EXPECT_EQ(short_copy.results(0).code(), sv1::CHECKSUM_MISMATCH)
      << short_copy.results(0).message();
  EXPECT_EQ(Lookup("short").code(), v1::NOT_FOUND);
  // A corrupted device hash: the bytes arrived, the proof did not.
  fake_.CorruptNextHash();
  sv1::BatchPutResponse bad_hash = Put({{"bad-hash", {{id, 0, pk.size()}}}});
  EXPECT_EQ(bad_hash.results(0).code(), sv1::CHECKSUM_MISMATCH);
  EXPECT_EQ(Lookup("bad-hash").code(), v1::NOT_FOUND);
  // A failed copy.
  fake_.FailNthCopy(0);
  sv1::BatchPutResponse failed = Put({{"failed", {{id, 0, pk.size()}}}});
  EXPECT_EQ(failed.results(0).code(), sv1::TRANSFER_FAILED) << failed.results(0).message();
  EXPECT_EQ(Lookup("failed").code(), v1::NOT_FOUND);
  EXPECT_EQ(stager_.staged_bytes_in_use(), 0u);
  // The same source staged intact is stored.
  ASSERT_EQ(Put({{"short", {{id, 0, pk.size()}}}}).results(0).code(), sv1::OK);
  EXPECT_EQ(GetInline("short"), pk);
}

TEST_F(GpuStore, GpuPutSourcesAreBounded) {
  const uint64_t id = RegisterGpu();
  sv1::BatchPutResponse big = Put({{"big", {{id, 0, kStagingBytes + 1}}}});
  EXPECT_EQ(big.results(0).code(), sv1::INVALID_ARGUMENT);
  EXPECT_NE(big.results(0).message().find("--gpu_put_staging_bytes"), std::string::npos);
  sv1::BatchPutResponse two = Put({{"two", {{id, 0, kStagingBytes / 2}, {id, 0, kStagingBytes}}}});
  EXPECT_EQ(two.results(0).code(), sv1::INVALID_ARGUMENT) << "the item's pieces together";
  const uint64_t huge = ~uint64_t{0};
  EXPECT_EQ(Put({{"oob", {{id, 1, huge}}}}).results(0).code(), sv1::INVALID_ARGUMENT);
  for (const char* key : {"big", "two", "oob"}) EXPECT_EQ(Lookup(key).code(), v1::NOT_FOUND);
  // A daemon with GPU buffers but no stager refuses GPU put sources.
  StoreGrpcService no_stager(StoreServiceOptions{.client_id = kLocalId}, buffers_, putter_, getter_,
                             master_, prefix_leases_, clock_, metrics_);
  no_stager.SetGpuBuffers(&gpu_);
  const auto req = Build<sv1::BatchPutRequest>({{"no-stager", {{id, 0, 100}}}});
  sv1::BatchPutResponse resp;
  ASSERT_TRUE(no_stager.BatchPut(nullptr, &req, &resp).ok());
  EXPECT_EQ(resp.results(0).code(), sv1::INVALID_ARGUMENT);
}

TEST_F(GpuStore, StagingPoolIsPinnedSharedAndReturned) {
  const uint64_t id = RegisterGpu();
  auto item_of = [&](uint64_t offset, uint64_t length) { return GpuItem(id, offset, length); };
  const uint64_t pinned_before = fake_.pinned_allocations();
  std::vector<PutRequestItem> first;
  first.push_back(item_of(0, kStagingBytes - 1000));  // takes kStagingBytes - 768 (aligned)
  GpuPutStager::Staged held = stager_.Stage(first);
  ASSERT_TRUE(first[0].input_error.ok()) << first[0].input_error;
  EXPECT_EQ(fake_.pinned_allocations(), pinned_before + 1) << "the pool is pinned memory";
  EXPECT_EQ(stager_.staged_bytes_in_use(), kStagingBytes - 768);
  EXPECT_NE(first[0].pieces[0].data, reinterpret_cast<char*>(device_)) << "now a host copy";
  EXPECT_EQ(first[0].checksum, Checksum(first[0].pieces[0].data, first[0].pieces[0].length))
      << "hashed once, for the putter too";
  std::vector<PutRequestItem> second;
  second.push_back(item_of(0, 2000));
  second.push_back(item_of(4096, 700));
  {
    GpuPutStager::Staged other = stager_.Stage(second);
    EXPECT_EQ(ToCode(second[0].input_error), Code::kUnavailable) << "does not fit beside";
    EXPECT_NE(second[0].input_error.message().find("--gpu_put_staging_bytes"), std::string::npos)
        << second[0].input_error;
    EXPECT_TRUE(second[1].input_error.ok()) << "fits in what is left";
    EXPECT_EQ(stager_.staged_bytes_in_use(), kStagingBytes);
  }
  EXPECT_EQ(stager_.staged_bytes_in_use(), kStagingBytes - 768);
  { GpuPutStager::Staged gone = std::move(held); }
  EXPECT_EQ(stager_.staged_bytes_in_use(), 0u);
  std::vector<PutRequestItem> again;
  again.push_back(item_of(0, kStagingBytes));
  { GpuPutStager::Staged whole = stager_.Stage(again); }
  EXPECT_TRUE(again[0].input_error.ok()) << "the whole pool again, coalesced";
  EXPECT_EQ(fake_.pinned_allocations(), pinned_before + 1) << "allocated once";
}

TEST_F(GpuStore, StagingMemoryIsNeverFreedUnderALostDevice) {
  // A mover of its own on a fake clock, whose streams never drain.
  FakeClock clock;
  transfer::cuda::GpuMoverOptions o;
  o.clock = &clock;
  o.poll_interval_us = 0;
  o.drain_grace_ms = 10;
  o.streams = 1;
  o.streams_per_move = 1;
  auto mover = transfer::cuda::GpuMover::Create(fake_, o);
  ASSERT_TRUE(mover.ok()) << mover.status();
  GpuPutStager stager(fake_, **mover,
                      GpuPutStagerOptions{.max_staging_bytes = kStagingBytes, .copy_timeout_ms = 5},
                      clock);
  const uint64_t id = RegisterGpu();
  std::vector<PutRequestItem> items;
  items.push_back(GpuItem(id, 0, 4096));
  fake_.SetHold(true);
  fake_.AdvanceClockOnPoll(&clock, 1);
  { GpuPutStager::Staged staged = stager.Stage(items); }
  EXPECT_EQ(ToCode(items[0].input_error), Code::kTransferFailed) << items[0].input_error;
  EXPECT_TRUE((*mover)->device_lost());
  EXPECT_EQ(stager.staged_bytes_in_use(), 4096u) << "left to the device, not reused";
  std::vector<PutRequestItem> later;
  later.push_back(GpuItem(id, 0, 4096));
  { GpuPutStager::Staged staged = stager.Stage(later); }
  EXPECT_EQ(ToCode(later[0].input_error), Code::kUnavailable) << later[0].input_error;
  EXPECT_NE(later[0].input_error.message().find("GPU puts"), std::string::npos);
  EXPECT_EQ(stager.staged_bytes_in_use(), 4096u);
  // The held copy lands now: into memory still allocated (ASan would report a write into freed
  // memory otherwise).
  fake_.SetHold(false);
  fake_.RunPending();
}

TEST_F(GpuStore, ScatteredAndMixedGpuPutSourcesAreStagedAndProved) {
  const uint64_t id = RegisterGpu();
  const std::string a = Payload(1000, 16), b = Payload(3000, 17);
  std::memcpy(device_ + 4096, a.data(), a.size());
  std::memcpy(device_ + 65536, b.data(), b.size());
  ASSERT_EQ(Put({{"two", {{id, 4096, a.size()}, {id, 65536, b.size()}}}}).results(0).code(),
            sv1::OK);
  EXPECT_EQ(GetInline("two"), a + b);
  EXPECT_EQ(Lookup("two").checksum(), Checksum((a + b).data(), a.size() + b.size()));
  char* host = nullptr;
  const uint64_t hid = RegisterHost(4096, &host);
  std::memcpy(host, "header", 6);
  ASSERT_EQ(Put({{"mixed", {{hid, 0, 6}, {id, 65536, b.size()}}}}).results(0).code(), sv1::OK);
  EXPECT_EQ(GetInline("mixed"), "header" + b);
  // One GPU piece whose staged copy differs from the device: nothing stored.
  fake_.CorruptNextHash();
  sv1::BatchPutResponse bad = Put({{"bad", {{hid, 0, 6}, {id, 4096, a.size()}}}});
  EXPECT_EQ(bad.results(0).code(), sv1::CHECKSUM_MISMATCH) << bad.results(0).message();
  EXPECT_EQ(Lookup("bad").code(), v1::NOT_FOUND);
  EXPECT_EQ(stager_.staged_bytes_in_use(), 0u);
}

}  // namespace
}  // namespace mc::client::testing
