// GPU buffers wired into the Store service (docs/gpu.md), against the fake CUDA device: a buffer
// registered through GpuBuffers is a BatchGet destination whose bytes land in device memory and
// are OK only with the matching device hash (direct from a local replica, or staged through
// pinned host memory); unknown, out-of-bounds and other owners' GPU ids are refused, never a
// wrong OK; registration by CUDA IPC handle or POSIX-fd ticket, device UUIDs. GpuBuffers admits
// callers as Store does (a real gRPC server over loopback TCP). Puts: gpu_store_put_test.cc.
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "tests/unit/client/gpu/gpu_store_fixture.h"

namespace mc::client::testing {
namespace {

TEST_F(GpuStore, GetIntoARegisteredGpuBufferLandsTheBytesVerifiedByTheDeviceHash) {
  const std::string pk = Payload(5000, 1);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu(4096, 65536);
  const uint64_t hashes = fake_.hash_launches();
  sv1::BatchGetResponse resp = Get({{"k", {{id, 100, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(resp.results(0).bytes_written(), pk.size());
  EXPECT_EQ(std::string(device_ + 4096 + 100, pk.size()), pk);
  EXPECT_TRUE(DeviceUntouched(0, 4096 + 100));
  EXPECT_GT(fake_.hash_launches(), hashes) << "a GPU destination is proven by the device hash";
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 0u);
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
  EXPECT_EQ(get_stager_.bytes_in_use(), 0u);
  EXPECT_EQ(metrics_.duplicate_keys.Value(), 0u);
}

TEST_F(GpuStore, AKeysOnlyGpuDestinationWithALocalReplicaIsReadDirectlyNotStaged) {
  const std::string pk = Payload(2000, 11);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  const uint64_t pinned = fake_.pinned_allocations();
  ASSERT_EQ(Get({{"k", {{id, 0, pk.size()}}}}).results(0).code(), sv1::OK);
  EXPECT_EQ(fake_.pinned_allocations(), pinned) << "the staging pool was never needed";
}

TEST_F(GpuStore, CorruptedDeviceHashIsChecksumMismatchNotOk) {
  const std::string pk = Payload(3000, 2);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  fake_.CorruptNextHash();  // the bytes land intact: only the CPU re-reading them would say OK
  sv1::BatchGetResponse resp = Get({{"k", {{id, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::CHECKSUM_MISMATCH) << resp.results(0).message();
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 1u);
}

TEST_F(GpuStore, ShortCopyReportedAsSuccessIsNeverOk) {
  const std::string pk = Payload(3000, 3);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  fake_.ShortenNextCopy(100);
  sv1::BatchGetResponse resp = Get({{"k", {{id, 0, pk.size()}}}});
  EXPECT_NE(resp.results(0).code(), sv1::OK);
}

TEST_F(GpuStore, UnknownUnregisteredAndOtherOwnersGpuIdsAreRefused) {
  const std::string pk = Payload(2000, 4);
  PutOk("k", pk);
  // Bit 63 set, never registered.
  EXPECT_EQ(Get({{"k", {{kGpuBufferIdBit | 77, 0, pk.size()}}}}).results(0).code(),
            sv1::INVALID_ARGUMENT);
  // Registered, then unregistered.
  const uint64_t gone = RegisterGpu();
  sv1::UnregisterGpuBufferRequest un;
  un.set_buffer_id(gone);
  sv1::UnregisterGpuBufferResponse un_resp;
  ASSERT_TRUE(gpu_service_.UnregisterGpuBuffer(nullptr, &un, &un_resp).ok());
  EXPECT_EQ(Get({{"k", {{gone, 0, pk.size()}}}}).results(0).code(), sv1::INVALID_ARGUMENT);
  // Another caller's buffer: neither usable nor removable by this one (owner "").
  const std::vector<uint8_t> handle = fake_.ExportIpc(device_, kDeviceBytes);
  GpuBufferSpec spec;
  spec.handle = handle;
  spec.size = kDeviceBytes;
  absl::StatusOr<uint64_t> theirs = gpu_.Register(spec, "anon:10.0.0.9");
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  sv1::BatchGetResponse resp = Get({{"k", {{*theirs, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::INVALID_ARGUMENT);
  EXPECT_EQ(resp.results(0).bytes_written(), 0u);
  EXPECT_TRUE(DeviceUntouched(0, kDeviceBytes));
  un.set_buffer_id(*theirs);
  EXPECT_EQ(gpu_service_.UnregisterGpuBuffer(nullptr, &un, &un_resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(gpu_.Count(), 1u) << "another caller's buffer stays registered";
  EXPECT_TRUE(gpu_.Unregister(*theirs, "anon:10.0.0.9").ok());
}

TEST_F(GpuStore, SlicesOutsideTheGpuBufferAreRefusedWithoutOverflow) {
  const std::string pk = Payload(2000, 5);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu(0, 4096);
  const uint64_t huge = ~uint64_t{0};
  for (SliceSpec s :
       {SliceSpec{id, 4096 - pk.size() + 1, pk.size()}, SliceSpec{id, huge, pk.size()},
        SliceSpec{id, huge - 10, pk.size()}, SliceSpec{id, 0, huge}}) {
    sv1::BatchGetResponse resp = Get({{"k", {s}}});
    EXPECT_NE(resp.results(0).code(), sv1::OK) << s.offset << "+" << s.length;
  }
  // The overflowing ones are refused at resolution, not later.
  EXPECT_EQ(Get({{"k", {{id, huge, pk.size()}}}}).results(0).code(), sv1::INVALID_ARGUMENT);
  EXPECT_EQ(Get({{"k", {{id, 1, huge}}}}).results(0).code(), sv1::INVALID_ARGUMENT);
  EXPECT_TRUE(DeviceUntouched(0, kDeviceBytes));
}

TEST_F(GpuStore, ScatteredAndMixedGpuDestinationsAreFilledThroughStaging) {
  const std::string pk = Payload(4000, 6);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  const uint64_t hashes = fake_.hash_launches();
  // Two GPU slices of one item.
  sv1::BatchGetResponse resp = Get({{"k", {{id, 0, 2000}, {id, 8192, 2000}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(resp.results(0).bytes_written(), pk.size());
  EXPECT_EQ(std::string(device_, 2000), pk.substr(0, 2000));
  EXPECT_EQ(std::string(device_ + 8192, 2000), pk.substr(2000));
  EXPECT_TRUE(DeviceUntouched(2000, 8192 - 2000));
  EXPECT_GT(fake_.hash_launches(), hashes) << "each GPU slice proven by its device hash";
  // A host slice (a vLLM block's header) and a GPU slice (its KV) in one item.
  char* host = nullptr;
  const uint64_t hid = RegisterHost(4096, &host);
  resp = Get({{"k", {{hid, 0, 100}, {id, 16384, 3900}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(std::string(host, 100), pk.substr(0, 100));
  EXPECT_EQ(std::string(device_ + 16384, 3900), pk.substr(100));
  // The same through a block layout (block 1 of a header run and a GPU run).
  sv1::BatchGetRequest layout;
  auto* run = layout.add_block_layout();
  run->set_buffer_id(hid);
  run->set_length(100);
  run->set_stride(100);
  run = layout.add_block_layout();
  run->set_buffer_id(id);
  run->set_offset(32768);
  run->set_length(3900);
  run->set_stride(4096);
  auto* item = layout.add_items();
  item->set_key("k");
  item->mutable_block()->set_index(1);
  sv1::BatchGetResponse by_layout;
  ASSERT_TRUE(service_.BatchGet(nullptr, &layout, &by_layout).ok());
  ASSERT_EQ(by_layout.results(0).code(), sv1::OK) << by_layout.results(0).message();
  EXPECT_EQ(std::string(host + 100, 100), pk.substr(0, 100));
  EXPECT_EQ(std::string(device_ + 32768 + 4096, 3900), pk.substr(100));
  // One piece failing its device hash fails the item, never OK.
  fake_.CorruptNextHash();
  resp = Get({{"k", {{id, 65536, 1000}, {id, 98304, 3000}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::CHECKSUM_MISMATCH) << resp.results(0).message();
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 1u);
  EXPECT_EQ(get_stager_.bytes_in_use(), 0u);
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
}

TEST_F(GpuStore, EveryDestinationOfAKeyWithAGpuOneIsFilledThroughStaging) {
  const std::string pk = Payload(3000, 7);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  // Host first, GPU second; GPU first, host second; two GPU destinations and a host one: the key
  // is read once into staging memory and copied from there, GPU ones by the device.
  sv1::BatchGetResponse a = Get({{"k", {}}, {"k", {{id, 0, pk.size()}}}});
  ASSERT_EQ(a.results(0).code(), sv1::OK) << a.results(0).message();
  EXPECT_EQ(a.results(0).data(), pk);
  ASSERT_EQ(a.results(1).code(), sv1::OK) << a.results(1).message();
  EXPECT_EQ(a.results(1).bytes_written(), pk.size());
  EXPECT_EQ(std::string(device_, pk.size()), pk);
  const uint64_t hashes = fake_.hash_launches();
  sv1::BatchGetResponse b = Get({{"k", {{id, 8192, pk.size()}}},
                                 {"k", {}},
                                 {"k", {{id, 16384, pk.size()}}},
                                 {"other-missing", {{id, 32768, 10}}}});
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(b.results(i).code(), sv1::OK) << i << ": " << b.results(i).message();
    EXPECT_EQ(b.results(i).bytes_written(), pk.size());
  }
  EXPECT_EQ(b.results(1).data(), pk);
  EXPECT_EQ(b.results(3).code(), sv1::NOT_FOUND);
  EXPECT_EQ(std::string(device_ + 8192, pk.size()), pk);
  EXPECT_EQ(std::string(device_ + 16384, pk.size()), pk);
  EXPECT_TRUE(DeviceUntouched(32768, 4096));
  EXPECT_GT(fake_.hash_launches(), hashes) << "the GPU copies are proven by the device hash";
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 0u);
  EXPECT_EQ(get_stager_.bytes_in_use(), 0u) << "staging returned when the get ended";
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
}

TEST_F(GpuStore, DirectReadFailingOnTheLocalReplicaFallsBackToARemoteOneThroughStaging) {
  StartRemote();
  const std::string pk = Payload(5000, 15);
  PutOk("k", pk, /*replicas=*/2);
  v1::KeyReplicas kr = Lookup("k");
  ASSERT_EQ(kr.replicas_size(), 2);
  ASSERT_TRUE(Scribble("k", *local_, 100)) << "one replica here, one on the remote daemon";
  const uint64_t id = RegisterGpu();
  sv1::BatchGetResponse resp = Get({{"k", {{id, 4096, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(std::string(device_ + 4096, pk.size()), pk) << "the remote replica's bytes";
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 1u) << "the local replica, by the device hash";
  EXPECT_EQ(metrics_.replica_fallbacks.Value(), 1u);
  EXPECT_EQ(get_stager_.bytes_in_use(), 0u);
  // Without staging memory the fallback cannot happen: the key fails, never OK.
  absl::StatusOr<GpuGetStager::Lease> all = get_stager_.Reserve(kGetStagingBytes);
  ASSERT_TRUE(all.ok());
  resp = Get({{"k", {{id, 16384, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::UNAVAILABLE) << resp.results(0).message();
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
}

TEST_F(GpuStore, StagedGpuDestinationFailingTheDeviceHashFailsAloneNeverOk) {
  const std::string pk = Payload(3000, 12);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  fake_.CorruptNextHash();  // the bytes land intact: only the CPU re-reading them would say OK
  sv1::BatchGetResponse resp = Get({{"k", {}}, {"k", {{id, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::OK) << "the host destination was verified on its own";
  EXPECT_EQ(resp.results(0).data(), pk);
  EXPECT_EQ(resp.results(1).code(), sv1::CHECKSUM_MISMATCH) << resp.results(1).message();
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 1u);
  // A copy that failed on the device.
  fake_.FailNthCopy(0);
  resp = Get({{"k", {{id, 8192, pk.size()}}}, {"k", {}}});
  EXPECT_EQ(resp.results(0).code(), sv1::TRANSFER_FAILED) << resp.results(0).message();
  EXPECT_EQ(resp.results(1).code(), sv1::OK);
  EXPECT_TRUE(DeviceUntouched(8192, pk.size()));
  EXPECT_EQ(get_stager_.bytes_in_use(), 0u);
}

TEST_F(GpuStore, WithoutStagingMemoryOnlyTheGpuDestinationsFail) {
  const std::string pk = Payload(3000, 13);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  {
    // Other gets hold the whole pool: retryable.
    absl::StatusOr<GpuGetStager::Lease> all = get_stager_.Reserve(kGetStagingBytes);
    ASSERT_TRUE(all.ok()) << all.status();
    sv1::BatchGetResponse resp = Get({{"k", {{id, 0, pk.size()}}}, {"k", {}}});
    EXPECT_EQ(resp.results(0).code(), sv1::UNAVAILABLE) << resp.results(0).message();
    EXPECT_NE(resp.results(0).message().find("--gpu_get_staging_bytes"), std::string::npos);
    EXPECT_EQ(resp.results(1).code(), sv1::OK) << resp.results(1).message();
    EXPECT_EQ(resp.results(1).data(), pk);
    // The key's only destination with a local replica needs no staging.
    EXPECT_EQ(Get({{"k", {{id, 8192, pk.size()}}}}).results(0).code(), sv1::OK);
  }
  EXPECT_TRUE(DeviceUntouched(0, pk.size()));
  // An object larger than the pool.
  const std::string big = Payload(kGetStagingBytes + 1, 14);
  PutOk("big", big);
  sv1::BatchGetResponse resp = Get({{"big", {}}, {"big", {{id, 0, big.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::OK);
  EXPECT_EQ(resp.results(1).code(), sv1::INVALID_ARGUMENT) << resp.results(1).message();
  // A getter without staging (no cuda transport behind it).
  getter_.SetGpuStager(nullptr);
  resp = Get({{"k", {}}, {"k", {{id, 0, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::OK);
  EXPECT_EQ(resp.results(1).code(), sv1::INVALID_ARGUMENT);
  EXPECT_NE(resp.results(1).message().find("staging"), std::string::npos);
  EXPECT_TRUE(DeviceUntouched(0, 8192));
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
}

TEST_F(GpuStore, DaemonWithoutGpuBuffersRefusesGpuIds) {
  const std::string pk = Payload(1000, 8);
  PutOk("k", pk);
  const uint64_t id = RegisterGpu();
  StoreGrpcService no_gpu(StoreServiceOptions{.client_id = kLocalId}, buffers_, putter_, getter_,
                          master_, prefix_leases_, clock_, metrics_);
  sv1::BatchGetRequest req;
  sv1::GetItem* item = req.add_items();
  item->set_key("k");
  sv1::Slice* slice = item->add_slices();
  slice->set_buffer_id(id);
  slice->set_length(pk.size());
  sv1::BatchGetResponse resp;
  ASSERT_TRUE(no_gpu.BatchGet(nullptr, &req, &resp).ok());
  EXPECT_EQ(resp.results(0).code(), sv1::INVALID_ARGUMENT);
  EXPECT_NE(resp.results(0).message().find("--cuda_device"), std::string::npos);
}

// A POSIX-fd handle passed over the fd channel (parked under a ticket for the caller) and
// named by RegisterGpuBuffer: imported, served, and its ticket good once.
TEST_F(GpuStore, PosixFdHandlesAreRegisteredByTicket) {
  const std::string pk = Payload(3000, 18);
  PutOk("k", pk);
  auto registration = [&](uint64_t ticket) {
    sv1::RegisterGpuBufferRequest req;
    req.set_version(1);
    req.set_kind(sv1::GPU_HANDLE_POSIX_FD);
    req.set_fd_ticket(ticket);
    req.set_size(kDeviceBytes);
    sv1::RegisterGpuBufferResponse resp;
    grpc::Status s = gpu_service_.RegisterGpuBuffer(nullptr, &req, &resp);
    return std::make_pair(s, resp.buffer_id());
  };
  EXPECT_EQ(registration(1).first.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "no fd channel, no POSIX-fd handles";
  GpuFdTickets tickets;
  gpu_service_.SetFdTickets(&tickets);
  absl::StatusOr<uint64_t> theirs = tickets.Park(fake_.ExportFd(device_, kDeviceBytes), "anon:x");
  ASSERT_TRUE(theirs.ok());
  EXPECT_EQ(registration(*theirs).first.error_code(), grpc::StatusCode::NOT_FOUND)
      << "another caller's ticket";
  absl::StatusOr<uint64_t> mine = tickets.Park(fake_.ExportFd(device_, kDeviceBytes), "");
  ASSERT_TRUE(mine.ok());
  auto [s, id] = registration(*mine);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(registration(*mine).first.error_code(), grpc::StatusCode::NOT_FOUND) << "used";
  sv1::BatchGetResponse resp = Get({{"k", {{id, 4096, pk.size()}}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(std::string(device_ + 4096, pk.size()), pk);
  gpu_service_.SetFdTickets(nullptr);
}

TEST_F(GpuStore, DeviceUuidMustBeTheOrdinalsUuid) {
  const std::vector<uint8_t> handle = fake_.ExportIpc(device_, kDeviceBytes);
  auto registration = [&](const std::string& uuid) {
    sv1::RegisterGpuBufferRequest req;
    req.set_version(1);
    req.set_kind(sv1::GPU_HANDLE_CUDA_IPC);
    req.set_handle(handle.data(), handle.size());
    req.set_size(kDeviceBytes);
    req.set_device_uuid(uuid);
    sv1::RegisterGpuBufferResponse resp;
    grpc::Status s = gpu_service_.RegisterGpuBuffer(nullptr, &req, &resp);
    return std::make_pair(s, resp.buffer_id());
  };
  const absl::StatusOr<std::string> mine = fake_.DeviceUuid(0);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(*mine, "GPU-00000fa4-0000-4000-8000-000000000000");
  // Another GPU's UUID (the engine's ordinal 0 is another device here), a malformed one, and
  // one longer than any UUID: refused, nothing imported.
  const std::vector<std::string> refused = {
      "GPU-00000fa4-0000-4000-8000-000000000001", "GPU-", "x",
      "GPU-00000fa4-0000-4000-8000-000000000000" + std::string(40, '0')};
  for (const std::string& bad : refused) {
    auto [s, id] = registration(bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_EQ(gpu_.Count(), 0u);
    EXPECT_EQ(fake_.imports_open(), 0u);
  }
  EXPECT_NE(registration("GPU-00000fa4-0000-4000-8000-000000000001")
                .first.error_message()
                .find("CUDA_VISIBLE_DEVICES"),
            std::string::npos);
  // The same UUID, as nvidia-smi prints it, upper case, or without "GPU-".
  const std::vector<std::string> accepted = {*mine, "GPU-00000FA4-0000-4000-8000-000000000000",
                                             "00000fa4-0000-4000-8000-000000000000"};
  for (const std::string& good : accepted) {
    auto [s, id] = registration(good);
    EXPECT_TRUE(s.ok()) << good << ": " << s.error_message();
    EXPECT_TRUE(IsGpuBufferId(id));
  }
  EXPECT_EQ(gpu_.Count(), 3u);
}

// Only remote replicas: the cuda transport moves local segments only.
class GpuStoreRemoteOnly : public GpuStore {
 protected:
  void SetUp() override {
    local_ = Register(kLocalId, kLocalEndpoint, local_table_, 0, 0);  // a pure client
    StartRemote();                                                    // every replica is remote
  }
};

TEST_F(GpuStoreRemoteOnly, GpuDestinationWithOnlyRemoteReplicasIsStagedThroughHostMemory) {
  const std::string pk = Payload(2000, 9);
  PutOk("k", pk);
  ASSERT_EQ(Lookup("k").replicas(0).data_endpoint(), remote_->endpoint);
  const uint64_t id = RegisterGpu();
  const uint64_t hashes = fake_.hash_launches();
  sv1::BatchGetResponse resp = Get({{"k", {{id, 0, pk.size()}}}, {"k2-missing", {}}});
  ASSERT_EQ(resp.results(0).code(), sv1::OK) << resp.results(0).message();
  EXPECT_EQ(resp.results(0).bytes_written(), pk.size());
  EXPECT_EQ(std::string(device_, pk.size()), pk);
  EXPECT_EQ(resp.results(1).code(), sv1::NOT_FOUND);
  EXPECT_GT(fake_.hash_launches(), hashes) << "proven by the device hash";
  EXPECT_EQ(get_stager_.bytes_in_use(), 0u);
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
  // The device hash still decides.
  fake_.CorruptNextHash();
  resp = Get({{"k", {{id, 8192, pk.size()}}}});
  EXPECT_EQ(resp.results(0).code(), sv1::CHECKSUM_MISMATCH) << resp.results(0).message();
}

// GpuBuffers over a real gRPC server on loopback TCP: the Store token is required, and a caller's
// buffer is its own.
TEST(GpuBufferServiceAuth, RegistrationNeedsTheStoreTokenOverTcp) {
  FakeCudaApi api(1);
  char* mem = api.AllocDevice(4096);
  GpuBufferRegistry registry(api, nullptr);
  GpuBufferService service(registry, api);
  MetricsRegistry metrics;
  const std::string token(40, 't');
  StoreAuth auth(StoreAuthOptions{.token = token, .tcp_auth = true}, metrics);
  service.SetAccess(&auth, nullptr);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_NE(port, 0);
  auto stub = sv1::GpuBuffers::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  const std::vector<uint8_t> handle = api.ExportIpc(mem, 4096);
  sv1::RegisterGpuBufferRequest req;
  req.set_version(1);
  req.set_kind(sv1::GPU_HANDLE_CUDA_IPC);
  req.set_handle(handle.data(), handle.size());
  req.set_size(4096);
  sv1::RegisterGpuBufferResponse resp;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->RegisterGpuBuffer(&ctx, req, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(registry.Count(), 0u) << "nothing imported for an unauthenticated caller";
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + std::string(39, 't'));
    EXPECT_EQ(stub->RegisterGpuBuffer(&ctx, req, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    grpc::Status s = stub->RegisterGpuBuffer(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const uint64_t id = resp.buffer_id();
  // The buffer is the TCP caller's (its anonymous bucket), not the in-process owner "".
  GpuBufferRef ref;
  EXPECT_FALSE(registry.Resolve(id, 0, 1, &ref).ok());
  const std::string tcp_owner = *StoreAuth::OwnerOf("ipv4:127.0.0.1:1", "", nullptr);
  EXPECT_TRUE(registry.Resolve(id, 0, 1, &ref, tcp_owner).ok()) << tcp_owner;
  ref.reset();
  sv1::UnregisterGpuBufferRequest un;
  un.set_buffer_id(id);
  sv1::UnregisterGpuBufferResponse un_resp;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->UnregisterGpuBuffer(&ctx, un, &un_resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-mc-store-token", token);
    EXPECT_TRUE(stub->UnregisterGpuBuffer(&ctx, un, &un_resp).ok());
  }
  EXPECT_EQ(registry.Count(), 0u);
  server->Shutdown();
}

}  // namespace
}  // namespace mc::client::testing
