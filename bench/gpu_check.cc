// mc-gpu-check: the GPU pieces of mcstore on a real device, for bench/gpu_check.sh.
//   mc-gpu-check roundtrip  a second process (the "engine") exports two device buffers by CUDA
//                           IPC; this one registers them (GpuBufferRegistry), puts 16 KiB blocks
//                           from the first into a pinned host segment and gets them back into
//                           the second through the TransferEngine's cuda transport, proves each
//                           get with the device XXH3 against the CPU's, checks that a corrupted
//                           segment block is caught, stages the first buffer's blocks as GPU put
//                           sources (GpuPutStager), fills the second buffer again from pinned
//                           staging memory as a staged get does (GpuGetStager), and the engine
//                           compares every byte.
//   mc-gpu-check bench      GB/s of batched copies (GpuMover) into and out of GPU memory for
//                           16 KiB, 256 KiB and 4 MiB blocks beside one plain cudaMemcpy of the
//                           same bytes; the device hash rate; every byte checked.
// Exit status 0 only when every byte and checksum matched. Figures are printed, never asserted.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "client/batch/gpu_get_stager.h"
#include "client/batch/gpu_put_stager.h"
#include "client/gpu/gpu_buffers.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "mcstore/v1/gpu.grpc.pb.h"
#include "mcstore/v1/store.grpc.pb.h"
#include "transfer/cuda/cuda_api.h"
#include "transfer/cuda/cuda_transport.h"
#include "transfer/cuda/gpu_mover.h"
#include "transfer/transfer_engine.h"

namespace {

using mc::transfer::cuda::CopyOp;
using mc::transfer::cuda::GpuMoveRequest;

#define CHECK_CUDA(call)                                                    \
  do {                                                                      \
    cudaError_t e = (call);                                                 \
    if (e != cudaSuccess) {                                                 \
      std::fprintf(stderr, "FAIL: %s: %s\n", #call, cudaGetErrorString(e)); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  std::exit(1);
}

char PatternByte(uint64_t i) { return static_cast<char>((i * 2654435761u) >> 11); }

constexpr uint64_t kBlock = 16 << 10;
constexpr uint64_t kBlocks = 4096;  // 64 MiB
constexpr uint64_t kBytes = kBlock * kBlocks;

// The "inference engine": owns the device buffers, shares them by IPC, checks the result.
int Engine(int to_daemon, int from_daemon) {
  void* src = nullptr;
  void* dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, kBytes));
  CHECK_CUDA(cudaMalloc(&dst, kBytes));
  std::vector<char> host(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) host[i] = PatternByte(i);
  CHECK_CUDA(cudaMemcpy(src, host.data(), kBytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dst, 0, kBytes));
  cudaIpcMemHandle_t handles[2];
  CHECK_CUDA(cudaIpcGetMemHandle(&handles[0], src));
  CHECK_CUDA(cudaIpcGetMemHandle(&handles[1], dst));
  if (write(to_daemon, handles, sizeof(handles)) != sizeof(handles)) Fail("pipe write");
  char done = 0;
  if (read(from_daemon, &done, 1) != 1 || done != 'y') Fail("daemon side failed");
  std::vector<char> back(kBytes);
  CHECK_CUDA(cudaMemcpy(back.data(), dst, kBytes, cudaMemcpyDeviceToHost));
  // Block 7 was corrupted in the segment and its get failed; every other byte must match.
  for (uint64_t b = 0; b < kBlocks; ++b) {
    if (b == 7) continue;
    if (std::memcmp(back.data() + b * kBlock, host.data() + b * kBlock, kBlock) != 0) {
      Fail("engine: byte mismatch in block " + std::to_string(b));
    }
  }
  std::printf("roundtrip: engine saw every byte of %llu blocks x 16 KiB in its GPU buffer\n",
              static_cast<unsigned long long>(kBlocks - 1));
  return 0;
}

int Daemon(int from_engine, int to_engine) {
  cudaIpcMemHandle_t handles[2];
  if (read(from_engine, handles, sizeof(handles)) != sizeof(handles)) Fail("pipe read");
  const std::string self = "127.0.0.1:1";
  std::vector<char> segment(kBytes);
  mc::transfer::SegmentTable table;
  table.Add(1, segment.data(), segment.size());
  mc::transfer::TransferEngineOptions options;
  options.local_endpoint = self;
  options.cuda.device = 0;
  mc::transfer::TransferEngine engine(options, table);
  if (engine.gpu() == nullptr) Fail("no cuda transport");
  const auto remote = mc::transfer::MemoryAccess::kRemote;
  if (!engine.RegisterMemory(segment.data(), segment.size(), remote).ok()) Fail("register segment");
  mc::client::GpuBufferRegistry registry(engine.gpu()->api(), engine.gpu());
  uint64_t ids[2];
  for (int i = 0; i < 2; ++i) {
    mc::client::GpuBufferSpec spec;
    spec.handle = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&handles[i]), 64);
    spec.size = kBytes;
    auto id = registry.Register(spec);
    if (!id.ok()) Fail("RegisterGpuBuffer: " + id.status().ToString());
    ids[i] = *id;
  }
  auto requests = [&](mc::transfer::Direction op, uint64_t buffer, bool checksum) {
    std::vector<mc::transfer::TransferRequest> reqs(kBlocks);
    std::vector<mc::client::GpuBufferRef> refs(kBlocks);
    for (uint64_t b = 0; b < kBlocks; ++b) {
      auto addr = registry.Resolve(buffer, b * kBlock, kBlock, &refs[b]);
      if (!addr.ok()) Fail("resolve");
      reqs[b].direction = op;
      reqs[b].local = {{reinterpret_cast<char*>(*addr), kBlock}};
      reqs[b].endpoint = self;
      reqs[b].target = mc::transfer::SegmentRange{1, b * kBlock};
      if (checksum) reqs[b].proof = mc::transfer::Proof::kDeliveredBytes;
    }
    return reqs;
  };
  // Put: GPU buffer 0 -> segment; the segment's bytes are what a put records the checksum of.
  auto t0 = std::chrono::steady_clock::now();
  auto put = engine.Submit(requests(mc::transfer::Direction::kWrite, ids[0], false));
  auto t1 = std::chrono::steady_clock::now();
  std::vector<uint64_t> recorded(kBlocks);
  for (uint64_t b = 0; b < kBlocks; ++b) {
    if (!put[b].status.ok() || put[b].bytes != kBlock) Fail("put: " + put[b].status.ToString());
    for (uint64_t i = 0; i < kBlock; ++i) {
      if (segment[b * kBlock + i] != PatternByte(b * kBlock + i)) Fail("put: segment mismatch");
    }
    recorded[b] = mc::Checksum(segment.data() + b * kBlock, kBlock);
  }
  segment[7 * kBlock + 100] ^= 0x40;  // a corrupted replica: its get must not be OK
  auto t2 = std::chrono::steady_clock::now();
  auto get = engine.Submit(requests(mc::transfer::Direction::kRead, ids[1], true));
  auto t3 = std::chrono::steady_clock::now();
  uint64_t proven = 0;
  for (uint64_t b = 0; b < kBlocks; ++b) {
    if (!get[b].status.ok() || get[b].bytes != kBlock || !get[b].checksum.has_value()) {
      Fail("get: " + get[b].status.ToString());
    }
    const bool match = *get[b].checksum == recorded[b];
    if (b == 7) {
      if (match) Fail("get: corrupted block 7 hashed to the recorded checksum");
      continue;
    }
    if (!match)
      Fail("get: device checksum differs from the recorded one, block " + std::to_string(b));
    if (*get[b].checksum != mc::Checksum(segment.data() + b * kBlock, kBlock)) Fail("get: cpu");
    ++proven;
  }
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf(
      "roundtrip: put %llu x 16 KiB GPU->segment %.2f GB/s; get segment->GPU with device "
      "XXH3 %.2f GB/s; %llu gets proven, corrupted block caught\n",
      static_cast<unsigned long long>(kBlocks), kBytes / secs(t0, t1) / 1e9,
      kBytes / secs(t2, t3) / 1e9, static_cast<unsigned long long>(proven));
  // A put from GPU memory as mc-client takes it (BatchPut with a GPU slice): staged into its
  // pinned pool, the source hashed on the device, the staged bytes accepted only when they hash
  // the same on the CPU.
  {
    mc::client::GpuPutStager stager(engine.gpu()->api(), engine.gpu()->mover(),
                                    mc::client::GpuPutStagerOptions{}, mc::RealClock::Get());
    std::vector<mc::client::PutRequestItem> items(kBlocks);
    for (uint64_t b = 0; b < kBlocks; ++b) {
      mc::client::GpuBufferRef ref;
      auto addr = registry.Resolve(ids[0], b * kBlock, kBlock, &ref);
      if (!addr.ok()) Fail("resolve");
      items[b].gpu.Add(0, std::move(ref));
      items[b].pieces = {{reinterpret_cast<char*>(*addr), kBlock}};
    }
    auto t4 = std::chrono::steady_clock::now();
    mc::client::GpuPutStager::Staged staged = stager.Stage(items);
    auto t5 = std::chrono::steady_clock::now();
    for (uint64_t b = 0; b < kBlocks; ++b) {
      if (!items[b].input_error.ok()) Fail("staged put: " + items[b].input_error.ToString());
      const char* host = items[b].pieces[0].data;
      for (uint64_t i = 0; i < kBlock; ++i) {
        if (host[i] != PatternByte(b * kBlock + i)) Fail("staged put: byte mismatch");
      }
    }
    std::printf("roundtrip: staged GPU put source %llu x 16 KiB %.2f GB/s, every block proven\n",
                static_cast<unsigned long long>(kBlocks), kBytes / secs(t4, t5) / 1e9);
  }
  // A get as mc-client serves one from a remote or SSD replica, or with further destinations
  // (GpuGetStager): the bytes in pinned staging memory, copied into GPU memory in one batch and
  // proved there by the device hash. Buffer 1 is cleared first, so the engine's byte check sees
  // what these copies wrote.
  {
    mc::client::GpuBufferRef ref;
    auto dst = registry.Resolve(ids[1], 0, kBytes, &ref);
    if (!dst.ok()) Fail("resolve");
    char* device = reinterpret_cast<char*>(*dst);
    CHECK_CUDA(cudaMemset(device, 0, kBytes));
    CHECK_CUDA(cudaDeviceSynchronize());
    mc::client::GpuGetStager stager(engine.gpu()->api(), engine.gpu()->mover(),
                                    mc::client::GpuGetStagerOptions{.pool_bytes = kBytes},
                                    mc::RealClock::Get());
    std::vector<mc::client::GpuGetStager::Lease> leases;
    std::vector<mc::client::GpuGetStager::Copy> copies(kBlocks);
    for (uint64_t b = 0; b < kBlocks; ++b) {
      auto lease = stager.Reserve(kBlock);
      if (!lease.ok()) Fail("staging: " + lease.status().ToString());
      std::memcpy(lease->data(), segment.data() + b * kBlock, kBlock);  // "the remote read"
      copies[b] = {device + b * kBlock, lease->data(), kBlock, recorded[b]};
      leases.push_back(*std::move(lease));
    }
    auto t6 = std::chrono::steady_clock::now();
    std::vector<mc::client::GpuGetStager::Result> got = stager.CopyToDevice(copies);
    auto t7 = std::chrono::steady_clock::now();
    for (uint64_t b = 0; b < kBlocks; ++b) {
      if (b == 7) {
        if (got[b].status.ok()) Fail("staged get: corrupted block 7 was OK");
        continue;
      }
      if (!got[b].status.ok() || got[b].bytes != kBlock) {
        Fail("staged get: block " + std::to_string(b) + ": " + got[b].status.ToString());
      }
    }
    std::printf(
        "roundtrip: staged get pinned staging->GPU with device XXH3 %llu x 16 KiB %.2f GB/s, "
        "every block proven, corrupted block caught\n",
        static_cast<unsigned long long>(kBlocks), kBytes / secs(t6, t7) / 1e9);
  }
  for (uint64_t id : ids) registry.Unregister(id).IgnoreError();  // process ends next
  char ok = 'y';
  if (write(to_engine, &ok, 1) != 1) Fail("pipe write");
  return 0;
}

int RoundTrip() {
  int a[2], b[2];
  if (pipe(a) != 0 || pipe(b) != 0) Fail("pipe");
  const pid_t pid = fork();  // before any CUDA call in this process
  if (pid < 0) Fail("fork");
  if (pid == 0) {
    close(a[0]);
    close(b[1]);
    std::exit(Engine(a[1], b[0]));
  }
  close(a[1]);  // so that a dead engine reads as end of file, not a hang
  close(b[0]);
  const int rc = Daemon(a[0], b[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Fail("engine process failed");
  return rc;
}

double BestGBs(int reps, uint64_t bytes, const std::function<void()>& f) {
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, bytes / s / 1e9);
  }
  return best;
}

int Bench() {
  auto api = mc::transfer::cuda::OpenCudaApi();
  if (!api.ok()) Fail(api.status().ToString());
  auto name = (*api)->DeviceName(0);
  std::printf("device: %s\n", name.ok() ? name->c_str() : "?");
  constexpr uint64_t kTotal = 1ull << 30;
  char* host = nullptr;
  char* back = nullptr;
  void* dev = nullptr;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host), kTotal, cudaHostAllocPortable));
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&back), kTotal, cudaHostAllocPortable));
  CHECK_CUDA(cudaMalloc(&dev, kTotal));
  for (uint64_t i = 0; i < kTotal; i += 4096) std::memset(host + i, PatternByte(i / 4096), 4096);
  for (uint64_t i = 0; i < kTotal; i += 64) host[i] = PatternByte(i);
  auto mover = mc::transfer::cuda::GpuMover::Create(**api, {});
  if (!mover.ok()) Fail(mover.status().ToString());
  int failures = 0;
  std::printf("%-8s %10s %10s %6s %10s %10s %6s %12s %10s\n", "block", "plain H2D", "batch H2D",
              "ratio", "plain D2H", "batch D2H", "ratio", "H2D+XXH3", "goal");
  for (uint64_t bs : {16ull << 10, 256ull << 10, 4ull << 20}) {
    const uint64_t n = kTotal / bs;
    std::vector<GpuMoveRequest> h2d(n), d2h(n), h2d_hash(n);
    for (uint64_t i = 0; i < n; ++i) {
      char* d = static_cast<char*>(dev) + i * bs;
      h2d[i].copies = {CopyOp{d, host + i * bs, bs}};
      d2h[i].copies = {CopyOp{back + i * bs, d, bs}};
      h2d_hash[i] = h2d[i];
      h2d_hash[i].hash_destination = true;
      h2d_hash[i].expected_checksum = mc::Checksum(host + i * bs, bs);
    }
    auto move = [&](const std::vector<GpuMoveRequest>& reqs) {
      for (const auto& r : (*mover)->Move(reqs, 0)) {
        if (!r.status.ok() || r.bytes != bs) {
          std::fprintf(stderr, "FAIL: block %llu: %s\n", static_cast<unsigned long long>(bs),
                       r.status.ToString().c_str());
          ++failures;
          return;
        }
      }
    };
    const double plain_h2d = BestGBs(
        5, kTotal, [&] { CHECK_CUDA(cudaMemcpy(dev, host, kTotal, cudaMemcpyHostToDevice)); });
    const double plain_d2h = BestGBs(
        5, kTotal, [&] { CHECK_CUDA(cudaMemcpy(back, dev, kTotal, cudaMemcpyDeviceToHost)); });
    CHECK_CUDA(cudaMemset(dev, 0, kTotal));
    const double batch_h2d = BestGBs(5, kTotal, [&] { move(h2d); });
    std::memset(back, 0, kTotal);
    const double batch_d2h = BestGBs(5, kTotal, [&] { move(d2h); });
    if (std::memcmp(host, back, kTotal) != 0) {
      std::fprintf(stderr, "FAIL: byte mismatch after batched copies of %llu-byte blocks\n",
                   static_cast<unsigned long long>(bs));
      ++failures;
    }
    const double hashed = BestGBs(3, kTotal, [&] { move(h2d_hash); });  // fails on mismatch
    const double r1 = batch_h2d / plain_h2d, r2 = batch_d2h / plain_d2h;
    const char* goal = bs < (256 << 10) ? "-" : (r1 >= 0.9 && r2 >= 0.9 ? "met" : "BELOW 0.9x");
    std::printf("%-8s %10.2f %10.2f %6.2f %10.2f %10.2f %6.2f %12.2f %10s\n",
                bs >= (1 << 20) ? (std::to_string(bs >> 20) + "MiB").c_str()
                                : (std::to_string(bs >> 10) + "KiB").c_str(),
                plain_h2d, batch_h2d, r1, plain_d2h, batch_d2h, r2, hashed, goal);
  }
  std::printf(
      "(GB/s, best of 5, 1 GiB per run; plain = one cudaMemcpy of all bytes; batch = "
      "GpuMover, %llu batched submissions so far)\n",
      static_cast<unsigned long long>((*mover)->batches_submitted()));
  mover->reset();
  cudaFree(dev);
  cudaFreeHost(host);
  cudaFreeHost(back);
  if (failures > 0) Fail(std::to_string(failures) + " byte or checksum failures");
  return 0;
}

}  // namespace

// --- cluster: GPU buffers through two real mc-client daemons ------------------------------

// A Store + GpuBuffers client of one mc-client over TCP, with the Store token.
struct Daemon2 {
  std::string address;
  std::unique_ptr<mcstore::v1::Store::Stub> store;
  std::unique_ptr<mcstore::v1::GpuBuffers::Stub> gpu;
};

std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("authorization", "Bearer " + token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return ctx;
}

uint64_t RegisterIpc(Daemon2& d, const std::string& token, const cudaIpcMemHandle_t& handle,
                     uint64_t size) {
  mcstore::v1::RegisterGpuBufferRequest req;
  req.set_version(1);
  req.set_kind(mcstore::v1::GPU_HANDLE_CUDA_IPC);
  req.set_handle(reinterpret_cast<const char*>(&handle), sizeof(handle));
  req.set_device(0);
  req.set_size(size);
  mcstore::v1::RegisterGpuBufferResponse resp;
  grpc::Status s = d.gpu->RegisterGpuBuffer(Context(token).get(), req, &resp);
  if (!s.ok()) Fail("RegisterGpuBuffer on " + d.address + ": " + s.error_message());
  return resp.buffer_id();
}

// Gets `keys` into GPU buffer `id` of daemon `d` (key i at i * kBlock, as `pieces` adjacent
// slices), every result OK; returns the seconds it took.
double GetInto(Daemon2& d, const std::string& token, const std::vector<std::string>& keys,
               uint64_t id, int pieces) {
  mcstore::v1::BatchGetRequest req;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto* item = req.add_items();
    item->set_key(keys[i]);
    const uint64_t part = kBlock / pieces;
    for (int p = 0; p < pieces; ++p) {
      auto* slice = item->add_slices();
      slice->set_buffer_id(id);
      slice->set_offset(i * kBlock + p * part);
      slice->set_length(p + 1 == pieces ? kBlock - p * part : part);
    }
  }
  mcstore::v1::BatchGetResponse resp;
  const auto t0 = std::chrono::steady_clock::now();
  grpc::Status s = d.store->BatchGet(Context(token).get(), req, &resp);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) Fail("BatchGet on " + d.address + ": " + s.error_message());
  for (int i = 0; i < resp.results_size(); ++i) {
    if (resp.results(i).code() != mcstore::v1::OK || resp.results(i).bytes_written() != kBlock) {
      Fail("BatchGet on " + d.address + " key " + keys[i] + ": " + resp.results(i).message());
    }
  }
  return secs;
}

void ExpectPattern(void* dev, const std::vector<char>& want, const std::string& what) {
  std::vector<char> got(want.size());
  CHECK_CUDA(cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost));
  if (std::memcmp(got.data(), want.data(), want.size()) != 0) Fail(what + ": byte mismatch");
}

// mc-gpu-check cluster ADDR_A ADDR_B TOKEN_FILE: the daemons run with --cuda_device=0. Puts
// kClusterBlocks x 16 KiB blocks from a GPU buffer through daemon A (one GPU slice per item: a
// direct put, written from GPU memory into A's segment and proved by the segment's hash), then gets
// them into GPU memory through daemon B (its own replicas direct, A's over TCP staged) and
// through A, also scattered (two slices per block: staged), every byte compared here.
constexpr uint64_t kClusterBlocks = 1024;

int Cluster(const std::string& a, const std::string& b, const std::string& token_file) {
  std::string token;
  {
    std::FILE* f = std::fopen(token_file.c_str(), "r");
    if (f == nullptr) Fail("cannot read " + token_file);
    char buf[256];
    const size_t n = std::fread(buf, 1, sizeof(buf), f);
    std::fclose(f);
    token.assign(buf, n);
    while (!token.empty() && (token.back() == '\n' || token.back() == ' ')) token.pop_back();
  }
  Daemon2 da{a, nullptr, nullptr}, db{b, nullptr, nullptr};
  for (Daemon2* d : {&da, &db}) {
    auto channel = grpc::CreateChannel(d->address, grpc::InsecureChannelCredentials());
    d->store = mcstore::v1::Store::NewStub(channel);
    d->gpu = mcstore::v1::GpuBuffers::NewStub(channel);
  }
  const uint64_t bytes = kClusterBlocks * kBlock;
  void* src = nullptr;
  void* dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  std::vector<char> host(bytes);
  for (uint64_t i = 0; i < bytes; ++i) host[i] = PatternByte(i * 3 + 1);
  CHECK_CUDA(cudaMemcpy(src, host.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dst, 0, bytes));
  cudaIpcMemHandle_t hsrc, hdst;
  CHECK_CUDA(cudaIpcGetMemHandle(&hsrc, src));
  CHECK_CUDA(cudaIpcGetMemHandle(&hdst, dst));
  const uint64_t a_src = RegisterIpc(da, token, hsrc, bytes);
  const uint64_t a_dst = RegisterIpc(da, token, hdst, bytes);
  const uint64_t b_dst = RegisterIpc(db, token, hdst, bytes);
  // Put from GPU memory through A (direct puts: each block copied from the device into A's
  // segment, proved by the CPU's hash of the segment against the device's hash of the source).
  std::vector<std::string> keys;
  mcstore::v1::BatchPutRequest put;
  const std::string run =
      std::to_string(getpid()) + "-" +
      std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  for (uint64_t i = 0; i < kClusterBlocks; ++i) {
    keys.push_back("gpu-check-" + run + "-" + std::to_string(i));
    auto* item = put.add_items();
    item->set_key(keys.back());
    auto* slice = item->add_slices();
    slice->set_buffer_id(a_src);
    slice->set_offset(i * kBlock);
    slice->set_length(kBlock);
  }
  mcstore::v1::BatchPutResponse put_resp;
  const auto t0 = std::chrono::steady_clock::now();
  grpc::Status s = da.store->BatchPut(Context(token).get(), put, &put_resp);
  const double put_secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) Fail("BatchPut: " + s.error_message());
  for (int i = 0; i < put_resp.results_size(); ++i) {
    if (put_resp.results(i).code() != mcstore::v1::OK) {
      Fail("BatchPut " + keys[i] + ": " + put_resp.results(i).message());
    }
  }
  const double b_secs = GetInto(db, token, keys, b_dst, 1);
  ExpectPattern(dst, host, "get through B");
  CHECK_CUDA(cudaMemset(dst, 0, bytes));
  CHECK_CUDA(cudaDeviceSynchronize());
  const double a_secs = GetInto(da, token, keys, a_dst, 1);
  ExpectPattern(dst, host, "get through A");
  CHECK_CUDA(cudaMemset(dst, 0, bytes));
  CHECK_CUDA(cudaDeviceSynchronize());
  const double scattered_secs = GetInto(db, token, keys, b_dst, 2);
  ExpectPattern(dst, host, "scattered get through B");
  std::printf(
      "cluster: %llu x 16 KiB put from GPU via %s %.2f GB/s; get into GPU via %s %.2f GB/s, "
      "via %s %.2f GB/s, scattered (2 slices) via %s %.2f GB/s; every byte compared\n",
      static_cast<unsigned long long>(kClusterBlocks), a.c_str(), bytes / put_secs / 1e9, b.c_str(),
      bytes / b_secs / 1e9, a.c_str(), bytes / a_secs / 1e9, b.c_str(),
      bytes / scattered_secs / 1e9);
  for (auto [d, id] : {std::pair{&da, a_src}, std::pair{&da, a_dst}, std::pair{&db, b_dst}}) {
    mcstore::v1::UnregisterGpuBufferRequest un;
    un.set_buffer_id(id);
    mcstore::v1::UnregisterGpuBufferResponse un_resp;
    d->gpu->UnregisterGpuBuffer(Context(token).get(), un, &un_resp);
  }
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "roundtrip") return RoundTrip();
  if (mode == "bench") return Bench();
  if (mode == "cluster" && argc == 5) return Cluster(argv[2], argv[3], argv[4]);
  std::fprintf(stderr,
               "usage: mc-gpu-check roundtrip|bench|cluster ADDR_A ADDR_B STORE_TOKEN_FILE\n");
  return 2;
}
