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

constexpr size_t kKeys = 100'000;
constexpr uint64_t kObjectSize = 4096;
constexpr size_t kBatchesPrepared = 4096;

// Keys look like KV-block hashes: 32 bytes.
std::string KeyOf(size_t i) {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016zx%016zx", static_cast<size_t>(i * 0x9E3779B97F4A7C15ull),
                i);
  return std::string(buf, 32);
}

bool g_master_auth = true;  // set from MC_BENCH_MASTER_AUTH in main

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
    } else if (!AllFound(req, resp)) {
      state.SkipWithError("a preloaded key was not found");
    }
    return resp;
  }
  // Whether every requested key was answered OK (the benchmarks look up preloaded keys only).
  static bool AllFound(const mcstore::v1::GetReplicasRequest& req,
                       const mcstore::v1::GetReplicasResponse& resp) {
    const int asked = req.keys_size() > 0 ? req.keys_size() : req.packed_key_sizes_size();
    if (req.count_only() || req.stop_at_first_miss()) {
      return resp.matched() == static_cast<uint32_t>(asked);
    }
    if (req.packed()) {
      if (resp.packed().codes_size() != asked) return false;
      for (int c : resp.packed().codes()) {
        if (c != mcstore::v1::OK) return false;
      }
      return true;
    }
    if (resp.results_size() != asked) return false;
    for (const auto& r : resp.results()) {
      if (r.code() != mcstore::v1::OK) return false;
    }
    return true;
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

// ---- the master at fleet scale (MC_BENCH_FLEET=1)
//
// A master as a large deployment sees it: MC_BENCH_FLEET_CLIENTS clients (default 1,000) register
// through the RegisterClient RPC (with a registration proof under authentication, so the master
// mints their capabilities as it does for real daemons), one segment each, and keep heartbeating
// through the Heartbeat RPC at the master's interval from one background thread; the default
// client TTL applies, so a fleet that fell behind would be expired and its keys would vanish
// (every lookup checks its answer). MC_BENCH_FLEET_KEYS keys (default 10,000,000) are preloaded
// in-process, each client putting its share (placement decides which segment), then leased
// lookups of 1,024 keys plus their release run through gRPC from 1, 2 and 4 callers on their own
// connections. Counters: p50/p99 per batch (lookup + release, µs), the process's RSS, and CPU
// seconds per million keys of the whole process and of the master alone (the process less the
// callers' and the heartbeat thread's own CPU).

size_t EnvSize(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0' || n == 0) {
    std::fprintf(stderr, "%s=%s: expected a positive integer\n", name, v);
    std::exit(2);
  }
  return static_cast<size_t>(n);
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// Resident set of this process now (/proc/self/statm), MiB; -1 if unreadable.
double RssMiB() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  if (n != 2) return -1;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

double LoadAverage1() {
  double load[3] = {0, 0, 0};
  return getloadavg(load, 3) > 0 ? load[0] : -1;
}

class Fleet {
 public:
  static constexpr int kMaxCallers = 8;
  static constexpr size_t kBatchesPrepared = 1024;

  Fleet()
      : clients_(EnvSize("MC_BENCH_FLEET_CLIENTS", 1000)),
        keys_(EnvSize("MC_BENCH_FLEET_KEYS", 10'000'000)) {
    SetLogLevel("warn");
    MasterServerOptions opts;
    opts.listen = "127.0.0.1:0";
    opts.http = "";
    opts.maintenance_interval_ms = 200;
    if (g_master_auth) keys_auth_ = *auth::ClusterKeys::FromSecrets({auth::NewSecret()});
    if (g_master_auth) opts.cluster_keys = keys_auth_;
    interval_ms_ = opts.master.heartbeat_interval_ms;
    server_ = std::make_unique<MasterServer>(opts);
    if (!server_->Start().ok()) std::abort();
    for (int i = 0; i < kMaxCallers; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // no connection sharing
      stubs_.push_back(mcstore::v1::Master::NewStub(grpc::CreateCustomChannel(
          server_->grpc_address(), grpc::InsecureChannelCredentials(), args)));
    }
    const auto t0 = std::chrono::steady_clock::now();
    Register();
    const auto t1 = std::chrono::steady_clock::now();
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    Preload();
    const auto t2 = std::chrono::steady_clock::now();
    std::printf(
        "fleet: %zu clients registered in %.1f s (heartbeat every %lld ms), %zu keys preloaded "
        "in %.1f s (%.0f keys/s), RSS %.0f MiB, load average %.2f\n",
        clients_, std::chrono::duration<double>(t1 - t0).count(),
        static_cast<long long>(interval_ms_), keys_, std::chrono::duration<double>(t2 - t1).count(),
        static_cast<double>(keys_) / std::chrono::duration<double>(t2 - t1).count(), RssMiB(),
        LoadAverage1());
    std::fflush(stdout);
  }

  // The first caller builds it; the others (a first benchmark run with several threads) wait.
  static Fleet& Get() {
    static Fleet* fleet = [] { return instance_ = new Fleet(); }();
    return *fleet;
  }
  // Stops the heartbeat thread (main, after the benchmarks); the master lives until exit.
  static void StopIfStarted() {
    Fleet* f = instance_.load();
    if (f == nullptr) return;
    {
      absl::MutexLock lock(&f->mu_);
      f->stop_ = true;
    }
    f->heartbeat_.join();
    std::printf("fleet: %llu heartbeats, %llu answered unknown or failed, longest sweep %.0f ms\n",
                static_cast<unsigned long long>(f->heartbeats_.load()),
                static_cast<unsigned long long>(f->heartbeat_failures_.load()),
                f->longest_sweep_ms_.load());
  }

  // Random batches of `batch` distinct keys of the fleet, prepared once.
  const std::vector<std::vector<std::string>>& Batches(size_t batch) {
    auto& out = batches_[batch];
    if (out.empty()) {
      std::mt19937_64 rng(42);
      for (size_t b = 0; b < kBatchesPrepared; ++b) {
        std::vector<std::string> keys;
        const size_t start = rng() % keys_;
        for (size_t i = 0; i < batch; ++i) keys.push_back(KeyOf((start + i * 7919) % keys_));
        out.push_back(std::move(keys));
      }
    }
    return out;
  }

  mcstore::v1::Master::Stub& stub(int thread) { return *stubs_[thread % kMaxCallers]; }
  // Lookups are sent as client `thread` of the fleet (each caller is one of its members).
  const std::string& caller_id(int thread) const { return ids_[thread % ids_.size()]; }
  void Authenticate(int thread, grpc::ClientContext* ctx) const {
    const std::string& s = sessions_[thread % sessions_.size()];
    if (!s.empty()) ctx->AddMetadata(auth::kSessionHeader, s);
  }
  double HeartbeatThreadCpuSeconds() {
    clockid_t id;
    if (pthread_getcpuclockid(heartbeat_.native_handle(), &id) != 0) return 0;
    timespec ts{};
    clock_gettime(id, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }

  // Per caller thread, filled inside the timed loop (so complete at its closing barrier).
  struct PerThread {
    std::vector<double> batch_us;
    double cpu_s = 0;
  };
  PerThread per_thread[kMaxCallers];

 private:
  std::string Id(size_t i) const {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "fleet-%05zu", i);
    return buf;
  }

  void Register() {
    std::string run_id;
    if (g_master_auth) {
      mcstore::v1::HelloRequest req;
      mcstore::v1::HelloResponse resp;
      grpc::ClientContext ctx;
      if (!stubs_[0]->Hello(&ctx, req, &resp).ok()) std::abort();
      run_id = resp.run_id();
    }
    const uint64_t per_client = (keys_ / clients_ + 1) * kObjectSize * 2;
    for (size_t i = 0; i < clients_; ++i) {
      mcstore::v1::RegisterClientRequest req;
      req.set_client_id(Id(i));
      req.set_host("host-" + std::to_string(i));
      req.set_data_endpoint("127.0.0.1:" + std::to_string(20000 + i % 40000));
      auto* seg = req.add_segments();
      seg->set_local_index(0);
      seg->set_size(per_client);
      mcstore::v1::RegisterClientResponse resp;
      grpc::ClientContext ctx;
      if (g_master_auth) {
        ctx.AddMetadata(auth::kProofHeader,
                        auth::MakeProof(*keys_auth_, auth::ProofRole::kRegister, req.client_id(),
                                        req.data_endpoint(), auth::UnixNowMs(), run_id));
      }
      const grpc::Status s = stubs_[0]->RegisterClient(&ctx, req, &resp);
      if (!s.ok()) {
        std::fprintf(stderr, "fleet: RegisterClient %s: %s\n", req.client_id().c_str(),
                     s.error_message().c_str());
        std::abort();
      }
      ids_.push_back(req.client_id());
      session_ids_.push_back(resp.session());
      sessions_.push_back(g_master_auth
                              ? auth::MakeSessionCredential(req.client_id(), resp.session_token())
                              : std::string());
    }
  }

  // Client c puts keys c, c + clients, c + 2 clients, ... in batches of 1,000.
  void Preload() {
    MetadataService& svc = server_->service();
    std::vector<std::string> keys;
    std::vector<PutStartItem> items;
    std::vector<PutEndItem> ends;
    for (size_t c = 0; c < clients_; ++c) {
      for (size_t i = c; i < keys_;) {
        keys.clear();
        for (; i < keys_ && keys.size() < 1000; i += clients_) keys.push_back(KeyOf(i));
        items.clear();
        for (const auto& k : keys) items.push_back({k, kObjectSize});
        auto started = svc.PutStart(ids_[c], items, 1);
        ends.clear();
        for (size_t k = 0; k < keys.size(); ++k) {
          if (!started[k].status.ok()) {
            std::fprintf(stderr, "fleet: preload PutStart: %s\n",
                         started[k].status.ToString().c_str());
            std::abort();
          }
          ends.push_back({keys[k], started[k].generation, 1});
        }
        for (const auto& s : svc.PutEnd(ids_[c], ends)) {
          if (!s.ok()) std::abort();
        }
      }
    }
  }

  // One sweep over every session per heartbeat interval, through the Heartbeat RPC on a
  // connection of its own: the sweep sends every client's heartbeat at once (callback API), as a
  // fleet's daemons would, and waits for the answers.
  void HeartbeatLoop() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = mcstore::v1::Master::NewStub(grpc::CreateCustomChannel(
        server_->grpc_address(), grpc::InsecureChannelCredentials(), args));
    struct Call {
      grpc::ClientContext ctx;
      mcstore::v1::HeartbeatRequest req;
      mcstore::v1::HeartbeatResponse resp;
    };
    auto next = std::chrono::steady_clock::now();
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::unique_ptr<Call>> calls;
      absl::Mutex done_mu;
      size_t pending = ids_.size();
      for (size_t i = 0; i < ids_.size(); ++i) {
        auto call = std::make_unique<Call>();
        call->req.set_client_id(ids_[i]);
        call->req.set_session(session_ids_[i]);
        if (!sessions_[i].empty()) call->ctx.AddMetadata(auth::kSessionHeader, sessions_[i]);
        call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        Call* c = call.get();
        calls.push_back(std::move(call));
        stub->async()->Heartbeat(&c->ctx, &c->req, &c->resp,
                                 [this, c, &done_mu, &pending](grpc::Status s) {
                                   if (!s.ok() || !c->resp.known()) ++heartbeat_failures_;
                                   ++heartbeats_;
                                   absl::MutexLock lock(&done_mu);
                                   --pending;
                                 });
      }
      {
        absl::MutexLock lock(&done_mu);
        done_mu.Await(absl::Condition(
            +[](size_t* p) { return *p == 0; }, &pending));
      }
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      if (ms > longest_sweep_ms_.load()) longest_sweep_ms_.store(ms);
      next += std::chrono::milliseconds(interval_ms_);
      absl::MutexLock lock(&mu_);
      const auto now = std::chrono::steady_clock::now();
      if (next < now) next = now;  // behind: the next sweep starts at once
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(next - now));
      if (stop_) return;
    }
  }

  static inline std::atomic<Fleet*> instance_{nullptr};  // for StopIfStarted
  const size_t clients_;
  const size_t keys_;
  int64_t interval_ms_ = 1000;
  auth::ClusterKeysPtr keys_auth_;
  std::unique_ptr<MasterServer> server_;
  std::vector<std::unique_ptr<mcstore::v1::Master::Stub>> stubs_;
  std::vector<std::string> ids_;
  std::vector<uint64_t> session_ids_;
  std::vector<std::string> sessions_;  // x-mc-session per client; empty without authentication
  std::map<size_t, std::vector<std::vector<std::string>>> batches_;
  std::thread heartbeat_;
  absl::Mutex mu_;
  bool stop_ = false;
  std::atomic<uint64_t> heartbeats_{0};
  std::atomic<uint64_t> heartbeat_failures_{0};
  std::atomic<double> longest_sweep_ms_{0};
};

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// A reader's leased lookup of range(0) keys and its release, as BM_Grpc_GetReplicasLeaseAndRelease,
// against the fleet's master; each caller thread is one of the fleet's clients.
void BM_Fleet_GetReplicasLeaseAndRelease(benchmark::State& state) {
  Fleet& f = Fleet::Get();
  const int t = state.thread_index();
  const auto& batches = f.Batches(state.range(0));
  Fleet::PerThread& mine = f.per_thread[t % Fleet::kMaxCallers];
  mine.batch_us.clear();
  mine.cpu_s = 0;
  const double process_cpu0 = t == 0 ? ProcessCpuSeconds() : 0;
  const double heartbeat_cpu0 = t == 0 ? f.HeartbeatThreadCpuSeconds() : 0;
  size_t i = static_cast<size_t>(t) * 97;
  for (auto _ : state) {
    const double cpu0 = ThreadCpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    const auto& keys = batches[i++ % batches.size()];
    mcstore::v1::GetReplicasRequest req;
    req.set_client_id(f.caller_id(t));
    for (const auto& k : keys) req.add_keys(k);
    google::protobuf::Arena arena;
    auto& resp = *google::protobuf::Arena::CreateMessage<mcstore::v1::GetReplicasResponse>(&arena);
    {
      grpc::ClientContext ctx;
      f.Authenticate(t, &ctx);
      if (!f.stub(t).GetReplicas(&ctx, req, &resp).ok()) {
        state.SkipWithError("GetReplicas failed");
        break;
      }
      if (!OverGrpc::AllFound(req, resp)) {
        state.SkipWithError("a preloaded key was not found (a client expired?)");
        break;
      }
      if (g_master_auth && resp.results(0).replicas(0).capability().empty()) {
        state.SkipWithError("a replica came without a capability");
        break;
      }
    }
    mcstore::v1::ReleaseLeasesRequest rel;
    rel.set_lease_id(resp.lease_id());
    *rel.mutable_keys() = req.keys();
    mcstore::v1::ReleaseLeasesResponse rel_resp;
    grpc::ClientContext ctx;
    f.Authenticate(t, &ctx);
    if (!f.stub(t).ReleaseLeases(&ctx, rel, &rel_resp).ok()) {
      state.SkipWithError("ReleaseLeases failed");
      break;
    }
    mine.batch_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
    mine.cpu_s += ThreadCpuSeconds() - cpu0;
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  if (t != 0) return;
  // Past the loop's closing barrier: every caller's figures are in.
  const double process_cpu = ProcessCpuSeconds() - process_cpu0;
  const double heartbeat_cpu = f.HeartbeatThreadCpuSeconds() - heartbeat_cpu0;
  std::vector<double> all;
  double callers_cpu = 0;
  for (int k = 0; k < state.threads() && k < Fleet::kMaxCallers; ++k) {
    all.insert(all.end(), f.per_thread[k].batch_us.begin(), f.per_thread[k].batch_us.end());
    callers_cpu += f.per_thread[k].cpu_s;
  }
  const double mkeys = static_cast<double>(all.size()) * static_cast<double>(state.range(0)) / 1e6;
  if (mkeys <= 0) return;
  state.counters["p50_us"] = Percentile(all, 0.50);
  state.counters["p99_us"] = Percentile(all, 0.99);
  state.counters["rss_MiB"] = RssMiB();
  state.counters["cpu_s/Mkey"] = process_cpu / mkeys;
  state.counters["master_cpu_s/Mkey"] = (process_cpu - callers_cpu - heartbeat_cpu) / mkeys;
  state.counters["load1"] = LoadAverage1();
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
    mc::master::g_master_auth = false;
  }
  std::printf("master RPC authentication: %s\n", mc::master::g_master_auth ? "on" : "off");
  if (const char* f = std::getenv("MC_BENCH_FLEET"); f != nullptr && std::string(f) == "1") {
    // Registered only on request: the fleet's preload takes tens of seconds and gigabytes.
    for (int threads : {1, 2, 4}) {
      benchmark::RegisterBenchmark("BM_Fleet_GetReplicasLeaseAndRelease",
                                   mc::master::BM_Fleet_GetReplicasLeaseAndRelease)
          ->Arg(1024)
          ->Threads(threads)
          ->UseRealTime();
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  mc::master::Fleet::StopIfStarted();
  benchmark::Shutdown();
  return 0;
}
