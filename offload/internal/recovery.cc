#include "offload/internal/recovery.h"

#include <algorithm>

#include "common/checksum.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "offload/internal/aligned_buffer.h"

namespace mc::offload::internal {
namespace {

constexpr uint64_t kScanWindow = 4 << 20;

absl::Status ReadExact(IoEngine& engine, int fd, uint64_t offset, char* buf, uint64_t len) {
  IoRequest req{IoOp::kRead, fd, offset, buf, len};
  auto results = engine.SubmitAndWait({&req, 1});
  return results[0].status();
}

}  // namespace

absl::StatusOr<bool> VerifyPayloadOnDisk(IoEngine& engine, int fd, uint64_t offset,
                                         uint64_t payload_len, uint64_t expected) {
  AlignedBuffer buf(std::min<uint64_t>(std::max<uint64_t>(payload_len, 1), kScanWindow));
  if (!buf.ok()) return McError(Code::kInternal, "out of memory for a scan buffer");
  StreamingChecksum sum;
  for (uint64_t done = 0; done < payload_len;) {
    const uint64_t n = std::min(buf.size(), RoundUpToPage(payload_len - done));
    MC_RETURN_IF_ERROR(ReadExact(engine, fd, offset + done, buf.data(), n));
    const uint64_t useful = std::min(n, payload_len - done);
    sum.Update(buf.data(), useful);
    done += useful;
  }
  return sum.Digest() == expected;
}

absl::StatusOr<ScanResult> ScanDataFile(IoEngine& engine, int fd, uint32_t file, uint64_t size) {
  static auto& log = Logger("offload");
  ScanResult result;
  AlignedBuffer window(kScanWindow);
  AlignedBuffer header_buf(HeaderBlockSize(kMaxKeyBytes));
  if (!window.ok() || !header_buf.ok()) return McError(Code::kInternal, "out of memory for a scan");
  uint64_t off = 0;
  while (off < size) {
    const uint64_t len = std::min(kScanWindow, size - off);
    MC_RETURN_IF_ERROR(ReadExact(engine, fd, off, window.data(), len));
    uint64_t p = 0;
    while (p < len) {
      const uint64_t at = off + p;
      const uint64_t hl = PeekHeaderLength(window.view(p, len - p));
      if (hl == 0) {
        p += kPageSize;
        continue;
      }
      std::string_view hv;
      if (hl <= len - p) {
        hv = window.view(p, hl);
      } else if (hl <= header_buf.size() && hl <= size - at) {
        MC_RETURN_IF_ERROR(ReadExact(engine, fd, at, header_buf.data(), hl));
        hv = header_buf.view(0, hl);
      }
      auto header = DecodeHeader(hv);
      const uint64_t rec = header.ok() ? RecordSize(header->key.size(), header->payload_len) : 0;
      if (!header.ok() || rec > size - at) {
        log.warn("disk tier recovery: skipping file {} offset {}: {}", file, at,
                 header.ok() ? std::string("record runs past end of file")
                             : std::string(header.status().message()));
        ++result.skipped_corrupt;
        p += kPageSize;
        continue;
      }
      bool payload_ok = false;
      if (rec <= len - p) {
        payload_ok =
            Checksum(window.data() + p + hl, header->payload_len) == header->payload_checksum;
      } else {
        MC_ASSIGN_OR_RETURN(payload_ok,
                            VerifyPayloadOnDisk(engine, fd, at + hl, header->payload_len,
                                                header->payload_checksum));
      }
      if (payload_ok) {
        result.records.push_back(RecoveredRecord{file, at, rec, std::move(*header)});
      } else {
        log.warn("disk tier recovery: payload checksum mismatch at file {} offset {}, skipped",
                 file, at);
        ++result.skipped_corrupt;
      }
      p += rec;  // the header verified, so its length is trustworthy
    }
    off += p;
  }
  return result;
}

}  // namespace mc::offload::internal
