// BufferRegistry with an rdma transport attached (fake verbs): every application buffer becomes
// a local-only memory region for as long as it is mapped, within the daemon's byte budget; RDMA
// moves bytes into and out of its slices; a request on a deregistered buffer fails, never OK.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "client/buffers/buffer_registry.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_verbs.h"
#include "tests/fakes/in_process_rdma_connector.h"
#include "transfer/rdma/rdma_transport.h"

namespace mc::client {
namespace {

using transfer::Direction;
using transfer::LocalBuffer;
using transfer::TransferRequest;
using transfer::TransferResult;
using transfer::rdma::DeviceAttributes;
using transfer::rdma::FakeVerbsDevice;
using transfer::rdma::FakeVerbsNetwork;
using transfer::rdma::InProcessRdmaConnector;
using transfer::rdma::RdmaTransport;

constexpr uint64_t kSegment = 3;
const std::string kPeer = "peer:1";

class NoConnector final : public transfer::rdma::RdmaConnector {
 public:
  absl::StatusOr<transfer::rdma::PeerHandshake> Connect(const std::string&,
                                                        std::span<const transfer::rdma::QpAddress>,
                                                        std::span<const uint32_t>) override {
    return McError(Code::kUnavailable, "no peers");
  }
};

// The engine's registration seam over the bare client transport (what TransferEngine does for
// each of its transports).
class TransportRegistrar final : public transfer::MemoryRegistrar {
 public:
  explicit TransportRegistrar(transfer::Transport& transport) : transport_(transport) {}
  absl::Status RegisterMemory(void* base, uint64_t length, transfer::MemoryAccess access) override {
    return transport_.RegisterMemory(base, length, access);
  }
  void UnregisterMemory(void* base) override { transport_.UnregisterMemory(base); }

 private:
  transfer::Transport& transport_;
};

BufferRef Memfd(uint64_t size) {
  int fd = memfd_create("mc-rdma-buffer", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  auto mapped = BufferRegistry::MapFd(fd, 0, "memfd");
  EXPECT_TRUE(mapped.ok()) << mapped.status();
  return mapped.ok() ? *mapped : nullptr;
}

class BufferRegistryRdma : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceAttributes attr;
    attr.name = "fake0";
    attr.max_sge = 4;
    attr.max_qp_wr = 64;
    auto server_dev = std::make_unique<FakeVerbsDevice>(network_, attr);
    auto client_dev = std::make_unique<FakeVerbsDevice>(network_, attr);
    client_dev_ = client_dev.get();
    server_ = std::make_unique<RdmaTransport>(transfer::rdma::RdmaTransportOptions{},
                                              std::move(server_dev), none_);
    connector_.AddPeer(kPeer, server_.get());
    client_ = std::make_unique<RdmaTransport>(transfer::rdma::RdmaTransportOptions{},
                                              std::move(client_dev), connector_);
    registrar_ = std::make_unique<TransportRegistrar>(*client_);
    segment_.resize(1 << 16);
    for (size_t i = 0; i < segment_.size(); ++i) segment_[i] = static_cast<char>(i * 13 + 1);
    ASSERT_TRUE(server_->ExportSegment(kSegment, segment_.data(), segment_.size()).ok());
  }

  TransferResult Move(Direction op, char* local, uint64_t length, uint64_t offset) {
    TransferRequest r;
    r.direction = op;
    r.local = {LocalBuffer{local, length}};
    r.endpoint = kPeer;
    r.target = transfer::SegmentRange{kSegment, offset};
    const TransferRequest* ptr = &r;
    std::vector<TransferResult> results(1);
    client_->Submit(std::span<const TransferRequest* const>(&ptr, 1), results, 0);
    return results[0];
  }

  FakeVerbsNetwork network_;
  NoConnector none_;
  InProcessRdmaConnector connector_;
  FakeVerbsDevice* client_dev_ = nullptr;
  std::vector<char> segment_;
  std::unique_ptr<RdmaTransport> server_;
  std::unique_ptr<RdmaTransport> client_;
  std::unique_ptr<TransportRegistrar> registrar_;
};

TEST_F(BufferRegistryRdma, BufferIsALocalOnlyRegionUntilItsLastReferenceGoes) {
  BufferRegistry reg;
  reg.AttachRegistrar(registrar_.get());
  auto handle = reg.Stage(Memfd(1 << 15), "alice");
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto id = reg.Claim(*handle);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(client_->local_regions_for_test(), 1u);
  EXPECT_EQ(reg.RdmaBytes(), 1u << 15);

  BufferRef ref;
  auto dst = reg.Resolve(*id, 4096, 8192, &ref, "alice");
  ASSERT_TRUE(dst.ok()) << dst.status();
  TransferResult get = Move(Direction::kRead, *dst, 8192, 100);
  ASSERT_TRUE(get.status.ok()) << get.status;
  EXPECT_EQ(0, std::memcmp(*dst, segment_.data() + 100, 8192));
  std::memset(*dst, 0x5c, 1000);
  TransferResult put = Move(Direction::kWrite, *dst, 1000, 30000);
  ASSERT_TRUE(put.status.ok()) << put.status;
  EXPECT_EQ(segment_[30000], 0x5c);
  EXPECT_EQ(segment_[30999], 0x5c);

  // Unregistered while a request still holds it: the region stays until the hold ends.
  ASSERT_TRUE(reg.Unregister(*id, "alice").ok());
  EXPECT_EQ(client_->local_regions_for_test(), 1u);
  ref.reset();
  EXPECT_EQ(client_->local_regions_for_test(), 0u);
  EXPECT_EQ(client_dev_->live_regions(), 0u);
  EXPECT_EQ(reg.RdmaBytes(), 0u);
  // Memory no region covers any more (the buffer is unmapped too): a request on it fails.
  std::vector<char> unregistered(4096);
  EXPECT_EQ(ToCode(Move(Direction::kRead, unregistered.data(), 4096, 0).status),
            Code::kInvalidArgument);
}

TEST_F(BufferRegistryRdma, ReleaseOwnerDeregistersItsBuffers) {
  BufferRegistry reg;
  reg.AttachRegistrar(registrar_.get());
  ASSERT_TRUE(reg.Stage(Memfd(8192), "alice").ok());
  auto h = reg.Stage(Memfd(8192), "alice");
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(reg.Claim(*h).ok());
  EXPECT_EQ(client_->local_regions_for_test(), 2u);
  EXPECT_EQ(reg.ReleaseOwner("alice"), 2u);
  EXPECT_EQ(client_->local_regions_for_test(), 0u);
  EXPECT_EQ(reg.RdmaBytes(), 0u);
}

TEST_F(BufferRegistryRdma, BuffersPastTheBudgetStayUsableOverTcp) {
  BufferRegistry reg(BufferRegistryOptions{.max_rdma_bytes = 12288});
  reg.AttachRegistrar(registrar_.get());
  auto a = reg.Stage(Memfd(8192), "alice");
  auto b = reg.Stage(Memfd(8192), "alice");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(client_->local_regions_for_test(), 1u);
  EXPECT_EQ(reg.RdmaBytes(), 8192u);
  EXPECT_EQ(reg.RdmaRefusals(), 1u);
  auto id = reg.Claim(*b);
  ASSERT_TRUE(id.ok());
  BufferRef ref;
  auto mem = reg.Resolve(*id, 0, 8192, &ref, "alice");
  ASSERT_TRUE(mem.ok()) << mem.status();
  TransferRequest r;
  r.direction = Direction::kRead;
  r.local = {LocalBuffer{*mem, 8192}};
  EXPECT_FALSE(client_->LocalBuffersRegistered(r));  // the registry routes it to tcp

  BufferRegistry none(BufferRegistryOptions{.max_rdma_bytes = 0});
  none.AttachRegistrar(registrar_.get());
  ASSERT_TRUE(none.Stage(Memfd(4096), "bob").ok());
  EXPECT_EQ(none.RdmaBytes(), 0u);
  EXPECT_EQ(client_->local_regions_for_test(), 1u);
}

TEST_F(BufferRegistryRdma, RefusedStageLeavesNoRegion) {
  BufferRegistry reg(BufferRegistryOptions{.max_buffers_per_owner = 1});
  reg.AttachRegistrar(registrar_.get());
  ASSERT_TRUE(reg.Stage(Memfd(4096), "alice").ok());
  EXPECT_FALSE(reg.Stage(Memfd(4096), "alice").ok());
  EXPECT_EQ(client_->local_regions_for_test(), 1u);
  EXPECT_EQ(reg.RdmaBytes(), 4096u);
}

}  // namespace
}  // namespace mc::client
