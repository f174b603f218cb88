// The SSD tier of one mc-client: records (key, generation, payload) in preallocated data files.
//
// What it does: writes a record (header with key, generation and XXH3 checksums, then payload, all
// 4 KiB-aligned, see record_format.h) into space from an ExtentAllocator through an IoEngine
// (io_uring, or pread/pwrite), fdatasyncs it, and only then indexes it; reads a record into caller
// memory and verifies everything it can (header, key, generation, length, payload checksum) before
// reporting OK; rebuilds its index at Open by scanning the files (records that fail verification
// are skipped and counted); keeps itself under a high watermark by evicting complete, unpinned
// records in LRU order (reported through TakeEvicted). Records move in chunks through a pooled
// staging buffer, the copy and XXH3 of one chunk overlapping the device I/O of others; a write
// sends its first chunk (header block and first payload bytes, one request) last, once the
// payload checksum is known.
// What it does not: decide what to offload (the master does), hold leases (callers Pin/Unpin for
// the span of a read lease), or talk to the network.
// Thread-safe: all methods may be called concurrently. I/O runs outside the tier's mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "offload/extent_allocator.h"
#include "offload/io_engine.h"

namespace mc::offload {

namespace internal {
class DataFiles;
class RecordIndex;
struct IndexedRecord;
}  // namespace internal

// A record the tier's own eviction wants to reclaim (see DiskTierOptions::reclaim_guard).
struct DiskTierVictim {
  std::string key;
  uint64_t generation = 0;
  uint64_t locator = 0;
  uint64_t length = 0;
};

inline constexpr uint64_t kMaxIoChunkBytes = 4 << 20;  // see DiskTierOptions::io_chunk_bytes

struct DiskTierOptions {
  std::string dir;        // data files live here (created if missing)
  uint64_t capacity = 0;  // bytes; split evenly over the data files (4 KiB multiples)
  int num_files = 4;
  int queue_depth = 64;         // io_uring ring entries
  bool force_posix_io = false;  // test hook / operators whose kernel refuses io_uring
  bool direct_io = true;        // O_DIRECT when the filesystem supports it (else buffered)
  // Records move between caller memory and the device in chunks through a staging buffer, the
  // copy and hash of one chunk overlapping the I/O of others. 0 = automatic (up to 8 equal chunks
  // of at least 256 KiB and at most 4 MiB, writes ramping up from 64 KiB; a record of up to 2 MiB
  // is written in one request); else a 4 KiB multiple up to kMaxIoChunkBytes (tests use small
  // ones to cut small records into many chunks).
  uint64_t io_chunk_bytes = 0;
  // The tier's own eviction: when a write would take it above `high_watermark` of its
  // capacity, it reclaims its coldest records down to `low_watermark`. A cache tier fills up:
  // headroom is capacity that caches nothing (0.95/0.90 kept ~7% empty and cost the prefix
  // replay of bench/prefix_replay.py 3 points of hit rate), so the gap is only a reclaim batch.
  double high_watermark = 1.0, low_watermark = 0.99;
  MetricsRegistry* metrics = nullptr;
  const Clock* clock = nullptr;   // nullptr = RealClock
  IoEngine* io_engine = nullptr;  // borrowed, outlives the tier; nullptr = CreateIoEngine (tests
                                  // inject faults here)
  // Asked before the tier's own eviction reclaims records: answers, per victim, whether it may go
  // (the mc-client asks the master, which refuses records a reader holds a lease on). Refused
  // victims stay indexed. Called without the tier's lock held; nullptr = every victim may go.
  std::function<std::vector<bool>(const std::vector<DiskTierVictim>&)> reclaim_guard;
};

// locator packs the file index (high 16 bits) and byte offset (low 48 bits); length is the payload
// length.
struct RecordRef {
  uint64_t locator = 0;
  uint64_t length = 0;
  friend bool operator==(const RecordRef&, const RecordRef&) = default;
};

class DiskTier {
 public:
  // Creates or opens the data files, scans them and rebuilds the index. kInvalidArgument for bad
  // options, kInternal when the files cannot be opened or scanned.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(DiskTierOptions options);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Writes a record for (key, generation) from the gathered pieces (any alignment; they must stay
  // valid until return). Idempotent: when (key, generation) is persisted, returns its RecordRef
  // without writing; concurrent writers of one (key, generation) wait for the first and share its
  // ref. kNoSpace when it cannot fit even after evicting unpinned records (nothing is evicted when
  // eviction could not make room); kTransferFailed on an I/O error (the record is not indexed);
  // kInvalidArgument for a key over 4 KiB. With `expected_checksum`, the payload's XXH3-64 as
  // staged (exactly the bytes written) must equal it, else kChecksumMismatch and no record: the
  // pieces may then be memory that can change under the write (a segment's replica), with no
  // private copy and no second hash.
  absl::StatusOr<RecordRef> Write(
      std::string_view key, uint64_t generation,
      const std::vector<std::pair<const char*, uint64_t>>& payload_pieces,
      std::optional<uint64_t> expected_checksum = std::nullopt);

  // Reads the record at `ref` into `dst` (any alignment; sizes must add up to ref.length, else
  // kSizeMismatch). The payload checksum is computed over `dst` itself as it is written, so OK
  // proves the destination's bytes, not only what came off the disk; `checksum` (optional) then
  // gets that XXH3-64. kNotFound when (key, generation) is not indexed at `ref`;
  // kChecksumMismatch for any difference in header, key, generation, length or payload checksum
  // (dst may then hold garbage); kTransferFailed on an I/O error. The record is pinned for the
  // duration of the read.
  absl::Status Read(RecordRef ref, std::string_view key, uint64_t generation,
                    const std::vector<std::pair<char*, uint64_t>>& dst,
                    uint64_t* checksum = nullptr);

  // Pins a record against the tier's own reclamation while a read lease covers it; Unpin ends it.
  // Pins nest; both ignore a record that is not indexed.
  void Pin(std::string_view key, uint64_t generation);
  void Unpin(std::string_view key, uint64_t generation);

  // kNotFound when absent, kHasLease when pinned (or being read), kNotReady while being written.
  absl::Status Remove(std::string_view key, uint64_t generation);

  struct Entry {
    std::string key;
    uint64_t generation;
    RecordRef ref;
    uint64_t checksum = 0;  // XXH3-64 of the payload
  };
  // Everything indexed (for reporting to the master after a restart).
  std::vector<Entry> List() const;
  // Records dropped by the tier's own watermark eviction since the last call.
  std::vector<Entry> TakeEvicted();

  struct Stats {
    uint64_t used, capacity, records, records_recovered, records_skipped_corrupt, writes, reads,
        write_failures, read_failures, checksum_mismatches, evictions;
  };
  Stats GetStats() const;
  // "io_uring" or "posix".
  std::string_view io_engine_name() const;

 private:
  struct Metrics;
  explicit DiskTier(DiskTierOptions options);
  absl::Status Recover();
  absl::StatusOr<Extent> AllocateWithEviction(uint64_t record_size);
  // Writes and fdatasyncs the record; returns the payload checksum it put in the header.
  // kChecksumMismatch (header never written) when `expected` is set and differs.
  absl::StatusOr<uint64_t> WriteRecord(const Extent& extent, std::string_view key,
                                       uint64_t generation,
                                       const std::vector<std::pair<const char*, uint64_t>>& pieces,
                                       uint64_t payload_len, std::optional<uint64_t> expected);
  absl::Status ReadRecord(const Extent& extent, std::string_view key, uint64_t generation,
                          uint64_t payload_len, const std::vector<std::pair<char*, uint64_t>>& dst,
                          uint64_t* checksum);
  // Zeroes the first page of each extent (so a dropped record is not resurrected at recovery) and
  // returns the extents to the allocator.
  void Reclaim(const std::vector<internal::IndexedRecord>& records);
  // Keeps the victims the reclaim guard refuses (back in the index); returns the others.
  std::vector<internal::IndexedRecord> ApplyReclaimGuard(
      std::vector<internal::IndexedRecord> victims);
  void ZeroHeaders(const std::vector<internal::IndexedRecord>& records);
  // Starts one transfer of `length` bytes at `offset` of `file` (at most kRequestBytes per
  // request); `buffer` must stay valid until the returned batch is waited for or destroyed.
  std::unique_ptr<IoBatch> SubmitRange(IoOp op, uint32_t file, uint64_t offset, char* buffer,
                                       uint64_t length);
  void Fail(const char* reason);
  void UpdateUsedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Immutable after Open.
  const DiskTierOptions options_;
  const Clock* clock_;
  std::unique_ptr<internal::DataFiles> files_;
  std::unique_ptr<IoEngine> owned_engine_;
  IoEngine* engine_ = nullptr;
  std::unique_ptr<Metrics> metrics_;  // null without options.metrics

  mutable absl::Mutex mu_;
  std::unique_ptr<ExtentAllocator> alloc_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<internal::RecordIndex> index_ ABSL_GUARDED_BY(mu_);
  std::vector<Entry> evicted_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_) = {};
};

}  // namespace mc::offload
