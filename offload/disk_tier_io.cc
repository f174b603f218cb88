// DiskTier record I/O: staging through aligned buffers, gather on write, scatter and verify on
// read.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "common/checksum.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "offload/disk_tier.h"
#include "offload/internal/aligned_buffer.h"
#include "offload/internal/data_files.h"
#include "offload/internal/record_index.h"
#include "offload/internal/tier_internal.h"
#include "offload/record_format.h"

namespace mc::offload {
namespace {

constexpr uint64_t kStagingBytes = 32 << 20;  // bounce buffer: a 16 MiB record in one round
constexpr uint64_t kRequestBytes = 4 << 20;   // one engine request
constexpr size_t kPooledStaging = 4;          // bounce buffers kept for reuse

// Bounce buffers are reused: a fresh 32 MiB buffer costs thousands of page faults per record.
class StagingPool {
 public:
  static StagingPool& Get() {
    static StagingPool pool;
    return pool;
  }
  std::unique_ptr<internal::AlignedBuffer> Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        auto b = std::move(free_.back());
        free_.pop_back();
        return b;
      }
    }
    return std::make_unique<internal::AlignedBuffer>(kStagingBytes);
  }
  void Release(std::unique_ptr<internal::AlignedBuffer> b) {
    std::lock_guard<std::mutex> lock(mu_);
    if (b->ok() && free_.size() < kPooledStaging) free_.push_back(std::move(b));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<internal::AlignedBuffer>> free_;
};

// A pooled bounce buffer for the span of one record's I/O.
class Staging {
 public:
  Staging() : buffer_(StagingPool::Get().Acquire()) {}
  ~Staging() { StagingPool::Get().Release(std::move(buffer_)); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  bool ok() const { return buffer_->ok(); }
  char* data() const { return buffer_->data(); }
  uint64_t size() const { return buffer_->size(); }
  std::string_view view(uint64_t offset, uint64_t length) const {
    return buffer_->view(offset, length);
  }

 private:
  std::unique_ptr<internal::AlignedBuffer> buffer_;
};

// Copies from caller pieces into a contiguous buffer, piece by piece.
class Gather {
 public:
  explicit Gather(const std::vector<std::pair<const char*, uint64_t>>& pieces) : pieces_(pieces) {}
  uint64_t Take(char* dst, uint64_t n) {
    uint64_t copied = 0;
    while (copied < n && index_ < pieces_.size()) {
      const auto& [ptr, len] = pieces_[index_];
      const uint64_t k = std::min(n - copied, len - offset_);
      if (k > 0) std::memcpy(dst + copied, ptr + offset_, k);
      copied += k;
      offset_ += k;
      if (offset_ == len) {
        ++index_;
        offset_ = 0;
      }
    }
    return copied;
  }

 private:
  const std::vector<std::pair<const char*, uint64_t>>& pieces_;
  size_t index_ = 0;
  uint64_t offset_ = 0;
};

// Copies a contiguous buffer out into caller pieces.
class Scatter {
 public:
  explicit Scatter(const std::vector<std::pair<char*, uint64_t>>& pieces) : pieces_(pieces) {}
  void Put(const char* src, uint64_t n) {
    uint64_t copied = 0;
    while (copied < n && index_ < pieces_.size()) {
      const auto& [ptr, len] = pieces_[index_];
      const uint64_t k = std::min(n - copied, len - offset_);
      if (k > 0) std::memcpy(ptr + offset_, src + copied, k);
      copied += k;
      offset_ += k;
      if (offset_ == len) {
        ++index_;
        offset_ = 0;
      }
    }
  }

 private:
  const std::vector<std::pair<char*, uint64_t>>& pieces_;
  size_t index_ = 0;
  uint64_t offset_ = 0;
};

absl::Status Mismatch(std::string_view what) {
  return McError(Code::kChecksumMismatch, std::string("disk tier read: ") + std::string(what));
}

}  // namespace

absl::Status DiskTier::Transfer(IoOp op, uint32_t file, uint64_t offset, char* buffer,
                                uint64_t length) {
  std::vector<IoRequest> requests;
  for (uint64_t done = 0; done < length; done += kRequestBytes) {
    requests.push_back(IoRequest{op, files_->fd(file), offset + done, buffer + done,
                                 std::min(kRequestBytes, length - done)});
  }
  for (const IoResult& r : engine_->SubmitAndWait(requests)) MC_RETURN_IF_ERROR(r.status());
  return absl::OkStatus();
}

absl::Status DiskTier::WriteRecord(const Extent& extent, std::string_view key, uint64_t generation,
                                   const std::vector<std::pair<const char*, uint64_t>>& pieces,
                                   uint64_t payload_len, uint64_t payload_checksum) {
  Staging staging;
  if (!staging.ok()) return McError(Code::kInternal, "disk tier: out of memory for staging");
  Gather gather(pieces);
  for (uint64_t pos = 0; pos < extent.length;) {
    const uint64_t n = std::min(staging.size(), extent.length - pos);
    uint64_t start = 0;
    if (pos == 0) {
      MC_RETURN_IF_ERROR(
          EncodeHeaderInto(key, generation, payload_len, payload_checksum, staging.data()));
      start = HeaderBlockSize(key.size());
    }
    const uint64_t got = gather.Take(staging.data() + start, n - start);
    if (start + got < n) std::memset(staging.data() + start + got, 0, n - start - got);
    MC_RETURN_IF_ERROR(Transfer(IoOp::kWrite, extent.file, extent.offset + pos, staging.data(), n));
    pos += n;
  }
  return files_->Sync(extent.file);
}

absl::Status DiskTier::ReadRecord(const Extent& extent, std::string_view key, uint64_t generation,
                                  uint64_t payload_len,
                                  const std::vector<std::pair<char*, uint64_t>>& dst) {
  Staging staging;
  if (!staging.ok()) return McError(Code::kInternal, "disk tier: out of memory for staging");
  StreamingChecksum sum;
  Scatter scatter(dst);
  uint64_t expected_sum = 0;
  uint64_t payload_done = 0;
  for (uint64_t pos = 0; pos < extent.length;) {
    const uint64_t n = std::min(staging.size(), extent.length - pos);
    MC_RETURN_IF_ERROR(Transfer(IoOp::kRead, extent.file, extent.offset + pos, staging.data(), n));
    uint64_t start = 0;
    if (pos == 0) {
      MC_ASSIGN_OR_RETURN(RecordHeader h, DecodeHeader(staging.view(0, n)));
      if (h.key != key) return Mismatch("key differs");
      if (h.generation != generation) return Mismatch("generation differs");
      if (h.payload_len != payload_len) return Mismatch("payload length differs");
      expected_sum = h.payload_checksum;
      start = h.header_len;
    }
    const uint64_t useful = std::min(n - start, payload_len - payload_done);
    sum.Update(staging.data() + start, useful);
    scatter.Put(staging.data() + start, useful);
    payload_done += useful;
    pos += n;
  }
  if (payload_done != payload_len) return Mismatch("record shorter than its payload");
  if (sum.Digest() != expected_sum) return Mismatch("payload checksum differs");
  return absl::OkStatus();
}

absl::Status DiskTier::Read(RecordRef ref, std::string_view key, uint64_t generation,
                            const std::vector<std::pair<char*, uint64_t>>& dst) {
  static auto& log = Logger("offload");
  uint64_t total = 0;
  for (const auto& piece : dst) total += piece.second;
  if (total != ref.length) {
    return McError(Code::kSizeMismatch, "disk tier read: destination size differs from the record");
  }
  Extent extent;
  {
    absl::MutexLock lock(&mu_);
    const internal::Slot* s = index_->Find(key, generation);
    if (s == nullptr || !s->ready || PackLocator(s->extent) != ref.locator ||
        s->payload_len != ref.length) {
      return McError(Code::kNotFound, "disk tier read: no such record at this ref");
    }
    extent = s->extent;
    index_->Pin(key, generation);  // against eviction and removal while we read
    index_->Touch(key, generation);
  }
  absl::Status status = ReadRecord(extent, key, generation, ref.length, dst);
  absl::MutexLock lock(&mu_);
  index_->Unpin(key, generation);
  if (status.ok()) {
    ++stats_.reads;
    if (metrics_) {
      metrics_->reads->Inc();
      metrics_->bytes_read->Inc(ref.length);
    }
  } else if (ToCode(status) == Code::kChecksumMismatch) {
    ++stats_.checksum_mismatches;
    if (metrics_) metrics_->checksum_mismatches->Inc();
    log.error("disk tier: record {} gen {} failed verification: {}", KeyForLog(key), generation,
              std::string(status.message()));
  } else {
    ++stats_.read_failures;
    Fail("read");
  }
  return status;
}

void DiskTier::ZeroHeaders(const std::vector<internal::IndexedRecord>& records) {
  static auto& log = Logger("offload");
  if (records.empty()) return;
  internal::AlignedBuffer zero(kPageSize);
  zero.Zero();
  std::vector<IoRequest> requests;
  for (const auto& r : records) {
    requests.push_back(IoRequest{IoOp::kWrite, files_->fd(r.extent.file), r.extent.offset,
                                 zero.data(), kPageSize});
  }
  auto results = engine_->SubmitAndWait(requests);
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      // Only costs a resurrected (still valid) record at the next recovery.
      log.warn("disk tier: clearing header of dropped record {} failed: {}",
               KeyForLog(records[i].key), std::string(results[i].status().message()));
    }
  }
}

}  // namespace mc::offload
