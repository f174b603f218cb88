// DiskTier internals shared by its two .cc files: locator packing and the metric handles.
#pragma once

#include <cstdint>
#include <string>

#include "common/metrics.h"
#include "offload/disk_tier.h"
#include "offload/extent_allocator.h"

namespace mc::offload {

inline constexpr int kLocatorOffsetBits = 48;
inline constexpr uint64_t kLocatorOffsetMask = (uint64_t{1} << kLocatorOffsetBits) - 1;

inline uint64_t PackLocator(const Extent& e) {
  return (uint64_t{e.file} << kLocatorOffsetBits) | e.offset;
}
inline uint32_t LocatorFile(uint64_t locator) {
  return static_cast<uint32_t>(locator >> kLocatorOffsetBits);
}
inline uint64_t LocatorOffset(uint64_t locator) { return locator & kLocatorOffsetMask; }

struct DiskTier::Metrics {
  explicit Metrics(MetricsRegistry& r)
      : registry(r),
        used(&r.GetGauge("mc_ssd_used_bytes", "Bytes of SSD tier space in use")),
        capacity(&r.GetGauge("mc_ssd_capacity_bytes", "Bytes of SSD tier capacity")),
        writes(&r.GetCounter("mc_ssd_writes_total", "Records written to the SSD tier")),
        reads(&r.GetCounter("mc_ssd_reads_total", "Records read from the SSD tier")),
        bytes_written(&r.GetCounter("mc_ssd_bytes_written_total", "Payload bytes written")),
        bytes_read(&r.GetCounter("mc_ssd_bytes_read_total", "Payload bytes read")),
        checksum_mismatches(&r.GetCounter("mc_ssd_checksum_mismatches_total",
                                          "SSD reads rejected by record verification")),
        recovered(&r.GetCounter("mc_ssd_records_recovered_total", "Records indexed at recovery")),
        skipped(&r.GetCounter("mc_ssd_records_skipped_total",
                              "Torn or corrupt records skipped at recovery")),
        evictions(&r.GetCounter("mc_ssd_evictions_total",
                                "Records dropped by the SSD tier's own watermark eviction")) {
    // Every reason exported from the start at 0: a series that appears only at its first
    // failure hides that failure from Prometheus's increase() (and from alerts on it).
    for (const char* reason : {"no_space", "write", "read"}) Failure(reason);
  }
  Counter& Failure(const std::string& reason) {
    return registry.GetCounter("mc_ssd_failures_total", "SSD tier operations that failed",
                               {{"reason", reason}});
  }

  MetricsRegistry& registry;
  Gauge* used;
  Gauge* capacity;
  Counter* writes;
  Counter* reads;
  Counter* bytes_written;
  Counter* bytes_read;
  Counter* checksum_mismatches;
  Counter* recovered;
  Counter* skipped;
  Counter* evictions;
};

}  // namespace mc::offload
