// DiskTier: Open and recovery, the index/allocation side of Write, Pin/Remove/List and stats.
// The record I/O itself lives in disk_tier_io.cc.
#include "offload/disk_tier.h"

#include "absl/strings/str_format.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "offload/internal/data_files.h"
#include "offload/internal/record_index.h"
#include "offload/internal/recovery.h"
#include "offload/internal/tier_internal.h"
#include "offload/record_format.h"

namespace mc::offload {
namespace {

constexpr int kMaxEvictionRounds = 16;

absl::Status ValidateOptions(const DiskTierOptions& o) {
  if (o.dir.empty()) return McError(Code::kInvalidArgument, "disk tier: dir is empty");
  if (o.num_files < 1 || o.num_files > 65535) {
    return McError(Code::kInvalidArgument, "disk tier: num_files must be in 1..65535");
  }
  if (o.capacity / static_cast<uint64_t>(o.num_files) < kPageSize) {
    return McError(Code::kInvalidArgument, "disk tier: capacity below 4 KiB per data file");
  }
  if (!(o.low_watermark > 0 && o.low_watermark <= o.high_watermark && o.high_watermark <= 1)) {
    return McError(Code::kInvalidArgument,
                   "disk tier: need 0 < low_watermark <= high_watermark <= 1");
  }
  if (o.io_chunk_bytes % kPageSize != 0 || o.io_chunk_bytes > kMaxIoChunkBytes) {
    return McError(Code::kInvalidArgument,
                   "disk tier: io_chunk_bytes must be a 4 KiB multiple of at most 4 MiB");
  }
  return absl::OkStatus();
}

}  // namespace

DiskTier::DiskTier(DiskTierOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &RealClock::Get()) {}

DiskTier::~DiskTier() = default;

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(DiskTierOptions options) {
  MC_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<DiskTier> tier(new DiskTier(std::move(options)));
  const DiskTierOptions& o = tier->options_;
  const uint64_t file_size = RoundDownToPage(o.capacity / static_cast<uint64_t>(o.num_files));
  MC_ASSIGN_OR_RETURN(tier->files_,
                      internal::DataFiles::Open(o.dir, o.num_files, file_size, o.direct_io));
  if (o.io_engine != nullptr) {
    tier->engine_ = o.io_engine;
  } else {
    tier->owned_engine_ =
        CreateIoEngine({.queue_depth = o.queue_depth, .force_posix = o.force_posix_io});
    tier->engine_ = tier->owned_engine_.get();
  }
  if (o.metrics != nullptr) tier->metrics_ = std::make_unique<Metrics>(*o.metrics);
  {
    absl::MutexLock lock(&tier->mu_);
    tier->alloc_ = std::make_unique<ExtentAllocator>(
        std::vector<uint64_t>(static_cast<size_t>(o.num_files), file_size));
    tier->index_ = std::make_unique<internal::RecordIndex>();
    if (tier->metrics_)
      tier->metrics_->capacity->Set(static_cast<int64_t>(tier->alloc_->capacity()));
  }
  MC_RETURN_IF_ERROR(tier->Recover());
  return tier;
}

absl::Status DiskTier::Recover() {
  static auto& log = Logger("offload");
  const int64_t start_ms = clock_->NowMs();
  std::vector<internal::IndexedRecord> duplicates;
  uint64_t recovered = 0, skipped = 0;
  for (uint32_t f = 0; f < files_->count(); ++f) {
    MC_ASSIGN_OR_RETURN(internal::ScanResult scan,
                        internal::ScanDataFile(*engine_, files_->fd(f), f, files_->file_size()));
    absl::MutexLock lock(&mu_);
    skipped += scan.skipped_corrupt;
    for (internal::RecoveredRecord& r : scan.records) {
      const Extent extent{r.file, r.offset, r.record_size};
      const RecordHeader& h = r.header;
      if (index_->Find(h.key, h.generation) != nullptr) {
        duplicates.push_back({h.key, h.generation, extent, h.payload_len, h.payload_checksum});
        continue;
      }
      if (absl::Status s = alloc_->MarkUsed(extent); !s.ok()) {
        ++skipped;
        continue;
      }
      index_->MarkReady(h.key, h.generation, extent, h.payload_len, h.payload_checksum);
      ++recovered;
    }
  }
  ZeroHeaders(duplicates);  // keep one copy; the others become free space
  {
    absl::MutexLock lock(&mu_);
    stats_.records_recovered = recovered;
    stats_.records_skipped_corrupt = skipped;
    UpdateUsedLocked();
  }
  if (metrics_) {
    metrics_->recovered->Inc(recovered);
    metrics_->skipped->Inc(skipped);
  }
  log.info(
      "disk tier {}: recovered {} records, skipped {} corrupt, {} duplicates, in {} ms "
      "(io engine {}, direct io {})",
      options_.dir, recovered, skipped, duplicates.size(), clock_->NowMs() - start_ms,
      engine_->Name(), files_->direct());
  return absl::OkStatus();
}

absl::StatusOr<RecordRef> DiskTier::Write(
    std::string_view key, uint64_t generation,
    const std::vector<std::pair<const char*, uint64_t>>& payload_pieces,
    std::optional<uint64_t> expected_checksum) {
  MC_RETURN_IF_ERROR(ValidateKey(key));
  uint64_t payload_len = 0;
  for (const auto& [ptr, len] : payload_pieces) {
    if (len > kMaxRecordPayloadLength - payload_len || (ptr == nullptr && len > 0)) {
      return McError(Code::kInvalidArgument, "payload too large or null piece");
    }
    payload_len += len;
  }
  {
    absl::MutexLock lock(&mu_);
    while (index_->InsertWriting(key, generation) == nullptr) {
      const internal::Slot* s = index_->Find(key, generation);
      if (s->ready) {
        index_->Touch(key, generation);
        return RecordRef{PackLocator(s->extent), s->payload_len};
      }
      // Another writer of this (key, generation): wait for its outcome (ready, or gone on failure).
      auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const internal::Slot* t = index_->Find(key, generation);
        return t == nullptr || t->ready;
      };
      mu_.Await(absl::Condition(&settled));
    }
  }
  absl::StatusOr<Extent> extent = AllocateWithEviction(RecordSize(key.size(), payload_len));
  absl::Status status = extent.status();
  uint64_t checksum = 0;  // of the payload, computed while it is staged
  if (status.ok()) {
    absl::StatusOr<uint64_t> written =
        WriteRecord(*extent, key, generation, payload_pieces, payload_len, expected_checksum);
    status = written.status();
    if (written.ok()) checksum = *written;
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    index_->Erase(key, generation);  // a waiting duplicate writer retries
    if (extent.ok()) {
      alloc_->Free(*extent).IgnoreError();  // ours, allocated above: cannot be a double free
      UpdateUsedLocked();
    }
    if (ToCode(status) != Code::kChecksumMismatch) {  // the caller's bytes changed: no failure
      ++stats_.write_failures;
      Fail(ToCode(status) == Code::kNoSpace ? "no_space" : "write");
    }
    return status;
  }
  index_->MarkReady(key, generation, *extent, payload_len, checksum);
  ++stats_.writes;
  if (metrics_) {
    metrics_->writes->Inc();
    metrics_->bytes_written->Inc(payload_len);
  }
  return RecordRef{PackLocator(*extent), payload_len};
}

absl::StatusOr<Extent> DiskTier::AllocateWithEviction(uint64_t record_size) {
  bool refused = false;  // some round's victims were all refused by the reclaim guard
  for (int round = 0; round <= kMaxEvictionRounds; ++round) {
    std::vector<internal::IndexedRecord> victims;
    {
      absl::MutexLock lock(&mu_);
      if (record_size > files_->file_size()) {
        return McError(Code::kNoSpace, "disk tier: record larger than a data file");
      }
      const double capacity = static_cast<double>(alloc_->capacity());
      const uint64_t used = alloc_->used();
      const bool over =
          static_cast<double>(used + record_size) > options_.high_watermark * capacity;
      if (!over) {
        if (auto e = alloc_->Allocate(record_size)) {
          UpdateUsedLocked();
          return *e;
        }
      }
      if (alloc_->free_bytes() + index_->evictable_bytes() >= record_size &&
          round < kMaxEvictionRounds) {
        const auto low = static_cast<uint64_t>(options_.low_watermark * capacity);
        const uint64_t want =
            over ? used + record_size - std::min(low, used + record_size) : record_size;
        if (options_.reclaim_guard) {
          // Stay indexed (pinned, so readable and not picked twice) until the guard answers.
          victims = index_->PeekVictims(want);
          for (const auto& v : victims) index_->Pin(v.key, v.generation);
        } else {
          victims = index_->TakeVictims(want);
        }
      }
      if (victims.empty()) {
        if (auto e = alloc_->Allocate(record_size)) {
          UpdateUsedLocked();
          return *e;
        }
        return McError(Code::kNoSpace,
                       refused ? "disk tier: no space (the records that could go are leased)"
                               : "disk tier: no space (remaining records are pinned or busy)");
      }
    }
    victims = ApplyReclaimGuard(std::move(victims));
    if (victims.empty()) {
      // Every victim of this round is leased; refused ones went back to the recent end of the
      // LRU, so the next round takes the next-coldest records instead.
      refused = true;
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      for (const auto& v : victims) {
        evicted_.push_back(Entry{v.key, v.generation,
                                 RecordRef{PackLocator(v.extent), v.payload_len}, v.checksum});
      }
      stats_.evictions += victims.size();
    }
    if (metrics_) metrics_->evictions->Inc(victims.size());
    Reclaim(victims);
  }
  return McError(Code::kNoSpace, refused ? "disk tier: no space (the records that could go are leased)"
                                         : "disk tier: no space");
}

std::vector<internal::IndexedRecord> DiskTier::ApplyReclaimGuard(
    std::vector<internal::IndexedRecord> victims) {
  if (!options_.reclaim_guard || victims.empty()) return victims;
  std::vector<DiskTierVictim> asked;
  for (const auto& v : victims) {
    asked.push_back({v.key, v.generation, PackLocator(v.extent), v.payload_len});
  }
  std::vector<bool> allowed = options_.reclaim_guard(asked);
  std::vector<internal::IndexedRecord> go;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < victims.size(); ++i) {
    const std::string& key = victims[i].key;
    const uint64_t generation = victims[i].generation;
    index_->Unpin(key, generation);
    const internal::Slot* s = index_->Find(key, generation);
    if (i < allowed.size() && allowed[i] && s != nullptr && s->ready && s->pins == 0) {
      index_->Erase(key, generation);
      go.push_back(std::move(victims[i]));
    } else {
      // Refused (leased, or the master could not be asked), or being read right now: the record
      // stays readable, at the recent end so the next round tries colder ones.
      index_->Touch(key, generation);
    }
  }
  return go;
}

void DiskTier::Reclaim(const std::vector<internal::IndexedRecord>& records) {
  ZeroHeaders(records);
  absl::MutexLock lock(&mu_);
  for (const auto& r : records) alloc_->Free(r.extent).IgnoreError();  // taken from the index
  UpdateUsedLocked();
}

void DiskTier::Pin(std::string_view key, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  index_->Pin(key, generation);
}

void DiskTier::Unpin(std::string_view key, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  index_->Unpin(key, generation);
}

absl::Status DiskTier::Remove(std::string_view key, uint64_t generation) {
  internal::IndexedRecord record;
  {
    absl::MutexLock lock(&mu_);
    const internal::Slot* s = index_->Find(key, generation);
    if (s == nullptr) return McError(Code::kNotFound, "disk tier: no such record");
    if (!s->ready) return McError(Code::kNotReady, "disk tier: record is being written");
    if (s->pins > 0) return McError(Code::kHasLease, "disk tier: record is pinned");
    record = {std::string(key), generation, s->extent, s->payload_len};
    index_->Erase(key, generation);
  }
  Reclaim({record});
  return absl::OkStatus();
}

std::vector<DiskTier::Entry> DiskTier::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  for (auto& r : index_->ListReady()) {
    out.push_back(Entry{std::move(r.key), r.generation,
                        RecordRef{PackLocator(r.extent), r.payload_len}, r.checksum});
  }
  return out;
}

std::vector<DiskTier::Entry> DiskTier::TakeEvicted() {
  absl::MutexLock lock(&mu_);
  return std::exchange(evicted_, {});
}

DiskTier::Stats DiskTier::GetStats() const {
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.used = alloc_->used();
  s.capacity = alloc_->capacity();
  s.records = index_->ready_count();
  return s;
}

std::string_view DiskTier::io_engine_name() const { return engine_->Name(); }

void DiskTier::UpdateUsedLocked() {
  if (metrics_) metrics_->used->Set(static_cast<int64_t>(alloc_->used()));
}

void DiskTier::Fail(const char* reason) {
  if (metrics_) metrics_->Failure(reason).Inc();
}

}  // namespace mc::offload
