// The GpuStore fixture of gpu_store_test.cc and gpu_store_put_test.cc: the Store service with
// GPU buffers on the fake CUDA device (client/gpu/gpu_buffers.h), the put and get stagers, and
// helpers to register GPU and host buffers and to send BatchGet/BatchPut requests.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "client/access/store_auth.h"
#include "client/batch/gpu_get_stager.h"
#include "client/batch/gpu_put_stager.h"
#include "client/gpu/gpu_buffers.h"
#include "client/gpu/gpu_fd_tickets.h"
#include "client/store/gpu_buffer_service.h"
#include "client/store/store_service.h"
#include "common/checksum.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_cuda.h"
#include "tests/unit/client/client_test_util.h"
#include "transfer/cuda/cuda_transport.h"

namespace mc::client::testing {

namespace sv1 = mcstore::v1;
using transfer::cuda::FakeCudaApi;

inline constexpr uint64_t kDeviceBytes = 1 << 20;

class GpuStore : public ClientFixture {
 protected:
  GpuStore() : GpuStore(GpuEngineOptions()) {}
  // `engine`: GpuEngineOptions() with changes (e.g. an rdma device).
  explicit GpuStore(transfer::TransferEngineOptions engine)
      : ClientFixture(FakeMasterClient::DefaultOptions(), std::move(engine)),
        cuda_(*engine_.gpu()),
        fake_(static_cast<FakeCudaApi&>(cuda_.api())),
        gpu_(cuda_.api(), &cuda_),
        gpu_service_(gpu_, cuda_.api()),
        stager_(cuda_.api(), cuda_.mover(), GpuPutStagerOptions{.max_staging_bytes = kStagingBytes},
                RealClock::Get()),
        get_stager_(cuda_.api(), cuda_.mover(), GpuGetStagerOptions{.pool_bytes = kGetStagingBytes},
                    RealClock::Get()),
        service_(StoreServiceOptions{.client_id = kLocalId}, buffers_, putter_, getter_, master_,
                 prefix_leases_, clock_, metrics_) {
    service_.SetGpuBuffers(&gpu_, &stager_);
    getter_.SetGpuStager(&get_stager_);
    device_ = fake_.AllocDevice(kDeviceBytes);
  }

  static transfer::TransferEngineOptions GpuEngineOptions() {
    transfer::TransferEngineOptions o = EngineOptions();
    o.cuda.device = 0;
    o.cuda.streams = 2;
    o.cuda.api_factory = [] { return std::make_unique<FakeCudaApi>(1); };
    return o;
  }

  // Registers [offset, offset + size) of the fake allocation through the service (owner "").
  uint64_t RegisterGpu(uint64_t offset = 0, uint64_t size = kDeviceBytes) {
    const std::vector<uint8_t> handle = fake_.ExportIpc(device_, kDeviceBytes);
    sv1::RegisterGpuBufferRequest req;
    req.set_version(1);
    req.set_kind(sv1::GPU_HANDLE_CUDA_IPC);
    req.set_handle(handle.data(), handle.size());
    req.set_device(0);
    req.set_allocation_offset(offset);
    req.set_size(size);
    sv1::RegisterGpuBufferResponse resp;
    grpc::Status s = gpu_service_.RegisterGpuBuffer(nullptr, &req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(IsGpuBufferId(resp.buffer_id()));
    return resp.buffer_id();
  }

  struct SliceSpec {
    uint64_t id, offset, length;
  };
  using Items = std::vector<std::pair<std::string, std::vector<SliceSpec>>>;
  // A BatchGet or BatchPut request of one item per entry of `items` (key, slices).
  template <typename Request>
  static Request Build(const Items& items) {
    Request req;
    for (const auto& [key, slices] : items) {
      auto* item = req.add_items();
      item->set_key(key);
      for (const SliceSpec& s : slices) {
        sv1::Slice* slice = item->add_slices();
        slice->set_buffer_id(s.id);
        slice->set_offset(s.offset);
        slice->set_length(s.length);
      }
    }
    return req;
  }
  // Through Store's BatchGet (an item without slices is inline).
  sv1::BatchGetResponse Get(const Items& items) {
    const auto req = Build<sv1::BatchGetRequest>(items);
    sv1::BatchGetResponse resp;
    EXPECT_TRUE(service_.BatchGet(nullptr, &req, &resp).ok());
    EXPECT_EQ(resp.results_size(), req.items_size());
    return resp;
  }
  bool DeviceUntouched(uint64_t offset, uint64_t length) const {
    for (uint64_t i = 0; i < length; ++i) {
      if (device_[offset + i] != 0) return false;
    }
    return true;
  }

  // Through Store's BatchPut.
  sv1::BatchPutResponse Put(const Items& items) {
    const auto req = Build<sv1::BatchPutRequest>(items);
    sv1::BatchPutResponse resp;
    EXPECT_TRUE(service_.BatchPut(nullptr, &req, &resp).ok());
    EXPECT_EQ(resp.results_size(), req.items_size());
    return resp;
  }
  // A put item whose source is [offset, offset + length) of GPU buffer `id`, resolved.
  PutRequestItem GpuItem(uint64_t id, uint64_t offset, uint64_t length) {
    PutRequestItem item;
    GpuBufferRef ref;
    absl::StatusOr<uint64_t> addr = gpu_.Resolve(id, offset, length, &ref, "");
    EXPECT_TRUE(addr.ok()) << addr.status();
    item.gpu.Add(0, std::move(ref));
    item.pieces.push_back({reinterpret_cast<char*>(addr.value_or(0)), length});
    return item;
  }
  // A host buffer of `size` bytes registered with Store (a memfd passed as over the fd
  // channel, owner ""): its id; `*mem` maps it here.
  uint64_t RegisterHost(uint64_t size, char** mem) {
    const int fd = memfd_create("gpu-store-test", MFD_CLOEXEC);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    host_maps_.emplace_back(p, size);
    *mem = static_cast<char*>(p);
    absl::StatusOr<BufferRef> ref = BufferRegistry::MapFd(fd, size, "test");  // takes fd
    EXPECT_TRUE(ref.ok()) << ref.status();
    absl::StatusOr<std::string> handle = buffers_.Stage(*ref, "");
    EXPECT_TRUE(handle.ok()) << handle.status();
    absl::StatusOr<uint64_t> id = buffers_.Claim(*handle);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }
  ~GpuStore() override {
    for (auto [p, size] : host_maps_) munmap(p, size);
  }

  // The inline bytes of `key` (empty when the get fails).
  std::string GetInline(const std::string& key) {
    sv1::BatchGetResponse resp = Get({{key, {}}});
    return resp.results(0).code() == sv1::OK ? resp.results(0).data() : std::string();
  }

  static constexpr uint64_t kStagingBytes = 256 << 10;
  static constexpr uint64_t kGetStagingBytes = 64 << 10;
  transfer::GpuTransfers& cuda_;
  FakeCudaApi& fake_;
  GpuBufferRegistry gpu_;
  GpuBufferService gpu_service_;
  GpuPutStager stager_;
  GpuGetStager get_stager_;
  BufferRegistry buffers_;
  StoreGrpcService service_;
  char* device_ = nullptr;  // the fake's zeroed "device memory", kDeviceBytes
  std::vector<std::pair<void*, uint64_t>> host_maps_;
};

}  // namespace mc::client::testing
