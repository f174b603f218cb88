// DiskTier record I/O: staging through aligned buffers, gather on write, scatter and verify on
// read, pipelined in chunks so the copy and hash of one chunk overlap the device I/O of others.
#include <algorithm>
#include <cstring>
#include <deque>
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

constexpr uint64_t kStagingBytes = 32 << 20;  // bounce buffer, cut into chunk slots
constexpr uint64_t kRequestBytes = 4 << 20;   // one engine request
constexpr size_t kPooledStaging = 4;          // bounce buffers kept for reuse
// Automatic chunk size: a record in up to kChunksPerRecord chunks of equal size, none under
// kMinChunkBytes (unless the record is) nor over kMaxIoChunkBytes. Small enough that the part of a
// record's copy and hash that cannot overlap its I/O (the first chunks of a write, the last of a
// read) is short; large enough that requests stay efficient.
constexpr uint64_t kChunksPerRecord = 8;
constexpr uint64_t kMinChunkBytes = 256 << 10;
// A write starts with chunks this small, doubling up to the chunk size, so the device starts
// early: it waits only for the copy and hash of the first two chunks.
constexpr uint64_t kRampStartBytes = 64 << 10;
// A record up to this size is written in one request: each extra write request costs ~30 us here
// (measured on ext4 over virtio, fresh extents), about what overlapping a 1 MiB copy and hash
// saves, so chunking small writes made them slower.
constexpr uint64_t kMaxUnsplitWriteBytes = 2 << 20;
constexpr uint64_t kHashStepBytes = 256 << 10;  // copy and hash in cache-sized steps
static_assert(kMaxIoChunkBytes <= kRequestBytes, "a chunk is one request");
static_assert(3 * std::max(kMaxIoChunkBytes, HeaderBlockSize(kMaxKeyBytes)) <= kStagingBytes,
              "the staging buffer holds at least three chunk slots (chunk 0 and two in turn)");

// How a record's extent is cut into chunks: chunk 0 starts with the header block and holds all of
// it; the next ones double in size up to `chunk` bytes (at once for reads, which start at that
// size), the last one is shorter. Every chunk fits a staging slot of `slot` bytes; the staging
// buffer has `slots` of them.
struct ChunkPlan {
  uint64_t record_len = 0;
  uint64_t chunk = 0;
  uint64_t first = 0;
  uint64_t slot = 0;
  size_t slots = 0;
  // Bytes of the chunk that starts at `pos`, after one of `prev` bytes (0 for chunk 0).
  uint64_t Length(uint64_t pos, uint64_t prev) const {
    return std::min(prev == 0 ? first : std::min(chunk, 2 * prev), record_len - pos);
  }
};

ChunkPlan PlanChunks(uint64_t record_len, uint64_t header_len, uint64_t chunk_bytes, bool ramp) {
  uint64_t chunk = chunk_bytes;
  if (chunk == 0 && ramp && record_len <= kMaxUnsplitWriteBytes) {
    chunk = record_len;  // one request; no ramp either (first == chunk below)
    ramp = false;
  } else if (chunk == 0) {
    const uint64_t n = std::clamp<uint64_t>(record_len / kMinChunkBytes, 1, kChunksPerRecord);
    chunk = std::min(RoundUpToPage((record_len + n - 1) / n), kMaxIoChunkBytes);
  }
  ChunkPlan plan;
  plan.record_len = record_len;
  plan.chunk = chunk;
  plan.first = std::max(header_len, ramp ? std::min(chunk, kRampStartBytes) : chunk);
  plan.slot = std::max(header_len, chunk);
  plan.slots = static_cast<size_t>(kStagingBytes / plan.slot);
  return plan;
}

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
  // Copies the next `n` bytes out, hashing each destination piece right after writing it.
  void Put(const char* src, uint64_t n, StreamingChecksum& sum) {
    uint64_t copied = 0;
    while (copied < n && index_ < pieces_.size()) {
      const auto& [ptr, len] = pieces_[index_];
      const uint64_t k = std::min(n - copied, len - offset_);
      if (k > 0) {
        std::memcpy(ptr + offset_, src + copied, k);
        sum.Update(ptr + offset_, k);
      }
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

// Copies the next `n` payload bytes into `dst` (zero padding once the payload is exhausted),
// hashing each step right after copying it, while it is still in cache.
void FillChunk(Gather& gather, StreamingChecksum& sum, char* dst, uint64_t n) {
  for (uint64_t off = 0; off < n;) {
    const uint64_t step = std::min(kHashStepBytes, n - off);
    const uint64_t got = gather.Take(dst + off, step);
    if (got > 0) sum.Update(dst + off, got);
    if (got < step) {
      std::memset(dst + off + got, 0, n - off - got);
      return;
    }
    off += step;
  }
}

// Copies `n` payload bytes of `src` out step by step, hashing what landed in the destination
// while it is still in cache: the digest proves the destination itself, not only the staging copy.
void DrainChunk(Scatter& scatter, StreamingChecksum& sum, const char* src, uint64_t n) {
  for (uint64_t off = 0; off < n;) {
    const uint64_t step = std::min(kHashStepBytes, n - off);
    scatter.Put(src + off, step, sum);
    off += step;
  }
}

// The first error among a batch's results, or OK.
absl::Status FirstError(const std::vector<IoResult>& results) {
  for (const IoResult& r : results) MC_RETURN_IF_ERROR(r.status());
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<IoBatch> DiskTier::SubmitRange(IoOp op, uint32_t file, uint64_t offset,
                                               char* buffer, uint64_t length) {
  std::vector<IoRequest> requests;
  for (uint64_t done = 0; done < length; done += kRequestBytes) {
    requests.push_back(IoRequest{op, files_->fd(file), offset + done, buffer + done,
                                 std::min(kRequestBytes, length - done)});
  }
  return engine_->Submit(requests);
}

// Chunk 0 (the header block and the first payload bytes) stays in its own staging slot until every
// payload byte is hashed, then goes to the device last, as one request with the header in it; the
// other chunks cycle through the remaining slots, each written while the next one is copied and
// hashed. Whatever the outcome, every submitted write has completed before this returns: `inflight`
// is declared after `staging`, so its batches are destroyed (which waits for them) first.
absl::StatusOr<uint64_t> DiskTier::WriteRecord(
    const Extent& extent, std::string_view key, uint64_t generation,
    const std::vector<std::pair<const char*, uint64_t>>& pieces, uint64_t payload_len,
    std::optional<uint64_t> expected) {
  Staging staging;
  if (!staging.ok()) return McError(Code::kInternal, "disk tier: out of memory for staging");
  const uint64_t header_len = HeaderBlockSize(key.size());
  const ChunkPlan plan =
      PlanChunks(extent.length, header_len, options_.io_chunk_bytes, /*ramp=*/true);
  const size_t ring = plan.slots - 1;  // slot 0 is chunk 0's until the end
  std::deque<std::unique_ptr<IoBatch>> inflight;
  StreamingChecksum sum;
  Gather gather(pieces);
  char* const first = staging.data();
  const uint64_t first_len = plan.Length(0, 0);
  FillChunk(gather, sum, first + header_len, first_len - header_len);
  absl::Status status;
  size_t next_slot = 0;
  uint64_t prev = first_len;
  for (uint64_t pos = first_len; pos < extent.length;) {
    if (inflight.size() == ring) {  // the next slot is the oldest chunk's: wait for its write
      status = FirstError(inflight.front()->Wait());
      inflight.pop_front();
      if (!status.ok()) break;
    }
    char* slot = staging.data() + plan.slot * (1 + next_slot);
    next_slot = (next_slot + 1) % ring;
    const uint64_t n = plan.Length(pos, prev);
    prev = n;
    FillChunk(gather, sum, slot, n);
    inflight.push_back(SubmitRange(IoOp::kWrite, extent.file, extent.offset + pos, slot, n));
    pos += n;
  }
  const uint64_t checksum = sum.Digest();
  if (status.ok() && expected.has_value() && *expected != checksum) {
    status = McError(Code::kChecksumMismatch, "payload changed before it was written");
  }
  if (status.ok()) status = EncodeHeaderInto(key, generation, payload_len, checksum, first);
  const bool header_sent = status.ok();
  if (header_sent) {
    inflight.push_back(SubmitRange(IoOp::kWrite, extent.file, extent.offset, first, first_len));
  }
  for (auto& batch : inflight) {
    absl::Status s = FirstError(batch->Wait());
    if (status.ok()) status = s;
  }
  inflight.clear();
  if (status.ok()) status = files_->Sync(extent.file);
  if (!status.ok() && header_sent) {
    // An earlier chunk failed while the header went out: clear it, so that recovery does not
    // find (and count as corrupt, or even index) a record this write reports as failed.
    ZeroHeaders({internal::IndexedRecord{std::string(key), generation, extent, payload_len, 0}});
  }
  MC_RETURN_IF_ERROR(status);
  return checksum;
}

// Chunks are read into staging slots as soon as a slot is free (all at once for a record that fits
// the staging buffer), then copied out in order and hashed in `dst`, each while the later ones are
// still being read. Bytes reach `dst` before the payload checksum is known (as the contract
// allows: on a mismatch dst holds garbage and the read fails). Every submitted read has completed
// before this returns, whatever the outcome (`inflight` is destroyed before `staging`).
absl::Status DiskTier::ReadRecord(const Extent& extent, std::string_view key, uint64_t generation,
                                  uint64_t payload_len,
                                  const std::vector<std::pair<char*, uint64_t>>& dst,
                                  uint64_t* checksum) {
  Staging staging;
  if (!staging.ok()) return McError(Code::kInternal, "disk tier: out of memory for staging");
  const ChunkPlan plan = PlanChunks(extent.length, HeaderBlockSize(key.size()),
                                    options_.io_chunk_bytes, /*ramp=*/false);
  struct Pending {
    std::unique_ptr<IoBatch> batch;
    char* data;
    uint64_t length;
  };
  std::deque<Pending> inflight;
  uint64_t submitted = 0;  // bytes of the extent whose read was submitted
  size_t next_slot = 0;
  uint64_t prev = 0;
  auto submit_more = [&] {
    while (submitted < extent.length && inflight.size() < plan.slots) {
      char* slot = staging.data() + plan.slot * next_slot;
      next_slot = (next_slot + 1) % plan.slots;
      const uint64_t n = plan.Length(submitted, prev);
      prev = n;
      inflight.push_back(
          {SubmitRange(IoOp::kRead, extent.file, extent.offset + submitted, slot, n), slot, n});
      submitted += n;
    }
  };
  submit_more();
  StreamingChecksum sum;
  Scatter scatter(dst);
  uint64_t expected_sum = 0;
  uint64_t payload_done = 0;
  for (bool first = true; !inflight.empty(); first = false) {
    Pending chunk = std::move(inflight.front());
    inflight.pop_front();
    MC_RETURN_IF_ERROR(FirstError(chunk.batch->Wait()));
    uint64_t start = 0;
    if (first) {
      MC_ASSIGN_OR_RETURN(RecordHeader h, DecodeHeader(std::string_view(chunk.data, chunk.length)));
      if (h.key != key) return Mismatch("key differs");
      if (h.generation != generation) return Mismatch("generation differs");
      if (h.payload_len != payload_len) return Mismatch("payload length differs");
      expected_sum = h.payload_checksum;
      start = h.header_len;
    }
    const uint64_t useful = std::min(chunk.length - start, payload_len - payload_done);
    DrainChunk(scatter, sum, chunk.data + start, useful);
    payload_done += useful;
    submit_more();  // this chunk's slot is free again
  }
  if (payload_done != payload_len) return Mismatch("record shorter than its payload");
  if (sum.Digest() != expected_sum) return Mismatch("payload checksum differs");
  if (checksum != nullptr) *checksum = expected_sum;
  return absl::OkStatus();
}

absl::Status DiskTier::Read(RecordRef ref, std::string_view key, uint64_t generation,
                            const std::vector<std::pair<char*, uint64_t>>& dst,
                            uint64_t* checksum) {
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
  absl::Status status = ReadRecord(extent, key, generation, ref.length, dst, checksum);
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
