// The fake device of mc-client-fakegpu (tests/fakes/shm_fake_cuda.h): which handles it maps,
// that the mapping is the caller's shared memory, and its injected lying copies.
#include "tests/fakes/shm_fake_cuda.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mc::transfer::cuda {
namespace {

std::vector<uint8_t> Handle(const std::string& name) {
  std::vector<uint8_t> h(64, 0);
  const std::string raw = std::string(kShmHandleMagic) + name;
  std::memcpy(h.data(), raw.data(), std::min<size_t>(raw.size(), h.size()));
  return h;
}

class ShmFakeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = "/mc-shm-fake-cuda-test-" + std::to_string(getpid());
    const int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, kSize), 0);
    void* p = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(p, MAP_FAILED);
    mine_ = static_cast<char*>(p);
  }
  void TearDown() override {
    if (mine_ != nullptr) munmap(mine_, kSize);
    shm_unlink(name_.c_str());
  }
  static constexpr uint64_t kSize = 1 << 16;
  std::string name_;
  char* mine_ = nullptr;
};

TEST_F(ShmFakeCudaTest, ImportsTheCallersSharedMemory) {
  std::unique_ptr<CudaApi> api = MakeShmFakeCudaApi();
  auto mem = api->Import(0, GpuHandleKind::kCudaIpc, Handle(name_), -1, kSize);
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ(mem->size, kSize);
  char* device = reinterpret_cast<char*>(mem->device_addr);
  std::memcpy(mine_ + 100, "abc", 3);
  EXPECT_EQ(std::memcmp(device + 100, "abc", 3), 0);  // one memory, two mappings
  api->CloseImported(0, *mem);
  // larger than the object: refused
  EXPECT_FALSE(api->Import(0, GpuHandleKind::kCudaIpc, Handle(name_), -1, kSize + 1).ok());
}

TEST_F(ShmFakeCudaTest, RefusesHandlesItCannotMap) {
  std::unique_ptr<CudaApi> api = MakeShmFakeCudaApi();
  std::vector<uint8_t> not_ours(64, 7);
  EXPECT_FALSE(api->Import(0, GpuHandleKind::kCudaIpc, not_ours, -1, 16).ok());
  EXPECT_FALSE(api->Import(0, GpuHandleKind::kCudaIpc, Handle("/no-such-object-x"), -1, 16).ok());
  EXPECT_FALSE(api->Import(0, GpuHandleKind::kCudaIpc, Handle("relative"), -1, 16).ok());
  EXPECT_FALSE(api->Import(0, GpuHandleKind::kCudaIpc, Handle("/a/b"), -1, 16).ok());
  EXPECT_FALSE(api->Import(0, GpuHandleKind::kCudaIpc, Handle("/" + std::string(80, 'x')), -1,
                           16)
                   .ok());  // no NUL inside the handle
  EXPECT_FALSE(api->Import(0, GpuHandleKind::kPosixFd, {}, -1, 16).ok());
}

TEST(FakeCudaTest, CorruptEveryNthCopyFlipsOneByteOfThoseCopies) {
  FakeCudaApi api;
  api.CorruptEveryNthCopy(2);
  char* dev = api.AllocDevice(64);
  std::vector<char> src(16, 'x');
  auto stream = api.CreateStream(0);
  ASSERT_TRUE(stream.ok());
  for (int i = 0; i < 4; ++i) {
    CopyOp op{dev + 16 * i, src.data(), 16};
    ASSERT_TRUE(api.CopyBatchAsync(*stream, {&op, 1}).ok());
  }
  for (int i = 0; i < 4; ++i) {
    const bool flipped = std::memcmp(dev + 16 * i, src.data(), 16) != 0;
    EXPECT_EQ(flipped, i % 2 == 1) << "copy " << i;
  }
}

}  // namespace
}  // namespace mc::transfer::cuda
