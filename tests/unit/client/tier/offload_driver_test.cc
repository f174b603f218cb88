// OffloadDriver against the real master in-process (FakeMasterClient on a FakeClock) and a real
// DiskTier in a temp dir: OFFLOAD tasks persist and report, changed memory is never persisted,
// DROP deletes, the reclaim guard refuses leased records, READ_DISK requests check the key tag
// and the range (served by a data server without a transport), records are re-reported after a
// (master) restart, and a get falls back to the DISK replica.
#include "client/tier/offload_driver.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/batch/gpu_get_stager.h"
#include "client/gpu/gpu_buffers.h"
#include "common/checksum.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_cuda.h"
#include "tests/fakes/loopback_data_server.h"
#include "tests/unit/client/client_test_util.h"
#include "tests/unit/offload/offload_test_util.h"
#include "transfer/data_server.h"

namespace mc::client {
namespace {

using testing::ClientFixture;
using testing::CodeOf;
using testing::DestArena;
using testing::kLocalEndpoint;
using testing::kLocalId;
using testing::Payload;

constexpr uint64_t kDiskCapacity = 16 << 20;
constexpr int64_t kTaskTimeoutMs = 100;

master::MasterOptions MasterWithOffload() {
  master::MasterOptions o = FakeMasterClient::DefaultOptions();
  o.offload.watermark = 0.0;  // every COMPLETE memory-only object is planned
  o.offload.task_timeout_ms = kTaskTimeoutMs;
  return o;
}

class OffloadDriverTest : public ClientFixture {
 protected:
  OffloadDriverTest() : ClientFixture(MasterWithOffload()) {}

  void SetUp() override {
    local_ = RegisterWithDisk(master_);
    OpenTier();
  }
  void TearDown() override {
    driver_.reset();
    tier_.reset();
  }

  // Registers the local client with 2 x 1 MiB segments and an SSD tier.
  std::unique_ptr<testing::FakeSegments> RegisterWithDisk(FakeMasterClient& master) {
    auto segs = std::make_unique<testing::FakeSegments>();
    segs->client_id = kLocalId;
    segs->endpoint = kLocalEndpoint;
    segs->table = &local_table_;
    v1::RegisterClientRequest req;
    req.set_client_id(kLocalId);
    req.set_host("host-a");
    req.set_data_endpoint(kLocalEndpoint);
    req.set_disk_capacity(kDiskCapacity);
    for (int i = 0; i < 2; ++i) {
      auto* s = req.add_segments();
      s->set_local_index(i);
      s->set_size(1 << 20);
      segs->backing.emplace_back(1 << 20, '\0');
    }
    v1::RegisterClientResponse resp;
    absl::Status s = master.RegisterClient(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    session_ = resp.session();
    for (int i = 0; i < resp.segment_ids_size(); ++i) {
      segs->ids.push_back(resp.segment_ids(i));
      local_table_.Add(resp.segment_ids(i), segs->backing[i].data(), 1 << 20);
    }
    return segs;
  }

  void OpenTier(MasterClient* master = nullptr, int64_t reclaim_backoff_ms = 5000) {
    driver_.reset();
    tier_.reset();
    offload::DiskTierOptions o;
    o.dir = dir_.path();
    o.capacity = kDiskCapacity;
    o.num_files = 2;
    o.metrics = &tier_metrics_;
    o.reclaim_guard = [this](const std::vector<offload::DiskTierVictim>& v) {
      return driver_ ? driver_->MayReclaim(v) : std::vector<bool>(v.size(), false);
    };
    auto tier = offload::DiskTier::Open(std::move(o));
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = std::move(*tier);
    driver_ = std::make_unique<OffloadDriver>(
        OffloadDriverOptions{.client_id = kLocalId,
                             .poll_interval_ms = 100,
                             .max_tasks_per_poll = 64,
                             .report_batch = 1000,
                             .reclaim_backoff_ms = reclaim_backoff_ms,
                             .clock = &clock_},
        *tier_, master != nullptr ? *master : static_cast<MasterClient&>(master_), local_table_,
        [this] { return session_.load(); }, registry_);
  }

  uint64_t Offloads(const char* result) {
    return registry_.GetCounter("mc_client_offloads_total", "", {{"result", result}}).Value();
  }
  bool HasDiskReplica(const std::string& key) {
    const v1::KeyReplicas kr = Lookup(key);
    for (const auto& r : kr.replicas()) {
      if (r.tier() == v1::DISK) return true;
    }
    return false;
  }
  std::vector<std::string> TierKeys() {
    std::vector<std::string> keys;
    for (const auto& e : tier_->List()) keys.push_back(e.key);
    return keys;
  }
  // Puts `key` and runs the planner and one driver iteration.
  void PutAndOffload(const std::string& key, const std::string& payload) {
    PutOk(key, payload);
    master_.service().RunMaintenance();
    driver_->RunOnce();
  }

  offload::testing_util::TempDir dir_;
  MetricsRegistry tier_metrics_;
  std::atomic<uint64_t> session_{0};
  std::unique_ptr<offload::DiskTier> tier_;
  std::unique_ptr<OffloadDriver> driver_;
};

TEST_F(OffloadDriverTest, OffloadTaskPersistsTheRecordAndReportsTheDiskReplica) {
  const std::string p = Payload(100'003, 1);
  PutAndOffload("k1", p);
  EXPECT_EQ(Offloads("ok"), 1u);
  ASSERT_EQ(TierKeys(), std::vector<std::string>{"k1"});
  v1::KeyReplicas kr = Lookup("k1");
  EXPECT_TRUE(HasDiskReplica("k1"));
  offload::DiskTier::Entry e = tier_->List()[0];
  EXPECT_EQ(e.generation, kr.generation());
  EXPECT_EQ(e.checksum, Checksum(p.data(), p.size()));
  // The record holds exactly the payload.
  std::string back(p.size(), '\0');
  ASSERT_TRUE(tier_->Read(e.ref, "k1", e.generation, {{back.data(), back.size()}}).ok());
  EXPECT_EQ(back, p);
  // Offloading a persisted object again is a no-op that fails nothing (one record).
  master_.service().RunMaintenance();
  driver_->RunOnce();
  EXPECT_EQ(tier_->List().size(), 1u);
  EXPECT_EQ(Offloads("failed"), 0u);
}

TEST_F(OffloadDriverTest, ManyTasksRunInParallelAndAllPersist) {
  std::vector<std::string> payloads;
  for (int i = 0; i < 20; ++i) {
    payloads.push_back(Payload(40'000 + i, 100 + i));
    PutOk("p" + std::to_string(i), payloads.back());
  }
  master_.service().RunMaintenance();
  EXPECT_TRUE(driver_->RunOnce());
  EXPECT_EQ(Offloads("ok"), 20u);
  EXPECT_EQ(tier_->List().size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(HasDiskReplica("p" + std::to_string(i))) << i;
  EXPECT_FALSE(driver_->RunOnce()) << "no task left";
}

TEST_F(OffloadDriverTest, TheThreadPollsEveryIntervalAndAgainAtOnceWhileTasksCome) {
  for (int i = 0; i < 3; ++i) PutOk("t" + std::to_string(i), Payload(10'000 + i, 60 + i));
  master_.service().RunMaintenance();  // plans the three OFFLOAD tasks
  using Rpc = FakeMasterClient::Rpc;
  const int polls = master_.Calls(Rpc::kTakeOffloadTasks);
  driver_->Start();
  ASSERT_TRUE(clock_.AwaitWaiting(1));
  EXPECT_EQ(master_.Calls(Rpc::kTakeOffloadTasks), polls) << "the first poll waits an interval";
  clock_.AdvanceMs(100);
  // Back to waiting: the poll that brought the tasks, and the one at once after it, are done.
  ASSERT_TRUE(clock_.AwaitWaitsBegun(2));
  EXPECT_EQ(master_.Calls(Rpc::kTakeOffloadTasks), polls + 2);
  EXPECT_EQ(driver_->rounds(), 2u);
  EXPECT_EQ(Offloads("ok"), 3u);
  clock_.AdvanceMs(100);
  ASSERT_TRUE(clock_.AwaitWaitsBegun(3));
  EXPECT_EQ(master_.Calls(Rpc::kTakeOffloadTasks), polls + 3) << "an empty poll: wait again";
  driver_->Stop();
}

TEST_F(OffloadDriverTest, RecordFailingVerificationIsReportedAndDeleted) {
  const std::string p = Payload(100'000, 77);
  PutAndOffload("k1", p);
  ASSERT_TRUE(HasDiskReplica("k1"));
  offload::DiskTier::Entry e = tier_->List().at(0);
  // Flip one payload byte in the data file, behind the running tier's back.
  bool flipped = false;
  for (const auto& f : std::filesystem::directory_iterator(dir_.path())) {
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(io)), std::istreambuf_iterator<char>());
    size_t at = data.find(p.substr(0, 4096));
    if (at == std::string::npos) continue;
    io.clear();
    io.seekp(static_cast<std::streamoff>(at + 5000));
    io.put(static_cast<char>(data[at + 5000] ^ 0x5A));
    io.close();
    flipped = true;
  }
  ASSERT_TRUE(flipped);
  std::string back(p.size(), '\0');
  transfer::LocalBuffer dst{back.data(), back.size()};
  EXPECT_EQ(
      CodeOf(driver_->ReadLocal("k1", e.generation, e.ref.locator, e.ref.length, {dst}, nullptr)),
      Code::kChecksumMismatch);
  driver_->RunOnce();  // reports it to the master, then deletes it
  EXPECT_FALSE(HasDiskReplica("k1"));
  EXPECT_TRUE(tier_->List().empty());
  EXPECT_EQ(registry_.GetCounter("mc_client_disk_corrupt_dropped_total", "").Value(), 1u);
}

TEST_F(OffloadDriverTest, TaskWhoseMemoryChangedIsNotPersisted) {
  PutOk("k1", Payload(8192, 2));
  master_.service().RunMaintenance();  // the task is queued with the put's checksum
  ASSERT_TRUE(Scribble("k1", *local_, 100));
  driver_->RunOnce();
  EXPECT_EQ(Offloads("changed"), 1u);
  EXPECT_EQ(Offloads("ok"), 0u);
  EXPECT_TRUE(tier_->List().empty());
  EXPECT_FALSE(HasDiskReplica("k1"));
}

TEST_F(OffloadDriverTest, DuplicateTasksOfOneKeyInOneBatchWriteOneRecordAndFailNothing) {
  const std::string p1 = Payload(50'000, 3), p2 = Payload(7'000, 33);
  PutOk("k1", p1);
  // The planner queues k1 three times (each earlier task "timed out" before the driver ran).
  for (int i = 0; i < 3; ++i) {
    master_.service().RunMaintenance();
    clock_.AdvanceMs(kTaskTimeoutMs + 1);
  }
  PutOk("k2", p2);  // a neighbour in the same batch of tasks
  master_.service().RunMaintenance();
  driver_->RunOnce();
  EXPECT_EQ(Offloads("failed"), 0u);
  EXPECT_EQ(Offloads("gone"), 0u);
  EXPECT_GE(Offloads("ok"), 2u);
  std::vector<offload::DiskTier::Entry> entries = tier_->List();
  ASSERT_EQ(entries.size(), 2u) << "one record per (key, generation)";
  EXPECT_TRUE(HasDiskReplica("k1"));
  EXPECT_TRUE(HasDiskReplica("k2"));
  EXPECT_EQ(tier_metrics_.GetCounter("mc_ssd_writes_total", "").Value(), 2u);
  for (const auto& e : entries) {
    const std::string& p = e.key == "k1" ? p1 : p2;
    std::string back(p.size(), '\0');
    ASSERT_TRUE(tier_->Read(e.ref, e.key, e.generation, {{back.data(), back.size()}}).ok());
    EXPECT_EQ(back, p);
  }
}

TEST_F(OffloadDriverTest, DropTaskRemovesTheRecord) {
  PutAndOffload("k1", Payload(8192, 4));
  PutAndOffload("k2", Payload(8192, 5));
  ASSERT_EQ(tier_->List().size(), 2u);
  v1::RemoveRequest rm;
  rm.add_keys("k1");
  v1::RemoveResponse rm_resp;
  ASSERT_TRUE(master_.Remove(rm, &rm_resp).ok());
  ASSERT_EQ(rm_resp.results(0).code(), v1::OK);
  driver_->RunOnce();
  EXPECT_EQ(TierKeys(), std::vector<std::string>{"k2"});
  EXPECT_EQ(registry_.GetCounter("mc_client_disk_drops_total", "").Value(), 1u);
}

TEST_F(OffloadDriverTest, MayReclaimRefusesLeasedRecordsUntilReleased) {
  PutAndOffload("k1", Payload(8192, 6));
  offload::DiskTier::Entry e = tier_->List().at(0);
  std::vector<offload::DiskTierVictim> victims{{e.key, e.generation, e.ref.locator, e.ref.length}};
  v1::GetReplicasRequest get;
  get.add_keys("k1");
  get.set_lease_ttl_ms(60'000);
  v1::GetReplicasResponse leased;
  ASSERT_TRUE(master_.GetReplicas(get, &leased).ok());
  ASSERT_NE(leased.lease_id(), 0u);
  EXPECT_EQ(driver_->MayReclaim(victims), std::vector<bool>{false});
  EXPECT_TRUE(HasDiskReplica("k1"));
  v1::ReleaseLeasesRequest rel;
  rel.set_lease_id(leased.lease_id());
  rel.add_keys("k1");
  ASSERT_TRUE(master_.ReleaseLeases(rel).ok());
  EXPECT_EQ(driver_->MayReclaim(victims), std::vector<bool>{true});
  EXPECT_FALSE(HasDiskReplica("k1"));
}

TEST_F(OffloadDriverTest, TierEvictionSkipsLeasedRecordsAndReclaimsTheNextColdest) {
  // The two coldest records are leased by a reader; the tier, over its watermark, must reclaim
  // the next-coldest ones instead of failing the write (it used to answer NO_SPACE as soon as
  // one round's victims were all refused).
  const uint64_t kRecord = 1 << 20;
  PutAndOffload("k0", Payload(kRecord, 20));
  PutAndOffload("k1", Payload(kRecord, 21));  // each fills one of the two 1 MiB segments
  ASSERT_TRUE(HasDiskReplica("k0"));
  ASSERT_TRUE(HasDiskReplica("k1"));
  v1::GetReplicasRequest get;
  get.add_keys("k0");
  get.add_keys("k1");
  get.set_lease_ttl_ms(60'000);
  v1::GetReplicasResponse leased;
  ASSERT_TRUE(master_.GetReplicas(get, &leased).ok());
  ASSERT_NE(leased.lease_id(), 0u);
  // Fill the tier (16 MiB, reclaims above 95%) with records the master does not know.
  const std::string filler = Payload(kRecord, 22);
  for (int i = 0; i < 13; ++i) {
    auto ref = tier_->Write("filler-" + std::to_string(i), 1'000 + i, {{filler.data(), kRecord}});
    ASSERT_TRUE(ref.ok()) << i << ": " << ref.status();
  }
  auto ref = tier_->Write("one-more", 2'000, {{filler.data(), kRecord}});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<std::string> keys = TierKeys();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "k0"), keys.end()) << "leased record reclaimed";
  EXPECT_NE(std::find(keys.begin(), keys.end(), "k1"), keys.end()) << "leased record reclaimed";
  EXPECT_EQ(std::find(keys.begin(), keys.end(), "filler-0"), keys.end());
  EXPECT_GT(tier_metrics_.GetCounter("mc_ssd_evictions_total", "").Value(), 0u);
  EXPECT_TRUE(HasDiskReplica("k0"));
  EXPECT_TRUE(HasDiskReplica("k1"));
}

TEST_F(OffloadDriverTest, MayReclaimBacksOffAfterTheMasterFailsToAnswer) {
  OpenTier(nullptr, /*reclaim_backoff_ms=*/200);
  PutAndOffload("k1", Payload(8192, 8));
  offload::DiskTier::Entry e = tier_->List().at(0);
  std::vector<offload::DiskTierVictim> victims{{e.key, e.generation, e.ref.locator, e.ref.length}};
  using Rpc = FakeMasterClient::Rpc;
  master_.FailNext(Rpc::kRemoveDiskReplicas, 1);
  const int before = master_.Calls(Rpc::kRemoveDiskReplicas);
  EXPECT_EQ(driver_->MayReclaim(victims), std::vector<bool>{false});
  // Within the backoff: refused at once, without another RPC (a hung master would cost one
  // timeout per reclaim round otherwise).
  EXPECT_EQ(driver_->MayReclaim(victims), std::vector<bool>{false});
  EXPECT_EQ(master_.Calls(Rpc::kRemoveDiskReplicas), before + 1);
  EXPECT_TRUE(HasDiskReplica("k1"));
  clock_.AdvanceMs(199);
  EXPECT_EQ(driver_->MayReclaim(victims), std::vector<bool>{false});
  EXPECT_EQ(master_.Calls(Rpc::kRemoveDiskReplicas), before + 1) << "still inside the backoff";
  clock_.AdvanceMs(1);
  EXPECT_EQ(driver_->MayReclaim(victims), std::vector<bool>{true});
  EXPECT_EQ(master_.Calls(Rpc::kRemoveDiskReplicas), before + 2);
  EXPECT_FALSE(HasDiskReplica("k1"));
}

TEST_F(OffloadDriverTest, MayReclaimRefusesEverythingWhileUnregistered) {
  PutAndOffload("k1", Payload(8192, 7));
  offload::DiskTier::Entry e = tier_->List().at(0);
  session_ = 0;
  EXPECT_EQ(driver_->MayReclaim({{e.key, e.generation, e.ref.locator, e.ref.length}}),
            std::vector<bool>{false});
}

// The driver's READ_DISK handler behind a data server without a transport
// (tests/fakes/loopback_data_server.h): it sees only the transport-neutral request and stream.
transfer::LoopbackDataServer ServingReadDisk(OffloadDriver& driver) {
  transfer::LoopbackDataServer server;
  EXPECT_TRUE(
      server
          .RegisterOpHandler(transfer::DataOp::kReadDisk,
                             [&driver](const transfer::DataRequest& r, transfer::RequestStream& s) {
                               return driver.ServeReadDisk(r, s);
                             })
          .ok());
  EXPECT_TRUE(server.Start().ok());
  return server;
}

transfer::DataRequest ReadDisk(const offload::DiskTier::Entry& e, uint32_t key_tag) {
  return {.op = transfer::DataOp::kReadDisk,
          .segment_id = e.generation,
          .offset = e.ref.locator,
          .length = e.ref.length,
          .key_tag = key_tag};
}

TEST_F(OffloadDriverTest, ServeReadDiskChecksTheKeyTag) {
  const std::string p = Payload(20'000, 8);
  PutAndOffload("k1", p);
  offload::DiskTier::Entry e = tier_->List().at(0);
  transfer::LoopbackDataServer server = ServingReadDisk(*driver_);

  transfer::LoopbackResponse ok = server.Serve(ReadDisk(e, DiskKeyTag("k1")));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.code, Code::kOk);
  EXPECT_EQ(ok.payload, p);

  transfer::LoopbackResponse wrong_tag = server.Serve(ReadDisk(e, DiskKeyTag("k1") ^ 1));
  ASSERT_TRUE(wrong_tag.status.ok()) << wrong_tag.status;
  EXPECT_EQ(wrong_tag.code, Code::kNotFound);
  EXPECT_TRUE(wrong_tag.payload.empty());

  transfer::DataRequest other = ReadDisk(e, DiskKeyTag("k1"));
  other.segment_id = e.generation + 1;  // a generation we hold no record of
  transfer::LoopbackResponse wrong_gen = server.Serve(other);
  ASSERT_TRUE(wrong_gen.status.ok()) << wrong_gen.status;
  EXPECT_EQ(wrong_gen.code, Code::kNotFound);
  EXPECT_TRUE(wrong_gen.payload.empty());
  EXPECT_EQ(server.closed_connections(), 0);
}

// A reader may name any locator and length: a range that is not the record's is refused with an
// error response (the connection stays usable), never read past the record.
TEST_F(OffloadDriverTest, ServeReadDiskRefusesARangeThatIsNotTheRecord) {
  const std::string p = Payload(20'000, 10);
  PutAndOffload("k1", p);
  offload::DiskTier::Entry e = tier_->List().at(0);
  transfer::LoopbackDataServer server = ServingReadDisk(*driver_);
  for (auto [locator, length] :
       {std::pair{e.ref.locator, e.ref.length - 1}, std::pair{e.ref.locator, e.ref.length + 4096},
        std::pair{e.ref.locator + 4096, e.ref.length}}) {
    transfer::DataRequest r = ReadDisk(e, DiskKeyTag("k1"));
    r.offset = locator;
    r.length = length;
    transfer::LoopbackResponse out = server.Serve(r);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_NE(out.code, Code::kOk) << locator << " " << length;
    EXPECT_TRUE(out.payload.empty());
  }
  // A length that is not the record's is refused before any memory is taken for it (a huge one
  // used to reach the allocation, and answer NO_SPACE when it failed).
  transfer::DataRequest huge = ReadDisk(e, DiskKeyTag("k1"));
  huge.length = uint64_t{1} << 62;
  EXPECT_EQ(server.Serve(huge).code, Code::kSizeMismatch);
  EXPECT_EQ(server.closed_connections(), 0);
  EXPECT_EQ(server.Serve(ReadDisk(e, DiskKeyTag("k1"))).payload, p);
}

TEST_F(OffloadDriverTest, GetFallsBackToTheDiskReplicaWhenMemoryIsCorrupt) {
  const std::string p = Payload(30'000, 9);
  PutAndOffload("k1", p);
  ASSERT_TRUE(HasDiskReplica("k1"));
  getter_.SetDiskReader(driver_.get());
  ASSERT_TRUE(Scribble("k1", *local_, 5));
  DestArena arena(p.size());
  std::vector<GetRequestItem> items(1);
  items[0].key = "k1";
  items[0].slices = arena.Slices(0, p.size(), 3);
  auto res = getter_.Get(items, 0, nullptr);
  ASSERT_EQ(res.size(), 1u);
  ASSERT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(arena.Bytes(0, p.size()), p);
  EXPECT_EQ(tier_metrics_.GetCounter("mc_ssd_reads_total", "").Value(), 1u);
}

// A GPU destination (scattered over two GPU slices, so it is staged) of a key whose memory
// replica is corrupt: the SSD record is read into pinned staging memory by the tier, verified,
// and copied into GPU memory by the device, each slice proved by its device hash.
TEST_F(OffloadDriverTest, GpuDestinationIsServedFromTheDiskTierThroughStaging) {
  const std::string p = Payload(30'000, 10);
  PutAndOffload("k1", p);
  ASSERT_TRUE(HasDiskReplica("k1"));
  getter_.SetDiskReader(driver_.get());
  ASSERT_TRUE(Scribble("k1", *local_, 7));
  transfer::cuda::FakeCudaApi api(1);
  transfer::cuda::GpuMoverOptions mo;
  mo.streams = 1;
  auto mover = transfer::cuda::GpuMover::Create(api, mo);
  ASSERT_TRUE(mover.ok()) << mover.status();
  GpuGetStager stager(api, **mover, GpuGetStagerOptions{.pool_bytes = 1 << 20}, RealClock::Get());
  getter_.SetGpuStager(&stager);
  char* device = api.AllocDevice(1 << 16);
  GpuBufferRegistry gpu(api, nullptr);
  GpuBufferSpec spec;
  const std::vector<uint8_t> handle = api.ExportIpc(device, 1 << 16);
  spec.handle = handle;
  spec.size = 1 << 16;
  absl::StatusOr<uint64_t> id = gpu.Register(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<GetRequestItem> items(1);
  items[0].key = "k1";
  for (uint64_t offset : {uint64_t{0}, uint64_t{32768}}) {
    GpuBufferRef ref;
    absl::StatusOr<uint64_t> addr = gpu.Resolve(*id, offset, 15'000, &ref);
    ASSERT_TRUE(addr.ok()) << addr.status();
    items[0].gpu.Add(items[0].slices.size(), std::move(ref));
    items[0].slices.push_back({reinterpret_cast<char*>(*addr), 15'000});
  }
  const uint64_t hashes = api.hash_launches();
  auto res = getter_.Get(items, 0, nullptr);
  ASSERT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(res[0].bytes_written, p.size());
  EXPECT_EQ(std::string(device, 15'000), p.substr(0, 15'000));
  EXPECT_EQ(std::string(device + 32768, 15'000), p.substr(15'000));
  EXPECT_EQ(tier_metrics_.GetCounter("mc_ssd_reads_total", "").Value(), 1u);
  EXPECT_GT(api.hash_launches(), hashes);
  EXPECT_EQ(stager.bytes_in_use(), 0u);
  getter_.SetGpuStager(nullptr);
}

// The get path takes the tier's hash of the destination as its proof instead of hashing the
// bytes again: a reader whose hash disagrees with the master's checksum fails the get.
TEST_F(OffloadDriverTest, GetFromTheOwnTierIsProvedByTheTiersHashOfTheDestination) {
  class SkewedHash final : public DiskReader {
   public:
    explicit SkewedHash(DiskReader& real) : real_(real) {}
    absl::Status ReadLocal(std::string_view key, uint64_t generation, uint64_t locator,
                           uint64_t length, const std::vector<transfer::LocalBuffer>& dst,
                           uint64_t* checksum) override {
      absl::Status s = real_.ReadLocal(key, generation, locator, length, dst, checksum);
      if (s.ok()) ++*checksum;
      return s;
    }

   private:
    DiskReader& real_;
  };
  const std::string p = Payload(30'000, 11);
  PutAndOffload("k1", p);
  ASSERT_TRUE(HasDiskReplica("k1"));
  ASSERT_TRUE(Scribble("k1", *local_, 5));  // the memory replica fails: the SSD one is read
  DestArena arena(p.size());
  std::vector<GetRequestItem> items(1);
  items[0].key = "k1";
  items[0].slices = arena.Slices(0, p.size(), 2);

  SkewedHash skewed(*driver_);
  getter_.SetDiskReader(&skewed);
  auto bad = getter_.Get(items, 0, nullptr);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(CodeOf(bad[0].status), Code::kChecksumMismatch) << bad[0].status;

  getter_.SetDiskReader(driver_.get());
  auto good = getter_.Get(items, 0, nullptr);
  ASSERT_EQ(good.size(), 1u);
  ASSERT_TRUE(good[0].status.ok()) << good[0].status;
  EXPECT_EQ(arena.Bytes(0, p.size()), p);
}

TEST_F(OffloadDriverTest, RecordsAreReportedAgainToARestartedMaster) {
  const std::string p = Payload(40'000, 10);
  PutAndOffload("k1", p);
  const uint64_t generation = tier_->List().at(0).generation;
  // A fresh master knows nothing; the client registers again and reports its records.
  FakeMasterClient fresh(clock_, MasterWithOffload());
  local_table_.Clear();
  local_ = RegisterWithDisk(fresh);
  OpenTier(&fresh);  // reopened: the index is rebuilt by scanning the files
  driver_->RunOnce();
  v1::GetReplicasRequest req;
  req.add_keys("k1");
  req.set_no_lease(true);
  v1::GetReplicasResponse resp;
  ASSERT_TRUE(fresh.GetReplicas(req, &resp).ok());
  ASSERT_EQ(resp.results(0).code(), v1::OK) << resp.results(0).message();
  EXPECT_EQ(resp.results(0).generation(), generation);
  ASSERT_EQ(resp.results(0).replicas_size(), 1);
  EXPECT_EQ(resp.results(0).replicas(0).tier(), v1::DISK);
  EXPECT_EQ(registry_.GetCounter("mc_client_disk_records_reported_total", "").Value(), 1u);
  // And a new put never reuses the recovered generation.
  v1::PutStartRequest ps;
  ps.set_client_id(kLocalId);
  auto* item = ps.add_items();
  item->set_key("k2");
  item->set_size(100);
  v1::PutStartResponse ps_resp;
  ASSERT_TRUE(fresh.PutStart(ps, &ps_resp).ok());
  ASSERT_EQ(ps_resp.results(0).code(), v1::OK);
  EXPECT_GT(ps_resp.results(0).generation(), generation);
}

}  // namespace
}  // namespace mc::client
