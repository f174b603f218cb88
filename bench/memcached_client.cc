// mc-bench-memcached: the memcached side of bench/compare.sh. Preloads `keys` values with the
// text protocol's `set`, then times multi-gets (`get k1 ... kN`, N = --batch) whose values are
// received straight into distinct destination slots (as mcstore writes shm slices), checks the
// bytes, and prints one line per run plus a summary of medians in mc-bench's format.
//   mc-bench-memcached --server 127.0.0.1:11211 --value_size 1MiB --batch 16 --keys 64
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/util.h"
#include "tools/mc_bench_pattern.h"
#include "tools/mc_bench_stats.h"

ABSL_FLAG(std::string, server, "127.0.0.1:11211", "memcached HOST:PORT");
ABSL_FLAG(std::string, value_size, "1MiB", "bytes per value (K/M/G suffixes, 1024-based)");
ABSL_FLAG(int32_t, batch, 16, "keys per multi-get");
ABSL_FLAG(int32_t, keys, 64, "distinct keys preloaded");
ABSL_FLAG(int32_t, iterations, 20, "multi-gets per run");
ABSL_FLAG(int32_t, runs, 1, "repeat; the summary gives medians");
ABSL_FLAG(bool, verify, true, "check every byte got");
ABSL_FLAG(std::string, key_prefix, "mcbm", "key prefix");
ABSL_FLAG(std::string, cpu_pids, "",
          "comma-separated pids (the memcached server) whose CPU seconds per GB moved are printed "
          "beside this client's own (server_cpu_s/GB; -1 = not measured)");

namespace {

using mc::bench::CheckPattern;
using mc::bench::FillPattern;

// A blocking text-protocol connection with a small read-ahead buffer.
class Conn {
 public:
  ~Conn() {
    if (fd_ >= 0) close(fd_);
  }
  bool Connect(const std::string& hostport) {
    size_t colon = hostport.rfind(':');
    if (colon == std::string::npos) return false;
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(hostport.substr(0, colon).c_str(), hostport.substr(colon + 1).c_str(), &hints,
                    &res) != 0) {
      return false;
    }
    fd_ = socket(res->ai_family, SOCK_STREAM, 0);
    bool ok = fd_ >= 0 && connect(fd_, res->ai_addr, res->ai_addrlen) == 0;
    freeaddrinfo(res);
    int one = 1;
    if (ok) setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return ok;
  }
  bool SendAll(const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = send(fd_, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  // Reads one "\r\n"-terminated line (without it).
  bool ReadLine(std::string* line) {
    line->clear();
    for (;;) {
      for (; pos_ < len_; ++pos_) {
        if (buf_[pos_] == '\n') {
          ++pos_;
          if (!line->empty() && line->back() == '\r') line->pop_back();
          return true;
        }
        line->push_back(buf_[pos_]);
      }
      if (!Fill()) return false;
    }
  }
  // Reads exactly n bytes into dst: first what is buffered, then straight from the socket.
  bool ReadExact(char* dst, size_t n) {
    size_t have = std::min(n, len_ - pos_);
    std::memcpy(dst, buf_ + pos_, have);
    pos_ += have;
    while (have < n) {
      ssize_t r = recv(fd_, dst + have, n - have, 0);
      if (r <= 0) return false;
      have += static_cast<size_t>(r);
    }
    return true;
  }

 private:
  bool Fill() {
    ssize_t r = recv(fd_, buf_, sizeof(buf_), 0);
    if (r <= 0) return false;
    pos_ = 0;
    len_ = static_cast<size_t>(r);
    return true;
  }
  int fd_ = -1;
  char buf_[16384];
  size_t pos_ = 0, len_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("mc-bench-memcached --server H:P --value_size N --batch N --keys N");
  absl::ParseCommandLine(argc, argv);
  uint64_t size = 0;
  if (!mc::ParseBytes(absl::GetFlag(FLAGS_value_size), &size) || size == 0) {
    std::fprintf(stderr, "bad --value_size\n");
    return 2;
  }
  const int batch = absl::GetFlag(FLAGS_batch);
  const int keys = absl::GetFlag(FLAGS_keys);
  const std::string prefix = absl::GetFlag(FLAGS_key_prefix);
  const bool verify = absl::GetFlag(FLAGS_verify);
  std::vector<int> cpu_pids;
  std::string bad;
  if (!mc::bench::ParsePids(absl::GetFlag(FLAGS_cpu_pids), &cpu_pids, &bad)) {
    std::fprintf(stderr, "bad --cpu_pids: '%s' is not a pid\n", bad.c_str());
    return 2;
  }
  Conn conn;
  if (!conn.Connect(absl::GetFlag(FLAGS_server))) {
    std::fprintf(stderr, "cannot connect to %s\n", absl::GetFlag(FLAGS_server).c_str());
    return 2;
  }
  std::vector<char> slots(static_cast<size_t>(size) * batch);
  std::memset(slots.data(), 0, slots.size());
  std::string line;
  for (int id = 0; id < keys; ++id) {  // preload, untimed
    FillPattern(slots.data(), size, static_cast<uint64_t>(id));
    std::string head = absl::StrCat("set ", prefix, "-", id, " 0 0 ", size, "\r\n");
    if (!conn.SendAll(head.data(), head.size()) || !conn.SendAll(slots.data(), size) ||
        !conn.SendAll("\r\n", 2) || !conn.ReadLine(&line) || line != "STORED") {
      std::fprintf(stderr, "set %s-%d failed: %s\n", prefix.c_str(), id, line.c_str());
      return 2;
    }
  }
  std::mt19937_64 rng(1);
  std::vector<double> run_gbps, run_items, run_p50, run_p99, run_cpu, run_server_cpu;
  uint64_t failures = 0;
  for (int run = 1; run <= absl::GetFlag(FLAGS_runs); ++run) {
    std::vector<double> lat_ms;
    uint64_t bytes = 0, items = 0, fails = 0;
    double busy = 0;
    double cpu0 = 0, server0 = -1;                                   // taken after the warm-up
    for (int it = -1; it < absl::GetFlag(FLAGS_iterations); ++it) {  // it == -1: warm-up
      std::vector<int> ids;
      std::string req = "get";
      for (int j = 0; j < batch; ++j) {
        int id = 0;
        for (int a = 0; a < 16; ++a) {
          id = std::uniform_int_distribution<int>(0, keys - 1)(rng);
          if (std::find(ids.begin(), ids.end(), id) == ids.end()) break;
        }
        ids.push_back(id);
        absl::StrAppend(&req, " ", prefix, "-", id);
      }
      req += "\r\n";
      if (it == 0) {
        cpu0 = mc::bench::OwnCpuSeconds();
        server0 = cpu_pids.empty() ? -1 : mc::bench::ProcessesCpuSeconds(cpu_pids);
      }
      if (verify) {
        for (int j = 0; j < batch; ++j) mc::bench::PoisonPages(slots.data() + j * size, size);
      }
      auto t0 = std::chrono::steady_clock::now();
      if (!conn.SendAll(req.data(), req.size())) return 2;
      int got = 0;
      for (;;) {
        if (!conn.ReadLine(&line)) return 2;
        if (line == "END") break;
        // VALUE <key> <flags> <bytes>
        size_t sp = line.rfind(' ');
        uint64_t n = 0;
        if (line.rfind("VALUE ", 0) != 0 || sp == std::string::npos ||
            !absl::SimpleAtoi(line.substr(sp + 1), &n) || n != size || got >= batch) {
          std::fprintf(stderr, "unexpected reply: %s\n", line.c_str());
          return 2;
        }
        char crlf[2];
        if (!conn.ReadExact(slots.data() + got * size, size) || !conn.ReadExact(crlf, 2)) return 2;
        ++got;
      }
      double d = mc::bench::SecondsSince(t0);
      if (it < 0) continue;
      busy += d;
      lat_ms.push_back(d * 1e3);
      items += batch;
      bytes += static_cast<uint64_t>(got) * size;
      // memcached answers in request order, skipping misses; we never miss here.
      if (got != batch) fails += batch - got;
      for (int j = 0; verify && j < got; ++j) {
        if (!CheckPattern(slots.data() + j * size, size, static_cast<uint64_t>(ids[j]))) ++fails;
      }
    }
    mc::bench::LatencySummary l = mc::bench::Summarize(lat_ms);
    double gbps = static_cast<double>(bytes) / busy / 1e9;
    // CPU per GB moved over the timed iterations (verification included, as mc-bench's).
    const double gb = static_cast<double>(bytes) / 1e9;
    const double server1 = cpu_pids.empty() ? -1 : mc::bench::ProcessesCpuSeconds(cpu_pids);
    const double cpu = gb > 0 ? (mc::bench::OwnCpuSeconds() - cpu0) / gb : -1;
    const double server_cpu =
        gb > 0 && server0 >= 0 && server1 >= 0 ? (server1 - server0) / gb : -1;
    std::printf(
        "memcached run=%d value_size=%llu batch=%d items=%llu fail=%llu GB/s=%.3f items/s=%.1f "
        "p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f cpu_s/GB=%.3f server_cpu_s/GB=%.3f\n",
        run, static_cast<unsigned long long>(size), batch, static_cast<unsigned long long>(items),
        static_cast<unsigned long long>(fails), gbps, static_cast<double>(items) / busy, l.p50_ms,
        l.p90_ms, l.p99_ms, l.max_ms, cpu, server_cpu);
    run_gbps.push_back(gbps);
    run_items.push_back(static_cast<double>(items) / busy);
    run_p50.push_back(l.p50_ms);
    run_p99.push_back(l.p99_ms);
    run_cpu.push_back(cpu);
    run_server_cpu.push_back(server_cpu);
    failures += fails;
  }
  std::printf(
      "memcached summary runs=%zu value_size=%llu batch=%d GB/s=%.3f items/s=%.1f p50_ms=%.3f "
      "p99_ms=%.3f fail=%llu cpu_s/GB=%.3f server_cpu_s/GB=%.3f\n",
      run_gbps.size(), static_cast<unsigned long long>(size), batch, mc::bench::Median(run_gbps),
      mc::bench::Median(run_items), mc::bench::Median(run_p50), mc::bench::Median(run_p99),
      static_cast<unsigned long long>(failures), mc::bench::Median(run_cpu),
      mc::bench::Median(run_server_cpu));
  return failures == 0 ? 0 : 1;
}
