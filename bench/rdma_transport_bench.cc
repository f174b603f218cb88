// mc-rdma-bench: the rdma transport's throughput between two engines of one process over a real
// verbs device (rxe0 in the VM of bench/rdma.sh, or a NIC): engine B serves a segment and answers
// the kRdmaConnect setup on a tcp data-plane server, engine A READs or WRITEs values of a given
// size into registered memory, `--depth` requests per batch, for `--seconds`. Prints MB/s; never
// asserts on time. Usage: mc-rdma-bench [read|write] VALUE_BYTES [SECONDS] [DEPTH]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "transfer/tcp/server.h"
#include "transfer/transfer_engine.h"

using namespace mc::transfer;

int main(int argc, char** argv) {
  const std::string op = argc > 1 ? argv[1] : "read";
  const uint64_t value = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (1 << 20);
  const double seconds = argc > 3 ? std::atof(argv[3]) : 5.0;
  const int depth = argc > 4 ? std::atoi(argv[4]) : 8;
  if (value == 0 || depth <= 0 || (op != "read" && op != "write")) {
    std::fprintf(stderr, "usage: mc-rdma-bench [read|write] VALUE_BYTES [SECONDS] [DEPTH]\n");
    return 2;
  }
  const char* dev = std::getenv("MC_RDMA_DEVICE");
  const char* gid = std::getenv("MC_RDMA_GID_INDEX");
  TransferEngineOptions o;
  o.transport = "rdma";
  o.rdma.device = dev != nullptr ? dev : "";
  o.rdma.gid_index = gid != nullptr ? std::atoi(gid) : 1;

  SegmentTable b_table;
  tcp::TcpDataServerOptions so;
  so.listen_address = "127.0.0.1:0";
  tcp::TcpDataServer server(so, b_table);
  EngineDataOps engine_ops;  // B answers the rdma setup once attached
  if (!engine_ops.RegisterWith(server).ok() || !server.Start().ok()) {
    std::fprintf(stderr, "data-plane server failed\n");
    return 1;
  }
  TransferEngineOptions bo = o;
  bo.local_endpoint = server.endpoint();
  TransferEngine b(bo, b_table);
  if (!b.status().ok()) {
    std::fprintf(stderr, "no rdma: %s\n", b.status().ToString().c_str());
    return 1;
  }
  const uint64_t span = value * depth;
  std::vector<char> segment(span, 'x'), local(span, 'y');
  if (!b.RegisterMemory(segment.data(), span, MemoryAccess::kRemote).ok()) return 1;
  b_table.Add(1, segment.data(), span);
  engine_ops.Attach(&b);
  TransferEngineOptions ao = o;
  ao.local_endpoint = "127.0.0.1:1";
  SegmentTable a_table;
  TransferEngine a(ao, a_table);
  if (!a.RegisterMemory(local.data(), span, MemoryAccess::kLocal).ok()) return 1;

  std::vector<TransferRequest> batch(depth);
  for (int i = 0; i < depth; ++i) {
    batch[i] = {op == "read" ? Direction::kRead : Direction::kWrite,
                {{local.data() + i * value, value}},
                server.endpoint(),
                SegmentRange{1, i * value}};
  }
  (void)a.Submit(batch);  // connect and warm up
  uint64_t bytes = 0, batches = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    for (const TransferResult& r : a.Submit(batch)) {
      if (!r.status.ok()) {
        std::fprintf(stderr, "transfer failed: %s\n", r.status.ToString().c_str());
        return 1;
      }
      bytes += r.bytes;
    }
    ++batches;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("mc-rdma-bench %s value=%llu depth=%d: %.1f MB/s (%llu batches in %.2f s)\n",
              op.c_str(), static_cast<unsigned long long>(value), depth, bytes / elapsed / 1e6,
              static_cast<unsigned long long>(batches), elapsed);
  server.Stop();
  return 0;
}
