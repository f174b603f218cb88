// GpuBufferRegistry and its gRPC service against the fake CUDA device: imports, bounds of
// slices, the device ranges published to the cuda transport, and lifetimes.
#include "client/gpu/gpu_buffers.h"

#include <vector>

#include <unistd.h>

#include "client/gpu/gpu_fd_tickets.h"
#include "client/store/gpu_buffer_service.h"
#include "common/metrics.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_cuda.h"
#include "transfer/transfer_engine.h"

namespace mc::client {
namespace {

using transfer::cuda::FakeCudaApi;
using transfer::cuda::GpuHandleKind;

class GpuBuffersTest : public ::testing::Test {
 protected:
  GpuBuffersTest() : registry_(api_, nullptr, 4) { alloc_ = api_.AllocDevice(1 << 20); }

  GpuBufferSpec Ipc(const std::vector<uint8_t>& handle, uint64_t offset, uint64_t size) {
    GpuBufferSpec spec;
    spec.kind = GpuHandleKind::kCudaIpc;
    spec.handle = handle;
    spec.allocation_offset = offset;
    spec.size = size;
    return spec;
  }

  FakeCudaApi api_{2};
  GpuBufferRegistry registry_;
  char* alloc_ = nullptr;
};

TEST_F(GpuBuffersTest, RegisteredIpcBufferResolvesSlicesInsideIt) {
  const auto handle = api_.ExportIpc(alloc_, 1 << 20);
  auto id = registry_.Register(Ipc(handle, 4096, 65536));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(IsGpuBufferId(*id));
  GpuBufferRef ref;
  auto addr = registry_.Resolve(*id, 100, 200, &ref);
  ASSERT_TRUE(addr.ok());
  EXPECT_EQ(*addr, reinterpret_cast<uint64_t>(alloc_) + 4096 + 100);
  EXPECT_TRUE(registry_.Resolve(*id, 0, 65536, &ref).ok());
}

TEST_F(GpuBuffersTest, SlicesOutsideTheBufferAreRejectedWithoutOverflow) {
  const auto handle = api_.ExportIpc(alloc_, 1 << 20);
  auto id = registry_.Register(Ipc(handle, 0, 1000));
  ASSERT_TRUE(id.ok());
  GpuBufferRef ref;
  EXPECT_EQ(ToCode(registry_.Resolve(*id, 1000, 1, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(registry_.Resolve(*id, 999, 2, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(registry_.Resolve(*id, 1, ~uint64_t{0}, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(registry_.Resolve(*id, ~uint64_t{0}, 2, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(registry_.Resolve(*id ^ 1, 0, 1, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ref, nullptr);
}

TEST_F(GpuBuffersTest, RangesBeyondTheExportedAllocationAreRefused) {
  const auto handle = api_.ExportIpc(alloc_, 4096);
  EXPECT_EQ(ToCode(registry_.Register(Ipc(handle, 0, 4097)).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(registry_.Register(Ipc(handle, 4000, 100)).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(registry_.Register(Ipc(handle, ~uint64_t{0}, 2)).status()),
            Code::kInvalidArgument);
  EXPECT_EQ(api_.imports_open(), 0u);
}

TEST_F(GpuBuffersTest, BadHandlesDevicesAndSizesAreInvalidArguments) {
  const auto handle = api_.ExportIpc(alloc_, 4096);
  std::vector<uint8_t> short_handle(10);
  std::vector<uint8_t> unknown(64, 0xEE);
  EXPECT_EQ(ToCode(registry_.Register(Ipc(short_handle, 0, 10)).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(registry_.Register(Ipc(unknown, 0, 10)).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(registry_.Register(Ipc(handle, 0, 0)).status()), Code::kInvalidArgument);
  GpuBufferSpec other_device = Ipc(handle, 0, 10);
  other_device.device = 1;  // exported on device 0
  EXPECT_EQ(ToCode(registry_.Register(other_device).status()), Code::kInvalidArgument);
  GpuBufferSpec no_device = Ipc(handle, 0, 10);
  no_device.device = 2;
  EXPECT_EQ(ToCode(registry_.Register(no_device).status()), Code::kInvalidArgument);
  GpuBufferSpec no_fd;
  no_fd.kind = GpuHandleKind::kPosixFd;
  no_fd.size = 10;
  EXPECT_EQ(ToCode(registry_.Register(no_fd).status()), Code::kInvalidArgument);
}

TEST_F(GpuBuffersTest, PosixFdHandlesImportToo) {
  GpuBufferSpec spec;
  spec.kind = GpuHandleKind::kPosixFd;
  spec.fd = api_.ExportFd(alloc_, 1 << 20);
  spec.size = 1 << 20;
  auto id = registry_.Register(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  GpuBufferRef ref;
  EXPECT_EQ(*registry_.Resolve(*id, 0, 1, &ref), reinterpret_cast<uint64_t>(alloc_));
  close(spec.fd);  // the registry borrowed it
}

// A pipe's write end as the parked fd: its read end sees EOF once every copy is closed.
struct ParkedPipe {
  ParkedPipe() { EXPECT_EQ(pipe(fds), 0); }
  ~ParkedPipe() { close(fds[0]); }
  bool WriteEndClosed() const {
    char c;
    return read(fds[0], &c, 1) == 0;
  }
  int fds[2];
};

TEST(GpuFdTickets, TicketsAreOneTimeAndBoundToTheirOwner) {
  GpuFdTickets tickets;
  ParkedPipe p;
  absl::StatusOr<uint64_t> t = tickets.Park(p.fds[1], "alice");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NE(*t, 0u);
  EXPECT_EQ(ToCode(tickets.Take(*t, "bob").status()), Code::kNotFound) << "another owner's";
  EXPECT_EQ(ToCode(tickets.Take(*t + 1, "alice").status()), Code::kNotFound) << "unknown";
  absl::StatusOr<int> fd = tickets.Take(*t, "alice");
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(*fd, p.fds[1]);
  EXPECT_EQ(ToCode(tickets.Take(*t, "alice").status()), Code::kNotFound) << "one-time";
  close(*fd);
  EXPECT_TRUE(p.WriteEndClosed());
  EXPECT_EQ(tickets.Count(), 0u);
}

TEST(GpuFdTickets, BoundedPerOwnerAndInAllAndClosedWithTheSession) {
  GpuFdTickets tickets(/*max_per_owner=*/2, /*max_total=*/3);
  ParkedPipe a1, a2, a3, b1, c1;
  ASSERT_TRUE(tickets.Park(a1.fds[1], "alice").ok());
  ASSERT_TRUE(tickets.Park(a2.fds[1], "alice").ok());
  EXPECT_EQ(ToCode(tickets.Park(a3.fds[1], "alice").status()), Code::kNoSpace);
  EXPECT_TRUE(a3.WriteEndClosed()) << "a refused fd is closed";
  ASSERT_TRUE(tickets.Park(b1.fds[1], "bob").ok());
  EXPECT_EQ(ToCode(tickets.Park(c1.fds[1], "carol").status()), Code::kNoSpace) << "3 in all";
  EXPECT_EQ(tickets.ReleaseOwner("alice"), 2u);
  EXPECT_TRUE(a1.WriteEndClosed());
  EXPECT_TRUE(a2.WriteEndClosed());
  EXPECT_EQ(tickets.Count(), 1u);
  ParkedPipe a4;
  EXPECT_TRUE(tickets.Park(a4.fds[1], "alice").ok()) << "alice's count went with her session";
}

TEST_F(GpuBuffersTest, UnregisterClosesTheImportOnlyAfterTheLastUse) {
  const auto handle = api_.ExportIpc(alloc_, 1 << 20);
  auto id = registry_.Register(Ipc(handle, 0, 4096));
  ASSERT_TRUE(id.ok());
  GpuBufferRef in_flight;
  ASSERT_TRUE(registry_.Resolve(*id, 0, 4096, &in_flight).ok());
  ASSERT_TRUE(registry_.Unregister(*id).ok());
  EXPECT_EQ(api_.imports_open(), 1u);
  GpuBufferRef ref;
  EXPECT_FALSE(registry_.Resolve(*id, 0, 1, &ref).ok());
  in_flight.reset();
  EXPECT_EQ(api_.imports_open(), 0u);
  EXPECT_EQ(ToCode(registry_.Unregister(*id)), Code::kNotFound);
}

TEST_F(GpuBuffersTest, ReleaseOwnerDropsThatOwnersBuffersOnlyAfterTheirLastUse) {
  const auto handle = api_.ExportIpc(alloc_, 1 << 20);
  auto a1 = registry_.Register(Ipc(handle, 0, 4096), "alice");
  auto a2 = registry_.Register(Ipc(handle, 4096, 4096), "alice");
  auto b1 = registry_.Register(Ipc(handle, 8192, 4096), "bob");
  ASSERT_TRUE(a1.ok() && a2.ok() && b1.ok());
  GpuBufferRef in_flight;
  ASSERT_TRUE(registry_.Resolve(*a1, 0, 4096, &in_flight, "alice").ok());
  EXPECT_EQ(registry_.ReleaseOwner("alice"), 2u);
  EXPECT_EQ(registry_.Count(), 1u);
  GpuBufferRef ref;
  EXPECT_FALSE(registry_.Resolve(*a2, 0, 1, &ref, "alice").ok());
  EXPECT_TRUE(registry_.Resolve(*b1, 0, 1, &ref, "bob").ok()) << "another owner's stays";
  ref.reset();
  EXPECT_EQ(api_.imports_open(), 2u) << "bob's, and alice's buffer still in use";
  in_flight.reset();
  EXPECT_EQ(api_.imports_open(), 1u);
  EXPECT_EQ(registry_.ReleaseOwner("alice"), 0u);
}

TEST_F(GpuBuffersTest, TooManyBuffersIsNoSpace) {
  const auto handle = api_.ExportIpc(alloc_, 1 << 20);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(registry_.Register(Ipc(handle, i * 10, 10)).ok());
  absl::StatusOr<uint64_t> fifth = registry_.Register(Ipc(handle, 100, 10));
  EXPECT_EQ(ToCode(fifth.status()), Code::kNoSpace);
  EXPECT_NE(fifth.status().message().find("--gpu_max_buffers"), std::string::npos);
  EXPECT_EQ(api_.imports_open(), 4u) << "refused before importing";
}

TEST_F(GpuBuffersTest, OneCallerCannotTakeEveryBuffer) {
  GpuBufferRegistry registry(api_, nullptr, /*max_buffers=*/5, /*max_buffers_per_owner=*/2);
  const auto handle = api_.ExportIpc(alloc_, 1 << 20);
  ASSERT_TRUE(registry.Register(Ipc(handle, 0, 10), "alice").ok());
  absl::StatusOr<uint64_t> a2 = registry.Register(Ipc(handle, 10, 10), "alice");
  ASSERT_TRUE(a2.ok());
  absl::StatusOr<uint64_t> a3 = registry.Register(Ipc(handle, 20, 10), "alice");
  EXPECT_EQ(ToCode(a3.status()), Code::kNoSpace);
  EXPECT_NE(a3.status().message().find("--gpu_max_buffers_per_caller"), std::string::npos);
  // Others still register; alice's slot comes back when she unregisters, and after a failed
  // registration (the import failed) nobody's count moved.
  ASSERT_TRUE(registry.Register(Ipc(handle, 30, 10), "bob").ok());
  std::vector<uint8_t> bogus(64, 0xee);
  EXPECT_FALSE(registry.Register(Ipc(bogus, 0, 10), "bob").ok());
  ASSERT_TRUE(registry.Register(Ipc(handle, 40, 10), "bob").ok());
  EXPECT_EQ(ToCode(registry.Register(Ipc(handle, 50, 10), "bob").status()), Code::kNoSpace);
  ASSERT_TRUE(registry.Unregister(*a2, "alice").ok());
  ASSERT_TRUE(registry.Register(Ipc(handle, 60, 10), "alice").ok());
  // The total cap counts everyone: 5 in all.
  ASSERT_TRUE(registry.Register(Ipc(handle, 70, 10), "carol").ok());
  EXPECT_EQ(ToCode(registry.Register(Ipc(handle, 80, 10), "carol").status()), Code::kNoSpace);
  EXPECT_EQ(registry.Count(), 5u);
  EXPECT_EQ(registry.ReleaseOwner("bob"), 2u);
  EXPECT_TRUE(registry.Register(Ipc(handle, 80, 10), "carol").ok());
}

TEST(GpuBuffersTransport, RegisteredBuffersAreRoutedToTheCudaTransport) {
  std::vector<char> segment(1 << 20, 'x');
  transfer::SegmentTable table;
  table.Add(1, segment.data(), segment.size());
  MetricsRegistry metrics;
  transfer::TransferEngineOptions options;
  options.local_endpoint = "10.0.0.1:7000";
  options.metrics = &metrics;
  options.cuda.device = 0;
  FakeCudaApi* fake = nullptr;
  options.cuda.api_factory = [&fake] {
    auto api = std::make_unique<FakeCudaApi>();
    fake = api.get();
    return api;
  };
  transfer::TransferEngine engine(options, table);
  ASSERT_NE(engine.gpu(), nullptr);
  GpuBufferRegistry registry(engine.gpu()->api(), engine.gpu());
  char* alloc = fake->AllocDevice(65536);
  const auto handle = fake->ExportIpc(alloc, 65536);
  GpuBufferSpec spec;
  spec.handle = handle;
  spec.size = 65536;
  auto id = registry.Register(spec);
  ASSERT_TRUE(id.ok());
  GpuBufferRef ref;
  auto addr = registry.Resolve(*id, 0, 65536, &ref);
  ASSERT_TRUE(addr.ok());
  transfer::TransferRequest read;
  read.direction = transfer::Direction::kRead;
  read.local = {transfer::LocalBuffer{reinterpret_cast<char*>(*addr), 65536}};
  read.endpoint = options.local_endpoint;
  read.target = transfer::SegmentRange{1, 0};
  read.proof = transfer::Proof::kDeliveredBytes;
  auto read_bytes = [&](const std::string& transport) {
    return metrics
        .GetCounter("mc_transfer_bytes_total", "", {{"transport", transport}, {"op", "read"}})
        .Value();
  };
  auto results = engine.Submit(std::vector<transfer::TransferRequest>{read});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[0].bytes, 65536u);
  EXPECT_EQ(fake->copies(), 1u);
  EXPECT_EQ(read_bytes("cuda"), 65536u);
  ref.reset();
  ASSERT_TRUE(registry.Unregister(*id).ok());
  // The range left with the buffer: the same request (into what the fake's memory still is) is
  // no longer the cuda transport's.
  results = engine.Submit(std::vector<transfer::TransferRequest>{read});
  EXPECT_EQ(fake->copies(), 1u);
  EXPECT_EQ(read_bytes("cuda"), 65536u);
  EXPECT_EQ(read_bytes("local"), 65536u);
}

TEST(GpuBufferServiceTest, ServiceTranslatesRequestsAndRejectsUnknownVersions) {
  FakeCudaApi api;
  GpuBufferRegistry registry(api, nullptr);
  GpuBufferService service(registry, api);
  char* alloc = api.AllocDevice(4096);
  const auto handle = api.ExportIpc(alloc, 4096);
  mcstore::v1::RegisterGpuBufferRequest req;
  req.set_version(1);
  req.set_kind(mcstore::v1::GPU_HANDLE_CUDA_IPC);
  req.set_handle(std::string(handle.begin(), handle.end()));
  req.set_size(4096);
  mcstore::v1::RegisterGpuBufferResponse resp;
  ASSERT_TRUE(service.RegisterGpuBuffer(nullptr, &req, &resp).ok());
  EXPECT_TRUE(IsGpuBufferId(resp.buffer_id()));
  EXPECT_EQ(resp.device_name(), "FakeGPU sm_90");
  req.set_version(2);
  EXPECT_EQ(service.RegisterGpuBuffer(nullptr, &req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  mcstore::v1::UnregisterGpuBufferRequest un;
  un.set_buffer_id(resp.buffer_id());
  mcstore::v1::UnregisterGpuBufferResponse un_resp;
  EXPECT_TRUE(service.UnregisterGpuBuffer(nullptr, &un, &un_resp).ok());
}

}  // namespace
}  // namespace mc::client
