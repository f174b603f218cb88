// The master at fleet scale (MC_BENCH_FLEET=1 mc_master_bench): see master_bench_fleet.h.
#include "bench/master_bench_fleet.h"

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
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/master_bench_common.h"
#include "benchmark/benchmark.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/master_credentials.h"
#include "common/metrics.h"
#include "master/master_server.h"
#include "master/metadata_service.h"
#include "mcstore/v1/master.grpc.pb.h"

namespace mc::master::bench {
namespace {

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

  // Random batches of `batch` distinct keys of the fleet, prepared once. Every caller thread of a
  // run asks at its start: the first prepares them while the others wait (unlocked, two threads
  // built the same vector at once when a multi-caller run came first, and freed it twice).
  const std::vector<std::vector<std::string>>& Batches(size_t batch) {
    absl::MutexLock lock(&batches_mu_);
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
  absl::Mutex batches_mu_;
  std::map<size_t, std::vector<std::vector<std::string>>> batches_ ABSL_GUARDED_BY(batches_mu_);
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
      if (!AllRepliesFound(req, resp)) {
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

}  // namespace

void RegisterFleetBenchmarks() {
  for (int threads : {1, 2, 4}) {
    benchmark::RegisterBenchmark("BM_Fleet_GetReplicasLeaseAndRelease",
                                 BM_Fleet_GetReplicasLeaseAndRelease)
        ->Arg(1024)
        ->Threads(threads)
        ->UseRealTime();
  }
}

void StopFleetIfStarted() { Fleet::StopIfStarted(); }

}  // namespace mc::master::bench
