// The fake CUDA device of the fake-GPU daemon build (mc-client-fakegpu, tests only): a
// FakeCudaApi whose "GPU buffers" are host shared memory of the registering process, so that
// a Python test -- the vLLM connector in a CPU engine -- can drive every GPU path of a real
// daemon (registration, staged gets, device hashes, GPU put sources, mixed block layouts).
//
// A CUDA IPC "handle" is kShmHandleMagic followed by a NUL-terminated POSIX shm name
// ("/name", no other '/'); a POSIX-fd handle is an fd of a file to map. Both are mapped shared
// and read-write, whole. Never linked into mc-client.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tests/fakes/fake_cuda.h"

namespace mc::transfer::cuda {

inline constexpr char kShmHandleMagic[] = "MCFAKESHM:";  // 10 bytes, then the name

inline absl::StatusOr<FakeCudaApi::Mapped> MapFakeGpuMemory(GpuHandleKind kind,
                                                            std::span<const uint8_t> handle,
                                                            int fd) {
  int map_fd = fd;
  int own_fd = -1;
  if (kind == GpuHandleKind::kCudaIpc) {
    constexpr size_t kMagic = sizeof(kShmHandleMagic) - 1;
    if (handle.size() <= kMagic || std::memcmp(handle.data(), kShmHandleMagic, kMagic) != 0) {
      return McError(Code::kInvalidArgument,
                     absl::StrCat("fake GPU: not a ", kShmHandleMagic, " handle"));
    }
    const char* name = reinterpret_cast<const char*>(handle.data()) + kMagic;
    const size_t max = handle.size() - kMagic;
    const size_t len = strnlen(name, max);
    std::string shm(name, len);
    if (len == max || len < 2 || shm[0] != '/' || shm.find('/', 1) != std::string::npos) {
      return McError(Code::kInvalidArgument, "fake GPU: bad shm name in the handle");
    }
    own_fd = shm_open(shm.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (own_fd < 0) {
      return McError(Code::kInvalidArgument,
                     absl::StrCat("fake GPU: shm_open ", shm, ": ", std::strerror(errno)));
    }
    map_fd = own_fd;
  }
  struct stat st {};
  const bool stat_ok = map_fd >= 0 && fstat(map_fd, &st) == 0 && S_ISREG(st.st_mode);
  void* p = stat_ok && st.st_size > 0 ? mmap(nullptr, static_cast<size_t>(st.st_size),
                                             PROT_READ | PROT_WRITE, MAP_SHARED, map_fd, 0)
                                      : MAP_FAILED;
  if (own_fd >= 0) close(own_fd);
  if (p == MAP_FAILED) return McError(Code::kInvalidArgument, "fake GPU: cannot map the memory");
  return FakeCudaApi::Mapped{static_cast<char*>(p), static_cast<uint64_t>(st.st_size)};
}

// $MC_FAKE_GPU_CORRUPT_EVERY_NTH_COPY=N: every N-th device copy lands with a flipped byte
// (FakeCudaApi::CorruptEveryNthCopy), for end-to-end tests that wrong bytes are never served.
inline std::unique_ptr<CudaApi> MakeShmFakeCudaApi() {
  auto api = std::make_unique<FakeCudaApi>(1);
  api->SetForeignImport(MapFakeGpuMemory,
                        [](const FakeCudaApi::Mapped& m) { munmap(m.base, m.size); });
  if (const char* every = std::getenv("MC_FAKE_GPU_CORRUPT_EVERY_NTH_COPY")) {
    api->CorruptEveryNthCopy(std::strtoull(every, nullptr, 10));
  }
  return api;
}

}  // namespace mc::transfer::cuda
