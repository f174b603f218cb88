// Master rebuild after a restart: one client registers big segments with
// will_report_objects and reports N COMPLETE objects (keys of ~64 bytes) in chunks, straight
// through MetadataService::ReportObjects (no gRPC). Prints the rebuild time and the master's
// memory per object (the RSS growth over the report, from /proc/self/statm, divided by N; the
// keys' own bytes are counted once in the figure and shown apart). Never asserts on time.
//   build/bench/mc_recovery_bench [--objects=1000000] [--chunk=4096] [--object_size=65536]
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "master/metadata_service.h"
#include "master/object.h"
#include "master/object_table.h"

ABSL_FLAG(uint64_t, objects, 1'000'000, "objects reported");
ABSL_FLAG(uint64_t, chunk, 4096, "objects per ReportObjects call");
ABSL_FLAG(uint64_t, object_size, 64 << 10, "bytes per object (placement only: no payload)");
ABSL_FLAG(uint64_t, key_size, 64, "bytes per key");

namespace {

uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0;
  uint64_t resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// A key like a chained block hash: `key_size` hex digits derived from `i`.
std::string KeyOf(uint64_t i, size_t key_size) {
  std::string key;
  key.reserve(key_size);
  uint64_t x = i * 0x9e3779b97f4a7c15ull + 1;
  while (key.size() < key_size) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    key += absl::StrFormat("%016x", x);
  }
  key.resize(key_size);
  return key;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  mc::SetLogLevel("info");
  const uint64_t n = absl::GetFlag(FLAGS_objects);
  const uint64_t chunk = std::max<uint64_t>(1, absl::GetFlag(FLAGS_chunk));
  const uint64_t object_size = std::max<uint64_t>(64, absl::GetFlag(FLAGS_object_size));
  const size_t key_size = absl::GetFlag(FLAGS_key_size);

  mc::master::MasterOptions options;
  options.shards = 32;
  options.max_segments_per_client = 256;
  // Segments of 1 TiB at most (each a multiple of the object size), as many as the objects need.
  const uint64_t per_segment = std::max<uint64_t>(1, (1ull << 40) / object_size);
  std::vector<uint64_t> segments;
  for (uint64_t left = n; left > 0; left -= std::min(left, per_segment)) {
    segments.push_back(std::min(left, per_segment) * object_size);
  }
  mc::RealClock clock;
  mc::MetricsRegistry metrics;
  mc::master::MetadataService service(options, clock, metrics);
  mc::master::ClientInfo info;
  info.client_id = "owner";
  info.host = "host";
  info.endpoint = "10.0.0.1:7000";
  auto reg = service.RegisterClient(info, segments, {}, /*will_report_objects=*/true);
  if (!reg.ok()) {
    std::fprintf(stderr, "register: %s\n", reg.status().ToString().c_str());
    return 1;
  }

  // The owner's index, built before the baseline: the keys the bench holds are not the master's.
  std::vector<std::string> keys;
  keys.reserve(n);
  for (uint64_t i = 0; i < n; ++i) keys.push_back(KeyOf(i, key_size));
  std::vector<mc::master::ReportedObjectItem> items;
  items.reserve(chunk);

  const uint64_t rss_before = ResidentBytes();
  const auto start = std::chrono::steady_clock::now();
  uint64_t ok = 0;
  for (uint64_t first = 0; first < n; first += chunk) {
    items.clear();
    const uint64_t end = std::min(n, first + chunk);
    for (uint64_t i = first; i < end; ++i) {
      const uint64_t seg = i / per_segment;
      const uint64_t offset = (i % per_segment) * object_size;
      items.push_back(
          {keys[i], 1'000'000 + i, object_size, i * 31 + 7, reg->segment_ids[seg], offset});
    }
    auto results = service.ReportObjects("owner", reg->session, items, end == n);
    if (!results.ok()) {
      std::fprintf(stderr, "report: %s\n", results.status().ToString().c_str());
      return 1;
    }
    for (const auto& s : *results) ok += s.ok() ? 1 : 0;
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  const uint64_t rss_after = ResidentBytes();

  const double per_object = n == 0 ? 0.0 : static_cast<double>(rss_after - rss_before) / n;
  std::printf("objects reported      %llu (restored %llu) in chunks of %llu, %zu-byte keys\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(ok),
              static_cast<unsigned long long>(chunk), key_size);
  std::printf("segments              %zu (%llu objects of %llu bytes each at most)\n",
              segments.size(), static_cast<unsigned long long>(per_segment),
              static_cast<unsigned long long>(object_size));
  std::printf("rebuild time          %.3f s (%.0f objects/s, %.2f us/object)\n", took.count(),
              n / took.count(), took.count() * 1e6 / std::max<uint64_t>(n, 1));
  std::printf("master RSS growth     %.1f MiB\n", (rss_after - rss_before) / 1048576.0);
  std::printf("per object            %.0f bytes (%.0f beyond the %zu-byte key)\n", per_object,
              per_object - static_cast<double>(key_size), key_size);
  std::printf(
      "layout                sizeof(Object) %zu, sizeof(StoredReplica) %zu, node %zu bytes "
      "(Object + key; the first replica inline, the table's slot a pointer to the node)\n",
      sizeof(mc::master::Object), sizeof(mc::master::StoredReplica),
      mc::master::ObjectMap::NodeBytes(key_size));
  std::printf("keys / mem used       %llu / %llu bytes\n",
              static_cast<unsigned long long>(service.KeyCount()),
              static_cast<unsigned long long>(service.Snapshot().mem_used));
  return ok == n ? 0 : 1;
}
