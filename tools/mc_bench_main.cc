// mc-bench: benchmarks a running mcstore cluster through the Store gRPC service, and measures
// this machine's limits (memcpy, loopback TCP) to read its figures against.
//   mc-bench --client unix:PATH|H:P [--put_client ...] --value_size 16MiB --batch 16 --mode get
//   mc-bench --client unix:PATH|H:P --mode match_prefix [--prefix_keys 1000] [--iterations 200]
//   mc-bench --baseline
// Prints one `mc-bench run=...` line per run and a `mc-bench summary ...` line of medians.
// Exit code: 0 every item as expected and verified, 1 some item failed, 2 usage/setup errors.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/util.h"
#include "tools/mc_bench_baseline.h"
#include "tools/mc_bench_prefix.h"
#include "tools/mc_bench_stats.h"
#include "tools/mc_bench_store.h"
#include "tools/store_channel.h"
#include "tools/store_channel_flags.h"

ABSL_FLAG(std::string, client, "",
          "mc-client Store address gets go through: HOST:PORT or unix:PATH");
ABSL_FLAG(std::string, put_client, "",
          "mc-client Store address puts go through (default --client)");
ABSL_FLAG(std::string, token_file, "",
          "file holding the Store token, needed over TCP (default: $MCSTORE_TOKEN_FILE)");
ABSL_FLAG(std::string, fd_socket, "",
          "--client's fd socket for shm buffers (default: <PATH>.fd of --client unix:PATH)");
ABSL_FLAG(std::string, put_fd_socket, "", "--put_client's fd socket (default: likewise)");
ABSL_FLAG(bool, store_fast, true,
          "puts, shm gets and match_prefix over the daemon's fast channel (<PATH>.fast of "
          "--client unix:PATH) when that socket exists; false: gRPC only");
ABSL_FLAG(std::string, value_size, "1048576",
          "bytes per value; K/M/G or KiB/MiB/GiB suffixes (1024-based)");
ABSL_FLAG(int32_t, batch, 16, "items per RPC");
ABSL_FLAG(int32_t, keys, 64, "distinct keys put per run");
ABSL_FLAG(double, duplicate_ratio, 0, "fraction of get items repeating a key already in the batch");
ABSL_FLAG(double, hit_ratio, 1,
          "fraction of get items naming stored keys (others: never-put keys)");
ABSL_FLAG(int32_t, threads, 1, "worker threads, each with its own connection and slices");
ABSL_FLAG(int32_t, iterations, 20, "get RPCs per thread per run");
ABSL_FLAG(double, seconds, 0, "> 0: run gets this long per thread per run instead of --iterations");
ABSL_FLAG(double, get_gap_ms, 0,
          "each thread sleeps this long before each get (0-60000): gets spaced as an inference "
          "engine's loads are, each from an idle daemon; GB/s and latencies count only the RPCs");
ABSL_FLAG(std::string, mode, "both",
          "put | get | both: which phases to report (put always runs); match_prefix: time "
          "MatchPrefix over a chain of --prefix_keys keys");
ABSL_FLAG(int32_t, prefix_keys, 1000, "match_prefix: keys in the chain");
ABSL_FLAG(std::string, prefix_value_size, "4KiB", "match_prefix: bytes per value of the chain");
ABSL_FLAG(uint32_t, prefix_lease_ms, 0, "match_prefix: > 0 takes (and releases) a lease per call");
ABSL_FLAG(bool, prefix_packed_keys, true,
          "match_prefix: send the keys packed in one field (false: one by one)");
ABSL_FLAG(std::string, dest, "shm", "shm (slices of a registered shm buffer) | inline");
ABSL_FLAG(bool, verify, true, "check every byte got against the value put");
ABSL_FLAG(int32_t, runs, 1, "repeat; the summary line gives medians");
ABSL_FLAG(int32_t, warmup, 1, "untimed get RPCs per thread before each run's timing");
ABSL_FLAG(std::string, key_prefix, "", "key prefix (default mcb-<pid>)");
ABSL_FLAG(int64_t, timeout_ms, 60000, "deadline of each RPC");
ABSL_FLAG(bool, keep, false, "leave the last run's keys stored");
ABSL_FLAG(bool, stored, false,
          "get only: read the keys an earlier --keep --runs 1 run left (same --key_prefix, --keys, "
          "--value_size); nothing is put or removed");
ABSL_FLAG(uint64_t, seed, 1, "seed of the key choice");
ABSL_FLAG(std::string, cpu_pids, "",
          "comma-separated pids (the daemons) whose CPU seconds per GB moved are printed beside "
          "mc-bench's own (daemons_cpu_s/GB; -1 = not measured)");
ABSL_FLAG(bool, baseline, false, "measure memcpy and loopback TCP throughput instead");
ABSL_FLAG(std::string, baseline_bytes, "1GiB", "memcpy source size (keep it well above the LLC)");
ABSL_FLAG(std::string, baseline_blocks, "1MiB,4MiB,16MiB", "memcpy block sizes");
ABSL_FLAG(double, baseline_seconds, 1.0, "seconds per baseline measurement");

namespace {

using mc::bench::BaselineOptions;
using mc::bench::PrefixBenchOptions;
using mc::bench::StoreBenchOptions;

absl::Status Usage(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

// --baseline: memcpy of --baseline_bytes in --baseline_blocks, and loopback TCP.
absl::StatusOr<BaselineOptions> BaselineFromFlags() {
  BaselineOptions b;
  b.runs = absl::GetFlag(FLAGS_runs);
  b.seconds = absl::GetFlag(FLAGS_baseline_seconds);
  if (!mc::ParseBytes(absl::GetFlag(FLAGS_baseline_bytes), &b.source_bytes)) {
    return Usage("bad --baseline_bytes");
  }
  b.blocks.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_baseline_blocks), ',')) {
    uint64_t n = 0;
    if (!mc::ParseBytes(std::string(part), &n) || n == 0 || n > b.source_bytes / 2) {
      return Usage("bad --baseline_blocks");
    }
    b.blocks.push_back(n);
  }
  return b;
}

// What every Store mode takes: the daemons' addresses, the Store token, TLS, the value size and
// the load's shape.
absl::StatusOr<StoreBenchOptions> StoreFromFlags() {
  StoreBenchOptions o;
  o.client = absl::GetFlag(FLAGS_client);
  o.put_client = absl::GetFlag(FLAGS_put_client);
  o.fd_socket = absl::GetFlag(FLAGS_fd_socket);
  o.put_fd_socket = absl::GetFlag(FLAGS_put_fd_socket);
  o.fast = absl::GetFlag(FLAGS_store_fast);
  if (auto token = mc::tools::ReadStoreTokenFile(absl::GetFlag(FLAGS_token_file)); token.ok()) {
    o.store_token = *std::move(token);
  } else {
    return Usage(absl::StrCat("--token_file: ", token.status().message()));
  }
  absl::StatusOr<mc::ChannelSecurity> security = mc::tools::ChannelSecurityFromFlags();
  if (!security.ok()) return Usage(std::string(security.status().message()));
  o.security = *security;
  if (o.client.empty()) return Usage("--client is required (or --baseline)");
  if (!mc::ParseBytes(absl::GetFlag(FLAGS_value_size), &o.value_size)) {
    return Usage("bad --value_size");
  }
  o.batch = absl::GetFlag(FLAGS_batch);
  o.keys = absl::GetFlag(FLAGS_keys);
  o.duplicate_ratio = absl::GetFlag(FLAGS_duplicate_ratio);
  o.hit_ratio = absl::GetFlag(FLAGS_hit_ratio);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.iterations = absl::GetFlag(FLAGS_iterations);
  o.seconds = absl::GetFlag(FLAGS_seconds);
  o.get_gap_ms = absl::GetFlag(FLAGS_get_gap_ms);
  return o;
}

// --mode match_prefix: a chain of --prefix_keys keys on `o`'s daemon.
absl::StatusOr<PrefixBenchOptions> PrefixFromFlags(const StoreBenchOptions& o) {
  PrefixBenchOptions p;
  p.client = o.client;
  p.store_token = o.store_token;
  p.security = o.security;
  p.chain = absl::GetFlag(FLAGS_prefix_keys);
  if (!mc::ParseBytes(absl::GetFlag(FLAGS_prefix_value_size), &p.value_size)) {
    return Usage("bad --prefix_value_size");
  }
  p.iterations = o.iterations;
  p.runs = absl::GetFlag(FLAGS_runs);
  p.lease_ttl_ms = absl::GetFlag(FLAGS_prefix_lease_ms);
  p.packed_keys = absl::GetFlag(FLAGS_prefix_packed_keys);
  p.key_prefix = absl::GetFlag(FLAGS_key_prefix);
  p.fast = absl::GetFlag(FLAGS_store_fast);
  p.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  p.keep = absl::GetFlag(FLAGS_keep);
  return p;
}

// --mode put|get|both: the phases measured, where gets land, the runs, and the daemons whose
// CPU time is reported.
absl::Status WorkloadFromFlags(const std::string& mode, StoreBenchOptions& o) {
  if (mode != "put" && mode != "get" && mode != "both") {
    return Usage("--mode must be put, get, both or match_prefix");
  }
  o.measure_put = mode != "get";
  o.measure_get = mode != "put";
  const std::string dest = absl::GetFlag(FLAGS_dest);
  if (dest != "shm" && dest != "inline") return Usage("--dest must be shm or inline");
  o.shm = dest == "shm";
  o.verify = absl::GetFlag(FLAGS_verify);
  o.runs = absl::GetFlag(FLAGS_runs);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.key_prefix = absl::GetFlag(FLAGS_key_prefix);
  o.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  o.keep = absl::GetFlag(FLAGS_keep);
  o.stored = absl::GetFlag(FLAGS_stored);
  if (o.stored && (mode != "get" || o.key_prefix.empty())) {
    return Usage("--stored needs --mode get and the --key_prefix of the --keep run");
  }
  o.seed = absl::GetFlag(FLAGS_seed);
  std::string bad;
  if (!mc::bench::ParsePids(absl::GetFlag(FLAGS_cpu_pids), &o.cpu_pids, &bad)) {
    return Usage(absl::StrCat("bad --cpu_pids: '", bad, "' is not a pid"));
  }
  return absl::OkStatus();
}

// Prints a flag problem; the exit code of usage/setup errors.
int UsageError(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "mc-bench --client H:P|unix:PATH [--put_client ...] [--value_size N] [--batch N] "
      "[--mode put|get|both] [--dest shm|inline] [--runs N] | mc-bench --baseline");
  mc::DisableMutexDeadlockDetection();
  absl::ParseCommandLine(argc, argv);

  if (absl::GetFlag(FLAGS_baseline)) {
    absl::StatusOr<BaselineOptions> b = BaselineFromFlags();
    if (!b.ok()) return UsageError(b.status());
    mc::bench::RunBaseline(*b, stdout);
    return 0;
  }
  absl::StatusOr<StoreBenchOptions> o = StoreFromFlags();
  if (!o.ok()) return UsageError(o.status());
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "match_prefix") {
    absl::StatusOr<PrefixBenchOptions> p = PrefixFromFlags(*o);
    if (!p.ok()) return UsageError(p.status());
    return mc::bench::RunPrefixBench(*p, stdout);
  }
  if (absl::Status s = WorkloadFromFlags(mode, *o); !s.ok()) return UsageError(s);
  return mc::bench::RunStoreBench(*o, stdout);
}
