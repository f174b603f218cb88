// mc_master_lane_bench: calls over the master lane on loopback, in-process: a MasterLane in front
// of a MasterGrpcService (no gRPC listener) with 100k preloaded keys, and one MasterLaneClient
// per benchmark thread (as one mc-client daemon's calling thread). Figures: calls/s and heap
// allocations per call, counted by this binary's operator new on both ends (the client's thread
// and the master's connection thread, over the whole process). Batch size (keys) is the arg.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "client/session/master_lane_client.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/util.h"
#include "master/grpc_service.h"
#include "master/master_lane.h"
#include "master/metadata_service.h"
#include "proto/master_lane_frame.h"

// Counting replacements of the global operator new/delete (malloc underneath). GCC sees the
// replaced new and delete inlined as a malloc freed by delete: not a mismatch here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {

std::atomic<uint64_t> g_allocations{0};

}  // namespace

void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace mc {
namespace {

namespace v1 = mcstore::v1;
constexpr size_t kKeys = 100'000;

std::string KeyOf(size_t i) { return absl::StrCat("bench/key/", i); }

// The master's side, once per process.
struct Master {
  Master() : service(master::MasterOptions{}, RealClock::Get(), metrics) {
    SetLogLevel("error");
    master::ClientInfo info;
    info.client_id = "bench-client";
    info.endpoint = "127.0.0.1:1";
    (void)service.RegisterClient(info, {kKeys * 4096 * 2}, {}, false);
    std::string leader;
    for (size_t i = 0; i < kKeys; ++i) {
      v1::PutStartRequest start;
      start.set_client_id("bench-client");
      start.add_items()->set_key(KeyOf(i));
      start.mutable_items(0)->set_size(4096);
      v1::PutStartResponse started;
      (void)grpc_service->LanePutStart({}, start, &started, &leader);
      v1::PutEndRequest end;
      end.set_client_id("bench-client");
      end.add_items()->set_key(KeyOf(i));
      end.mutable_items(0)->set_generation(started.results(0).generation());
      v1::PutEndResponse ended;
      (void)grpc_service->LanePutEnd({}, end, &ended, &leader);
    }
    port = *lane->Start();
  }
  static Master& Get() {
    static Master* instance = new Master();
    return *instance;
  }
  MetricsRegistry metrics;
  master::MetadataService service;
  std::unique_ptr<master::MasterGrpcService> grpc_service =
      std::make_unique<master::MasterGrpcService>(service, metrics, 100'000);
  std::unique_ptr<master::MasterLane> lane = std::make_unique<master::MasterLane>(
      master::MasterLaneOptions{.listen = "127.0.0.1:0"}, *grpc_service, metrics);
  int port = 0;
};

template <typename Req, typename Resp>
void Run(benchmark::State& state, uint32_t method, const std::vector<Req>& requests) {
  Master& m = Master::Get();
  client::MasterLaneClient client({.host = "127.0.0.1", .port = m.port, .max_connections = 1});
  Resp resp;
  grpc::Status status;
  std::string leader;
  size_t i = 0;
  // One call first: the connection is opened and its buffers grown before counting.
  (void)client.Call(method, "", requests[0], &resp, &status, &leader);
  const uint64_t allocations = g_allocations.load();
  for (auto _ : state) {
    const client::MasterLaneClient::Outcome outcome =
        client.Call(method, "", requests[i++ % requests.size()], &resp, &status, &leader);
    if (outcome != client::MasterLaneClient::Outcome::kAnswered || !status.ok()) {
      state.SkipWithError("the lane call failed");
      break;
    }
  }
  state.counters["allocs_per_call"] =
      static_cast<double>(g_allocations.load() - allocations) / state.iterations();
  state.SetItemsProcessed(state.iterations());
}

void BM_Lane_GetReplicasNoLease(benchmark::State& state) {
  std::vector<v1::GetReplicasRequest> requests(64);
  for (size_t r = 0; r < requests.size(); ++r) {
    requests[r].set_client_id("bench-client");
    requests[r].set_no_lease(true);
    for (int k = 0; k < state.range(0); ++k) {
      requests[r].add_keys(KeyOf((r * 7919 + k * 104729) % kKeys));
    }
  }
  Run<v1::GetReplicasRequest, v1::GetReplicasResponse>(state, lane::kGetReplicas, requests);
}

void BM_Lane_Exist(benchmark::State& state) {
  std::vector<v1::ExistRequest> requests(64);
  for (size_t r = 0; r < requests.size(); ++r) {
    for (int k = 0; k < state.range(0); ++k) {
      requests[r].add_keys(KeyOf((r * 7919 + k * 104729) % kKeys));
    }
  }
  Run<v1::ExistRequest, v1::ExistResponse>(state, lane::kExist, requests);
}

BENCHMARK(BM_Lane_GetReplicasNoLease)->Arg(1)->Arg(16)->Arg(64)->UseRealTime();
BENCHMARK(BM_Lane_Exist)->Arg(1)->Arg(64)->UseRealTime();

}  // namespace
}  // namespace mc

BENCHMARK_MAIN();
