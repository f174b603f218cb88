// libFuzzer target: the SSD record format and the recovery scan. The input is decoded as a
// record header, then written to a memory file and scanned as a data file would be at start:
// corrupt or truncated records are skipped, never trusted, never read out of bounds.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "common/logging.h"
#include "offload/internal/recovery.h"
#include "offload/io_engine.h"
#include "offload/record_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mc::offload::IoEngine* engine = [] {
    mc::SetLogLevel("off");
    return mc::offload::CreatePosixIoEngine().release();
  }();
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)mc::offload::PeekHeaderLength(bytes);
  auto header = mc::offload::DecodeHeader(bytes);
  if (header.ok() && header->key.size() > bytes.size()) abort();
  const int fd = memfd_create("mc-record-fuzz", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size > 0 && ::write(fd, data, size) != static_cast<ssize_t>(size)) {
    ::close(fd);
    return 0;
  }
  // The scanner reads whole pages; a file size that is not a page multiple is also a case.
  auto scan = mc::offload::internal::ScanDataFile(*engine, fd, 0, size);
  if (scan.ok()) {
    for (const auto& r : scan->records) {
      if (r.offset + r.record_size > size) abort();
    }
  }
  ::close(fd);
  return 0;
}
