// BufferRegistry: shm objects registered by applications, bounds-checked resolution, and the
// lifetime of a buffer unregistered while a request still holds it.
#include "client/buffers/buffer_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"

namespace mc::client {
namespace {

// A POSIX shm object of `size` bytes, unlinked at the end of the test.
class ShmObject {
 public:
  explicit ShmObject(uint64_t size)
      : name_("/mc-client-test-" + std::to_string(getpid()) + "-" + std::to_string(counter_++)) {
    int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    close(fd);
  }
  ~ShmObject() { shm_unlink(name_.c_str()); }
  void Truncate(uint64_t size) {
    int fd = shm_open(name_.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    close(fd);
  }
  const std::string& name() const { return name_; }

 private:
  static inline int counter_ = 0;
  std::string name_;
};

TEST(BufferRegistry, RegisterResolveUnregister) {
  ShmObject shm(1 << 16);
  BufferRegistry reg;
  auto id = reg.Register(shm.name(), 1 << 16);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(reg.Count(), 1u);
  BufferRef ref;
  auto p = reg.Resolve(*id, 100, 200, &ref);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(*p, ref->base() + 100);
  std::memset(*p, 7, 200);
  EXPECT_TRUE(reg.Unregister(*id).ok());
  EXPECT_EQ(reg.Count(), 0u);
  EXPECT_EQ(ToCode(reg.Unregister(*id)), Code::kNotFound);
}

TEST(BufferRegistry, SizeZeroMapsTheWholeObject) {
  ShmObject shm(8192);
  BufferRegistry reg;
  auto id = reg.Register(shm.name(), 0);
  ASSERT_TRUE(id.ok()) << id.status();
  BufferRef ref;
  EXPECT_TRUE(reg.Resolve(*id, 0, 8192, &ref).ok());
  EXPECT_FALSE(reg.Resolve(*id, 0, 8193, &ref).ok());
}

TEST(BufferRegistry, MissingObjectIsNotFound) {
  BufferRegistry reg;
  auto id = reg.Register("/mc-client-test-does-not-exist-" + std::to_string(getpid()), 4096);
  EXPECT_EQ(ToCode(id.status()), Code::kNotFound) << id.status();
  EXPECT_EQ(reg.Count(), 0u);
}

TEST(BufferRegistry, BadNamesAreInvalidArgument) {
  BufferRegistry reg;
  EXPECT_EQ(ToCode(reg.Register("", 1).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(reg.Register("/a/b", 1).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(reg.Register("/" + std::string(300, 'x'), 1).status()), Code::kInvalidArgument);
}

TEST(BufferRegistry, SizeLargerThanTheObjectIsRejected) {
  ShmObject shm(4096);
  BufferRegistry reg;
  auto id = reg.Register(shm.name(), 4097);
  EXPECT_EQ(ToCode(id.status()), Code::kInvalidArgument) << id.status();
  ShmObject empty(0);
  EXPECT_EQ(ToCode(reg.Register(empty.name(), 0).status()), Code::kInvalidArgument);
  EXPECT_EQ(reg.Count(), 0u);
}

TEST(BufferRegistry, ResolveChecksBoundsWithoutOverflow) {
  ShmObject shm(4096);
  BufferRegistry reg;
  auto id = reg.Register(shm.name(), 4096);
  ASSERT_TRUE(id.ok());
  BufferRef ref;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_TRUE(reg.Resolve(*id, 4096, 0, &ref).ok()) << "empty slice at the end";
  EXPECT_TRUE(reg.Resolve(*id, 4000, 96, &ref).ok());
  EXPECT_EQ(ToCode(reg.Resolve(*id, 4000, 97, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(reg.Resolve(*id, 4097, 0, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(reg.Resolve(*id, kMax, 2, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(reg.Resolve(*id, 1, kMax, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(reg.Resolve(*id, kMax - 10, 20, &ref).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(reg.Resolve(*id + 1, 0, 1, &ref).status()), Code::kInvalidArgument);
}

TEST(BufferRegistry, UnregisterWhileHeldKeepsTheMemoryMapped) {
  ShmObject shm(1 << 20);
  BufferRegistry reg;
  auto id = reg.Register(shm.name(), 1 << 20);
  ASSERT_TRUE(id.ok());
  BufferRef ref;
  auto p = reg.Resolve(*id, 0, 1 << 20, &ref);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(reg.Unregister(*id).ok());
  BufferRef other;
  EXPECT_FALSE(reg.Resolve(*id, 0, 1, &other).ok()) << "gone for new requests";
  // The in-flight user can still read and write every byte (ASan/segfault would catch a munmap).
  std::memset(*p, 0x3c, 1 << 20);
  EXPECT_EQ((*p)[(1 << 20) - 1], 0x3c);
  ref.reset();
}

TEST(BufferRegistry, TooManyBuffersIsNoSpace) {
  ShmObject shm(4096);
  BufferRegistry reg(/*max_buffers=*/2);
  EXPECT_TRUE(reg.Register(shm.name(), 0).ok());
  EXPECT_TRUE(reg.Register(shm.name(), 0).ok());
  EXPECT_EQ(ToCode(reg.Register(shm.name(), 0).status()), Code::kNoSpace);
  EXPECT_EQ(reg.Count(), 2u);
}

TEST(BufferRegistry, SliceBeyondATruncatedObjectIsRefused) {
  ShmObject shm(4 << 20);
  BufferRegistry reg;
  auto id = reg.Register(shm.name(), 0);
  ASSERT_TRUE(id.ok());
  shm.Truncate(1 << 20);
  BufferRef ref;
  EXPECT_TRUE(reg.Resolve(*id, 0, 1 << 20, &ref).ok()) << "the part still backed is usable";
  ref.reset();
  auto p = reg.Resolve(*id, (1 << 20) - 1, 2, &ref);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(ToCode(p.status()), Code::kInvalidArgument);
  EXPECT_NE(p.status().message().find("truncated"), std::string_view::npos) << p.status();
  EXPECT_EQ(ref, nullptr);
}

// The race: the object shrinks after Resolve, while a copy runs. Without the guard the copy
// raises SIGBUS and the test process dies.
TEST(BufferRegistry, TruncationDuringACopyIsAbsorbedAndFailsTheBuffer) {
  ShmObject shm(4 << 20);
  BufferRegistry reg;
  auto id = reg.Register(shm.name(), 0);
  ASSERT_TRUE(id.ok());
  BufferRef ref;
  auto p = reg.Resolve(*id, 0, 4 << 20, &ref);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(ref->CheckIntact().ok());
  const uint64_t faults_before = BufferFaultsAbsorbed();
  shm.Truncate(0);
  std::vector<char> copy(4 << 20, 'x');
  std::memcpy(copy.data(), *p, copy.size());  // reads past the object's end
  std::memset(*p, 0x5a, 4 << 20);             // and writes
  EXPECT_TRUE(ref->Broken());
  EXPECT_GE(BufferFaultsAbsorbed(), faults_before + 1);
  absl::Status s = CheckBuffersIntact({ref});
  EXPECT_EQ(ToCode(s), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("truncated"), std::string_view::npos) << s;
  BufferRef again;
  EXPECT_EQ(ToCode(reg.Resolve(*id, 0, 1, &again).status()), Code::kInvalidArgument);
  // Another buffer of the process is unaffected.
  ShmObject other(8192);
  auto id2 = reg.Register(other.name(), 0);
  ASSERT_TRUE(id2.ok());
  BufferRef ref2;
  ASSERT_TRUE(reg.Resolve(*id2, 0, 8192, &ref2).ok());
  EXPECT_FALSE(ref2->Broken());
  EXPECT_TRUE(reg.Unregister(*id).ok());
}

}  // namespace
}  // namespace mc::client

namespace mc::client {
namespace {

TEST(BufferRegistryOwners, AnotherOwnersIdIsUnknownToIt) {
  ShmObject shm(8192);
  BufferRegistry reg;
  auto id = reg.Register(shm.name(), 0, "alice");
  ASSERT_TRUE(id.ok()) << id.status();
  BufferRef ref;
  EXPECT_TRUE(reg.Resolve(*id, 0, 16, &ref, "alice").ok());
  auto stolen = reg.Resolve(*id, 0, 16, &ref, "mallory");
  EXPECT_EQ(ToCode(stolen.status()), Code::kInvalidArgument);
  EXPECT_NE(stolen.status().message().find("unknown buffer id"), std::string::npos);
  EXPECT_EQ(ToCode(reg.Unregister(*id, "mallory")), Code::kNotFound);
  EXPECT_EQ(reg.OwnerMismatches(), 2u);
  EXPECT_EQ(reg.Count(), 1u) << "still registered";
  EXPECT_TRUE(reg.Unregister(*id, "alice").ok());
}

TEST(BufferRegistryOwners, ReleaseOwnerDropsItsBuffersOnly) {
  ShmObject shm(8192);
  BufferRegistry reg;
  auto a = reg.Register(shm.name(), 0, "alice");
  auto b = reg.Register(shm.name(), 0, "bob");
  ASSERT_TRUE(a.ok() && b.ok());
  BufferRef held;
  ASSERT_TRUE(reg.Resolve(*a, 0, 8192, &held, "alice").ok());
  EXPECT_EQ(reg.ReleaseOwner("alice"), 1u);
  EXPECT_EQ(reg.Count(), 1u);
  EXPECT_EQ(reg.CountOwned("alice"), 0u);
  std::memset(held->base(), 3, 8192);  // an in-flight user keeps the mapping
  BufferRef ref;
  EXPECT_TRUE(reg.Resolve(*b, 0, 1, &ref, "bob").ok());
}

TEST(BufferRegistryOwners, PerOwnerLimitsNameTheirFlag) {
  ShmObject shm(8192);
  MetricsRegistry metrics;
  BufferRegistry reg(BufferRegistryOptions{.max_buffers = 10,
                                           .max_buffers_per_owner = 2,
                                           .max_bytes_per_owner = 12000,
                                           .metrics = &metrics});
  ASSERT_TRUE(reg.Register(shm.name(), 4096, "alice").ok());
  auto big = reg.Register(shm.name(), 8192, "alice");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("--store_max_buffer_bytes_per_caller"), std::string::npos);
  ASSERT_TRUE(reg.Register(shm.name(), 4096, "alice").ok());
  auto third = reg.Register(shm.name(), 1, "alice");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--store_max_buffers_per_caller"), std::string::npos);
  EXPECT_TRUE(reg.Register(shm.name(), 4096, "bob").ok()) << "bob has limits of his own";
  EXPECT_EQ(metrics.GetCounter("mc_store_limit_refusals_total", "", {{"limit", "buffers"}}).Value(),
            1u);
}

// Sessions of one uid share the uid's budget: opening more sessions does not multiply a share,
// and one uid cannot take the daemon's whole budget while another is refused.
TEST(BufferRegistryOwners, OwnersOfOneAccountShareItsLimits) {
  ShmObject shm(8192);
  MetricsRegistry metrics;
  BufferRegistry reg(BufferRegistryOptions{.max_buffers = 10,
                                           .max_bytes = 1 << 20,
                                           .max_buffers_per_owner = 2,
                                           .max_bytes_per_owner = 1 << 20,
                                           .max_buffers_per_account = 3,
                                           .max_bytes_per_account = 20000,
                                           .metrics = &metrics});
  ASSERT_TRUE(reg.Register(shm.name(), 4096, "s1", "uid:7").ok());
  ASSERT_TRUE(reg.Register(shm.name(), 4096, "s1", "uid:7").ok());
  ASSERT_TRUE(reg.Register(shm.name(), 4096, "s2", "uid:7").ok());
  auto fourth = reg.Register(shm.name(), 4096, "s3", "uid:7");  // a third session, same uid
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.status().message().find("--store_max_buffers_per_uid"), std::string::npos);
  EXPECT_EQ(
      metrics.GetCounter("mc_store_limit_refusals_total", "", {{"limit", "buffers_uid"}}).Value(),
      1u);
  EXPECT_TRUE(reg.Register(shm.name(), 4096, "t1", "uid:8").ok()) << "uid 8 is not starved";
  auto big = reg.Register(shm.name(), 8192, "t1", "uid:8");
  ASSERT_TRUE(big.ok());
  auto bytes = reg.Register(shm.name(), 8192, "t2", "uid:8");  // 12288 + 8192 > 20000
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(bytes.status().message().find("--store_max_buffer_bytes_per_uid"), std::string::npos);
  EXPECT_EQ(reg.AccountUsage("uid:8"), (std::pair<size_t, uint64_t>{2, 12288}));
  // Unregistering and ending a session give the account's share back.
  EXPECT_TRUE(reg.Unregister(*big, "t1").ok());
  EXPECT_EQ(reg.AccountUsage("uid:8"), (std::pair<size_t, uint64_t>{1, 4096}));
  EXPECT_EQ(reg.ReleaseOwner("s1"), 2u);
  EXPECT_EQ(reg.AccountUsage("uid:7"), (std::pair<size_t, uint64_t>{1, 4096}));
  EXPECT_TRUE(reg.Register(shm.name(), 4096, "s3", "uid:7").ok());
  // An owner registered without an account is its own account.
  ASSERT_TRUE(reg.Register(shm.name(), 4096, "anon:unix").ok());
  EXPECT_EQ(reg.AccountUsage("anon:unix"), (std::pair<size_t, uint64_t>{1, 4096}));
}

TEST(BufferRegistryOwners, DaemonWideBytesAreCapped) {
  ShmObject shm(8192);
  BufferRegistry reg(BufferRegistryOptions{.max_buffers = 10, .max_bytes = 12288});
  auto a = reg.Register(shm.name(), 8192, "alice");
  ASSERT_TRUE(a.ok());
  auto b = reg.Register(shm.name(), 8192, "bob");
  EXPECT_EQ(ToCode(b.status()), Code::kNoSpace);
  EXPECT_NE(b.status().message().find("--store_max_buffer_bytes_total"), std::string::npos);
  EXPECT_TRUE(reg.Register(shm.name(), 4096, "bob").ok());
  EXPECT_TRUE(reg.Unregister(*a, "alice").ok());
  EXPECT_TRUE(reg.Register(shm.name(), 8192, "bob").ok()) << "unregistering gives bytes back";
}

TEST(BufferRegistryOwners, StagedHandleIsClaimedOnce) {
  int fd = memfd_create("mc-stage", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  auto mapped = BufferRegistry::MapFd(fd, 0, "memfd");
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  BufferRegistry reg;
  auto handle = reg.Stage(*mapped, "alice");
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(reg.Count(), 0u);
  EXPECT_EQ(reg.CountOwned("alice"), 1u);
  EXPECT_EQ(ToCode(reg.Claim("0123456789abcdef0123456789abcdef").status()), Code::kNotFound);
  auto id = reg.Claim(*handle);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(ToCode(reg.Claim(*handle).status()), Code::kNotFound);
  BufferRef ref;
  EXPECT_TRUE(reg.Resolve(*id, 0, 4096, &ref, "alice").ok());
}

// MapFd has the pages the object already has mapped (in the background; no page fault on the
// first get into them) and allocates none of its holes.
TEST(BufferRegistryMapping, PrefaultsWrittenPagesAndLeavesHoles) {
  const long page = sysconf(_SC_PAGESIZE);
  constexpr int kPages = 64, kWritten = 32;
  int fd = memfd_create("mc-prefault", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kPages * page), 0);
  std::vector<char> bytes(kWritten * page, 'w');  // pages [0, 32) through the fd; the rest: holes
  ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  struct stat before {};
  ASSERT_EQ(fstat(fd, &before), 0);
  auto mapped = BufferRegistry::MapFd(fd, 0, "memfd");
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  WaitForBufferPrefaults();  // done in the background
  struct stat after {};
  ASSERT_EQ(fstat(fd, &after), 0);  // the buffer keeps the fd open
  EXPECT_EQ(after.st_blocks, before.st_blocks) << "holes must stay holes";

  // Which pages of the mapping this process has page-table entries for (/proc/self/pagemap,
  // bit 63 "present"): read directly, so that sanitizer shadow faults do not blur a count.
  int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(pagemap, 0);
  const uintptr_t first = reinterpret_cast<uintptr_t>((*mapped)->base()) / page;
  std::vector<uint64_t> entries(kPages);
  ASSERT_EQ(pread(pagemap, entries.data(), entries.size() * 8, static_cast<off_t>(first * 8)),
            static_cast<ssize_t>(entries.size() * 8));
  close(pagemap);
  for (int i = 0; i < kPages; ++i) {
    const bool present = (entries[i] >> 63) & 1;
    EXPECT_EQ(present, i < kWritten) << "page " << i;
  }
}

}  // namespace
}  // namespace mc::client
