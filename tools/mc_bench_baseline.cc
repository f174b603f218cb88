#include "tools/mc_bench_baseline.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "tools/mc_bench_stats.h"

namespace mc::bench {

namespace {

constexpr double kGB = 1e9;

char* MapTouched(uint64_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, 0x5a, size);  // fault in every page before timing
  return static_cast<char*>(p);
}

// One timed pass: copies `block`-sized pieces, walking the source and destination round-robin.
double MemcpyOnce(char* src, uint64_t src_size, char* dst, uint64_t dst_size, uint64_t block,
                  double seconds) {
  uint64_t so = 0, dof = 0, bytes = 0;
  auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 8; ++i) {
      if (so + block > src_size) so = 0;
      if (dof + block > dst_size) dof = 0;
      std::memcpy(dst + dof, src + so, block);
      so += block;
      dof += block;
      bytes += block;
    }
    elapsed = SecondsSince(t0);
  } while (elapsed < seconds);
  return static_cast<double>(bytes) / elapsed / kGB;
}

// Loopback stream: returns GB/s, or a negative value on a socket error.
double TcpOnce(uint64_t write_bytes, double seconds) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(lfd, 1) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(lfd);
    return -1;
  }
  int cfd = socket(AF_INET, SOCK_STREAM, 0);
  if (cfd < 0 || connect(cfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(lfd);
    if (cfd >= 0) close(cfd);
    return -1;
  }
  int sfd = accept(lfd, nullptr, nullptr);
  close(lfd);
  if (sfd < 0) {
    close(cfd);
    return -1;
  }
  int one = 1;
  setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  const uint64_t src_size = 64ull << 20;
  const uint64_t dst_size = 256ull << 20;
  char* src = MapTouched(src_size);
  char* dst = MapTouched(dst_size);
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    uint64_t off = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      if (off + write_bytes > src_size) off = 0;
      ssize_t n = send(cfd, src + off, write_bytes, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<uint64_t>(n);
    }
    shutdown(cfd, SHUT_WR);
  });
  uint64_t bytes = 0, off = 0;
  auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  bool failed = false;
  while ((elapsed = SecondsSince(t0)) < seconds) {
    if (off + write_bytes > dst_size) off = 0;
    ssize_t n = recv(sfd, dst + off, write_bytes, 0);
    if (n <= 0) {
      failed = true;
      break;
    }
    off += static_cast<uint64_t>(n);
    bytes += static_cast<uint64_t>(n);
  }
  stop = true;
  // Drain so the sender's last send returns, then close.
  shutdown(sfd, SHUT_RDWR);
  sender.join();
  close(cfd);
  close(sfd);
  munmap(src, src_size);
  munmap(dst, dst_size);
  if (failed) return -1;
  return static_cast<double>(bytes) / elapsed / kGB;
}

}  // namespace

BaselineResult RunBaseline(const BaselineOptions& o, FILE* out) {
  BaselineResult result;
  const uint64_t dst_size = o.source_bytes / 2;
  char* src = MapTouched(o.source_bytes);
  char* dst = MapTouched(dst_size);
  if (src == nullptr || dst == nullptr) {
    std::fprintf(out, "mc-bench baseline memcpy: cannot map %llu bytes\n",
                 static_cast<unsigned long long>(o.source_bytes));
  } else {
    for (uint64_t block : o.blocks) {
      std::vector<double> runs;
      for (int r = 0; r < o.runs; ++r) {
        double g = MemcpyOnce(src, o.source_bytes, dst, dst_size, block, o.seconds);
        runs.push_back(g);
        std::fprintf(out, "mc-bench baseline-run memcpy run=%d block=%llu GB/s=%.3f\n", r + 1,
                     static_cast<unsigned long long>(block), g);
      }
      result.memcpy_gbps.push_back(Median(runs));
      std::fprintf(out, "mc-bench baseline memcpy block=%llu source=%llu runs=%d GB/s=%.3f\n",
                   static_cast<unsigned long long>(block),
                   static_cast<unsigned long long>(o.source_bytes), o.runs, Median(runs));
    }
  }
  if (src != nullptr) munmap(src, o.source_bytes);
  if (dst != nullptr) munmap(dst, dst_size);

  std::vector<double> runs;
  for (int r = 0; r < o.runs; ++r) {
    double g = TcpOnce(o.tcp_write_bytes, o.seconds);
    if (g < 0) {
      std::fprintf(out, "mc-bench baseline tcp: socket error: %s\n", std::strerror(errno));
      continue;
    }
    runs.push_back(g);
    std::fprintf(out, "mc-bench baseline-run tcp run=%d write=%llu GB/s=%.3f\n", r + 1,
                 static_cast<unsigned long long>(o.tcp_write_bytes), g);
  }
  result.tcp_gbps = Median(runs);
  std::fprintf(out, "mc-bench baseline tcp write=%llu runs=%zu GB/s=%.3f\n",
               static_cast<unsigned long long>(o.tcp_write_bytes), runs.size(), result.tcp_gbps);
  std::fflush(out);
  return result;
}

}  // namespace mc::bench
