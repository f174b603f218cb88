// mc_master_bench: batched lookups (GetReplicas, Exist) over 100k preloaded keys, in-process
// (MetadataService directly) and through gRPC on loopback (an in-process MasterServer on
// 127.0.0.1:0 and a Master stub). Figures are keys/s (items_per_second); batch size is the arg.
// The gRPC master authenticates every call as mc-master does by default (a session token in
// x-mc-session); MC_BENCH_MASTER_AUTH=0 measures it with --auth=false for comparison.
#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>

#include <pthread.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/master_bench_common.h"
#include "bench/master_bench_fleet.h"
#include "benchmark/benchmark.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/master_credentials.h"
#include "common/metrics.h"
#include "common/util.h"
#include "master/grpc_service.h"
#include "master/master_server.h"
#include "master/metadata_service.h"
#include "mcstore/v1/master.grpc.pb.h"
#include "proto/packed_lookups.h"

namespace mc::master {
namespace {

using bench::AllRepliesFound;
using bench::g_master_auth;
using bench::KeyOf;
using bench::kObjectSize;

constexpr size_t kKeys = 100'000;
constexpr size_t kBatchesPrepared = 4096;

// Returns the session token of "bench-client".
std::string Preload(MetadataService& svc) {
  ClientInfo info;
  info.client_id = "bench-client";
  info.host = "localhost";
  info.endpoint = "127.0.0.1:1";
  auto reg = svc.RegisterClient(info, {kKeys * kObjectSize * 2});
  if (!reg.ok()) std::abort();
  std::vector<std::string> keys;
  for (size_t base = 0; base < kKeys; base += 1000) {
    keys.clear();
    for (size_t i = base; i < base + 1000 && i < kKeys; ++i) keys.push_back(KeyOf(i));
    std::vector<PutStartItem> items;
    for (const auto& k : keys) items.push_back({k, kObjectSize});
    auto started = svc.PutStart("bench-client", items, 1);
    std::vector<PutEndItem> ends;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!started[i].status.ok()) std::abort();
      ends.push_back({keys[i], started[i].generation, 1});
    }
    for (const auto& s : svc.PutEnd("bench-client", ends)) {
      if (!s.ok()) std::abort();
    }
  }
  return reg->token;
}

// Random batches of distinct keys, prepared once.
const std::vector<std::vector<std::string>>& Batches(size_t batch) {
  static std::map<size_t, std::vector<std::vector<std::string>>> cache;
  auto& out = cache[batch];
  if (out.empty()) {
    std::mt19937_64 rng(42);
    for (size_t b = 0; b < kBatchesPrepared; ++b) {
      std::vector<std::string> keys;
      size_t start = rng() % kKeys;
      for (size_t i = 0; i < batch; ++i) keys.push_back(KeyOf((start + i * 7919) % kKeys));
      out.push_back(std::move(keys));
    }
  }
  return out;
}

std::vector<std::vector<std::string_view>> Views(size_t batch) {
  std::vector<std::vector<std::string_view>> views;
  for (const auto& keys : Batches(batch)) views.emplace_back(keys.begin(), keys.end());
  return views;
}

// Whether every key of an in-process lookup was found (the benchmarks look up preloaded keys).
bool AllFound(const LookupBatch& b, size_t keys) {
  if (b.results.size() != keys) return false;
  for (const LookupOutcome& r : b.results) {
    if (!r.status.ok()) return false;
  }
  return true;
}

// Whether an Exist answer says yes for each of `keys` keys.
template <typename Bools>
bool AllExist(const Bools& exists, size_t keys) {
  return static_cast<size_t>(exists.size()) == keys &&
         std::find(exists.begin(), exists.end(), false) == exists.end();
}

// ---- in-process

struct InProcess {
  MetricsRegistry metrics;
  std::unique_ptr<MetadataService> svc;
  InProcess() {
    SetLogLevel("warn");
    svc = std::make_unique<MetadataService>(MasterOptions{}, RealClock::Get(), metrics);
    Preload(*svc);
  }
  static InProcess& Get() {
    static InProcess* instance = new InProcess();
    return *instance;
  }
};

void BM_InProcess_GetReplicas_NoLease(benchmark::State& state) {
  auto& svc = *InProcess::Get().svc;
  auto views = Views(state.range(0));
  LookupOptions opts;
  opts.grant_lease = false;
  size_t i = 0;
  for (auto _ : state) {
    LookupBatch b = svc.GetReplicas(views[i++ % views.size()], opts);
    if (!AllFound(b, state.range(0))) state.SkipWithError("a preloaded key was not found");
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// An unleased MatchPrefix: every key present, in order, the count alone.
void BM_InProcess_PrefixCountOnly(benchmark::State& state) {
  auto& svc = *InProcess::Get().svc;
  auto views = Views(state.range(0));
  LookupOptions opts;
  opts.grant_lease = false;
  opts.stop_at_first_miss = true;
  opts.with_replicas = false;
  opts.touch = false;  // as the master serves count_only
  size_t i = 0;
  for (auto _ : state) {
    LookupBatch b = svc.GetReplicas(views[i++ % views.size()], opts);
    benchmark::DoNotOptimize(b);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// A reader's round trip: lookup with a lease, then release it.
void BM_InProcess_GetReplicasLeaseAndRelease(benchmark::State& state) {
  auto& svc = *InProcess::Get().svc;
  auto views = Views(state.range(0));
  size_t i = 0;
  for (auto _ : state) {
    const auto& keys = views[i++ % views.size()];
    LookupBatch b = svc.GetReplicas(keys, {});
    benchmark::DoNotOptimize(svc.ReleaseLeases(b.lease_id, keys));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// GetReplicas with a lease alone (leases expire by TTL; they accumulate up to the TTL).
void BM_InProcess_GetReplicasLease(benchmark::State& state) {
  auto& svc = *InProcess::Get().svc;
  auto views = Views(state.range(0));
  size_t i = 0;
  for (auto _ : state) {
    LookupBatch b = svc.GetReplicas(views[i++ % views.size()], {});
    benchmark::DoNotOptimize(b);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  // Leave no leases behind for the next benchmark.
  for (const auto& keys : views) svc.GetReplicas(keys, {.lease_ttl_ms = 1});
}

void BM_InProcess_Exist(benchmark::State& state) {
  auto& svc = *InProcess::Get().svc;
  auto views = Views(state.range(0));
  size_t i = 0;
  for (auto _ : state) {
    if (!AllExist(svc.Exist(views[i++ % views.size()]), state.range(0))) {
      state.SkipWithError("a preloaded key does not exist");
    }
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// A leased prefix lookup as mc-master serves one (MasterGrpcService::DoGetReplicas, no network):
// the lookup, the leases, and the answer as columns (range(1) = 1) or records (0); then the
// release. What the master's CPU spends on a leased MatchPrefix of range(0) keys. range(2) = 1:
// with authentication, every replica answered carries a capability (docs/security.md).
void BM_InProcess_PrefixLeaseAnswer(benchmark::State& state) {
  auto& in = InProcess::Get();
  static MasterGrpcService* plain = new MasterGrpcService(*in.svc, in.metrics, 100'000);
  static MasterGrpcService* authed = [&in] {
    auto* s = new MasterGrpcService(*in.svc, in.metrics, 100'000);
    auto* minter = new CapabilityMinter(*auth::ClusterKeys::FromSecrets({std::string(64, 'b')}),
                                        RealClock::Get());
    minter->Register("bench-client", 1);
    s->SetCapabilityMinter(minter);
    return s;
  }();
  MasterGrpcService* service = state.range(2) != 0 ? authed : plain;
  std::vector<mcstore::v1::GetReplicasRequest> requests;
  for (const auto& keys : Batches(state.range(0))) {
    mcstore::v1::GetReplicasRequest req;
    req.set_client_id("bench-client");
    for (const auto& k : keys) req.add_keys(k);
    req.set_stop_at_first_miss(true);
    req.set_packed(state.range(1) != 0);
    requests.push_back(std::move(req));
  }
  size_t i = 0;
  for (auto _ : state) {
    const auto& req = requests[i++ % requests.size()];
    google::protobuf::Arena arena;
    auto* resp = google::protobuf::Arena::CreateMessage<mcstore::v1::GetReplicasResponse>(&arena);
    if (!service->DoGetReplicas(Caller{}, &req, resp).ok())
      state.SkipWithError("GetReplicas failed");
    benchmark::DoNotOptimize(resp->ByteSizeLong());
    std::vector<std::string_view> keys(req.keys().begin(), req.keys().end());
    benchmark::DoNotOptimize(in.svc->ReleaseLeases(resp->lease_id(), keys));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// ---- gRPC on loopback

struct OverGrpc {
  std::unique_ptr<MasterServer> server;
  // One stub per benchmark thread, each on its own connection (as separate mc-clients would be).
  std::vector<std::unique_ptr<mcstore::v1::Master::Stub>> stubs;
  OverGrpc() {
    SetLogLevel("warn");
    MasterServerOptions opts;
    opts.listen = "127.0.0.1:0";
    opts.http = "";
    opts.maintenance_interval_ms = 200;
    // The benchmark's client never heartbeats: with the default TTL (10 s) the master declared it
    // dead part-way through a run, dropped every preloaded key, and the later benchmarks timed
    // lookups of missing keys (about 1.8x faster). Every benchmark now also checks its answers.
    opts.master.client_ttl_ms = int64_t{24} * 3600 * 1000;
    if (g_master_auth) {
      opts.cluster_keys = *auth::ClusterKeys::FromSecrets({auth::NewSecret()});
    }
    server = std::make_unique<MasterServer>(opts);
    if (!server->Start().ok()) std::abort();
    const std::string token = Preload(server->service());
    if (g_master_auth) session = auth::MakeSessionCredential("bench-client", token);
    for (int i = 0; i < kMaxThreads; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // no connection sharing
      stubs.push_back(mcstore::v1::Master::NewStub(grpc::CreateCustomChannel(
          server->grpc_address(), grpc::InsecureChannelCredentials(), args)));
    }
  }
  std::string session;  // x-mc-session of bench-client; empty without authentication
  // What every call of mc-client carries.
  void Authenticate(grpc::ClientContext* ctx) const {
    if (!session.empty()) ctx->AddMetadata(auth::kSessionHeader, session);
  }
  static constexpr int kMaxThreads = 8;
  mcstore::v1::Master::Stub& stub(const benchmark::State& state) {
    return *stubs[state.thread_index() % kMaxThreads];
  }
  static OverGrpc& Get() {
    static OverGrpc* instance = new OverGrpc();
    return *instance;
  }

  // A lookup of `keys` as mc-client asks it (leased unless the caller says otherwise).
  static mcstore::v1::GetReplicasRequest LookupRequest(const std::vector<std::string>& keys) {
    mcstore::v1::GetReplicasRequest req;
    req.set_client_id("bench-client");
    for (const auto& k : keys) req.add_keys(k);
    return req;
  }
  // Sends `req` on this thread's connection; the answer is parsed onto `arena`, as mc-client
  // does. A failure marks the benchmark failed.
  const mcstore::v1::GetReplicasResponse& Lookup(benchmark::State& state,
                                                 const mcstore::v1::GetReplicasRequest& req,
                                                 google::protobuf::Arena* arena) {
    auto& resp = *google::protobuf::Arena::CreateMessage<mcstore::v1::GetReplicasResponse>(arena);
    grpc::ClientContext ctx;
    Authenticate(&ctx);
    if (!stub(state).GetReplicas(&ctx, req, &resp).ok()) {
      state.SkipWithError("GetReplicas failed");
    } else if (!AllRepliesFound(req, resp)) {
      state.SkipWithError("a preloaded key was not found");
    }
    return resp;
  }
  // Releases the lease `lease_id` on `keys` (strings) on this thread's connection.
  template <typename Keys>
  void Release(benchmark::State& state, uint64_t lease_id, const Keys& keys) {
    mcstore::v1::ReleaseLeasesRequest rel;
    rel.set_lease_id(lease_id);
    for (const std::string& k : keys) rel.add_keys(k);
    mcstore::v1::ReleaseLeasesResponse rel_resp;
    grpc::ClientContext ctx;
    Authenticate(&ctx);
    if (!stub(state).ReleaseLeases(&ctx, rel, &rel_resp).ok()) {
      state.SkipWithError("ReleaseLeases failed");
    }
  }
};

void BM_Grpc_GetReplicasLeaseAndRelease(benchmark::State& state) {
  auto& g = OverGrpc::Get();
  const auto& batches = Batches(state.range(0));
  size_t i = 0;
  for (auto _ : state) {
    mcstore::v1::GetReplicasRequest req = OverGrpc::LookupRequest(batches[i++ % batches.size()]);
    google::protobuf::Arena arena;
    const auto& resp = g.Lookup(state, req, &arena);
    g.Release(state, resp.lease_id(), req.keys());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// The same reads as mc-client sends them under a stream of gets: each lookup carries the
// previous lookup's release (GetReplicasRequest.releases), one RPC per batch instead of two.
void BM_Grpc_GetReplicasCarryingRelease(benchmark::State& state) {
  auto& g = OverGrpc::Get();
  const auto& batches = Batches(state.range(0));
  size_t i = 0;
  mcstore::v1::ReleaseLeasesRequest previous;
  for (auto _ : state) {
    mcstore::v1::GetReplicasRequest req = OverGrpc::LookupRequest(batches[i++ % batches.size()]);
    if (previous.lease_id() != 0) *req.add_releases() = std::move(previous);
    google::protobuf::Arena arena;
    const auto& resp = g.Lookup(state, req, &arena);
    previous.Clear();
    previous.set_lease_id(resp.lease_id());
    *previous.mutable_keys() = req.keys();
  }
  mcstore::v1::ReleaseLeasesResponse rel_resp;
  grpc::ClientContext ctx;
  g.Authenticate(&ctx);
  (void)g.stub(state).ReleaseLeases(&ctx, previous, &rel_resp);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// A leased MatchPrefix as mc-client sends it: a prefix lookup of range(0) keys with a lease, keys
// packed and the answer as columns (range(1) = 1), or keys one by one and one record per key (0,
// what it exchanges with a master older than both), parsed onto an arena; then the release.
void BM_Grpc_PrefixLeaseAndRelease(benchmark::State& state) {
  auto& g = OverGrpc::Get();
  const auto& batches = Batches(state.range(0));
  const bool packed = state.range(1) != 0;
  size_t i = 0;
  for (auto _ : state) {
    const auto& keys = batches[i++ % batches.size()];
    mcstore::v1::GetReplicasRequest req;
    req.set_client_id("bench-client");
    for (const std::string& k : keys) {
      if (packed) {
        AppendPackedKey(k, req.mutable_packed_keys(), req.mutable_packed_key_sizes());
      } else {
        req.add_keys(k);
      }
    }
    req.set_stop_at_first_miss(true);
    req.set_packed(packed);
    google::protobuf::Arena arena;
    const auto& resp = g.Lookup(state, req, &arena);  // checks that every key matched
    g.Release(state, resp.lease_id(), keys);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_Grpc_GetReplicas_NoLease(benchmark::State& state) {
  auto& g = OverGrpc::Get();
  const auto& batches = Batches(state.range(0));
  size_t i = 0;
  for (auto _ : state) {
    mcstore::v1::GetReplicasRequest req = OverGrpc::LookupRequest(batches[i++ % batches.size()]);
    req.set_no_lease(true);
    google::protobuf::Arena arena;
    benchmark::DoNotOptimize(g.Lookup(state, req, &arena));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_Grpc_Exist(benchmark::State& state) {
  auto& g = OverGrpc::Get();
  const auto& batches = Batches(state.range(0));
  size_t i = 0;
  for (auto _ : state) {
    const auto& keys = batches[i++ % batches.size()];
    mcstore::v1::ExistRequest req;
    for (const auto& k : keys) req.add_keys(k);
    mcstore::v1::ExistResponse resp;
    grpc::ClientContext ctx;
    g.Authenticate(&ctx);
    if (!g.stub(state).Exist(&ctx, req, &resp).ok()) {
      state.SkipWithError("Exist failed");
    } else if (!AllExist(resp.exists(), keys.size())) {
      state.SkipWithError("a preloaded key does not exist");
    }
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

BENCHMARK(BM_InProcess_GetReplicas_NoLease)->Arg(64)->Arg(1)->Arg(1024);
BENCHMARK(BM_InProcess_GetReplicasLease)->Arg(64);
BENCHMARK(BM_InProcess_PrefixCountOnly)->Arg(1000);
BENCHMARK(BM_InProcess_PrefixLeaseAnswer)
    ->Args({1000, 0, 0})
    ->Args({1000, 1, 0})
    ->Args({1000, 0, 1})
    ->Args({1000, 1, 1});
BENCHMARK(BM_InProcess_GetReplicasLeaseAndRelease)->Arg(64)->Arg(1024);
BENCHMARK(BM_InProcess_Exist)->Arg(64)->Arg(1)->Arg(1024);
BENCHMARK(BM_InProcess_Exist)->Arg(64)->Threads(2)->UseRealTime();
BENCHMARK(BM_InProcess_GetReplicasLeaseAndRelease)->Arg(64)->Threads(2)->UseRealTime();
// One caller measures latency per batch; several callers on their own connections (as many
// mc-clients would be) measure what the master serves. Rates are keys per wall-clock second.
BENCHMARK(BM_Grpc_GetReplicasLeaseAndRelease)->Arg(64)->Arg(1024)->UseRealTime();
BENCHMARK(BM_Grpc_GetReplicasLeaseAndRelease)->Arg(1024)->Threads(4)->UseRealTime();
BENCHMARK(BM_Grpc_GetReplicasCarryingRelease)->Arg(64)->Arg(1024)->UseRealTime();
BENCHMARK(BM_Grpc_GetReplicasCarryingRelease)->Arg(1024)->Threads(4)->UseRealTime();
BENCHMARK(BM_Grpc_PrefixLeaseAndRelease)->Args({1000, 0})->Args({1000, 1})->UseRealTime();
BENCHMARK(BM_Grpc_GetReplicas_NoLease)->Arg(64)->Arg(1024)->UseRealTime();
BENCHMARK(BM_Grpc_GetReplicas_NoLease)->Arg(64)->Arg(1024)->Threads(4)->UseRealTime();
BENCHMARK(BM_Grpc_Exist)->Arg(1)->Arg(64)->Arg(1024)->UseRealTime();
BENCHMARK(BM_Grpc_Exist)->Arg(64)->Arg(1024)->Threads(4)->UseRealTime();

}  // namespace
}  // namespace mc::master

int main(int argc, char** argv) {
  mc::DisableMutexDeadlockDetection();  // as the daemons run
  if (const char* a = std::getenv("MC_BENCH_MASTER_AUTH"); a != nullptr && std::string(a) == "0") {
    mc::master::bench::g_master_auth = false;
  }
  std::printf("master RPC authentication: %s\n", mc::master::bench::g_master_auth ? "on" : "off");
  if (const char* f = std::getenv("MC_BENCH_FLEET"); f != nullptr && std::string(f) == "1") {
    mc::master::bench::RegisterFleetBenchmarks();  // only on request: tens of seconds, gigabytes
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  mc::master::bench::StopFleetIfStarted();
  benchmark::Shutdown();
  return 0;
}
