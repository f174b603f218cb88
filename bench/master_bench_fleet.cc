// The master at fleet scale (MC_BENCH_FLEET=1 mc_master_bench): see master_bench_fleet.h.
#include "bench/master_bench_fleet.h"

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
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/master_bench_common.h"
#include "benchmark/benchmark.h"
#include "client/session/master_lane_client.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/master_credentials.h"
#include "common/metrics.h"
#include "master/master_server.h"
#include "master/metadata_service.h"
#include "mcstore/v1/master.grpc.pb.h"
#include "proto/master_lane_frame.h"
#include "proto/packed_lookups.h"

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
// lookups of 1,024 keys and their release run from 1, 2 and 4 callers on their own connections,
// in four modes (Mode below): the lookup over gRPC or over the master lane, and the release as a
// ReleaseLeases RPC of its own or carried in the caller's next lookup (as mc-client sends it).
// Counters: p50/p99 per batch (lookup + release, µs), the process's RSS, and CPU seconds per
// million keys of the whole process and of the master alone (the process less the callers' and
// the heartbeat thread's own CPU). After each run every lease must have been released (none
// held, none expired), or the run is reported failed.

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
      // The lane as mc-client opens it (to the host of its master target), one connection per
      // caller as each caller is one daemon.
      if (server_->lane_port() == 0) std::abort();
      lanes_.push_back(std::make_unique<client::MasterLaneClient>(client::MasterLaneClientOptions{
          .host = "127.0.0.1", .port = server_->lane_port(), .max_connections = 1}));
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
  client::MasterLaneClient& lane(int thread) { return *lanes_[thread % kMaxCallers]; }
  // The x-mc-session value of client `thread` (what a lane frame carries); "" without auth.
  const std::string& session(int thread) const { return sessions_[thread % sessions_.size()]; }
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

  // The master's lease figures: counters since it started, and the leases held now.
  struct LeaseFigures {
    uint64_t granted = 0;
    uint64_t released = 0;
    uint64_t expired = 0;
    size_t held = 0;
  };
  LeaseFigures Leases() {
    MetricsRegistry& m = server_->metrics();
    return {.granted = m.GetCounter("mc_leases_granted_total", "Read leases granted").Value(),
            .released =
                m.GetCounter("mc_leases_released_total", "Read leases released by readers").Value(),
            .expired =
                m.GetCounter("mc_leases_expired_total", "Read leases that ended by expiry").Value(),
            .held = server_->service().ActiveLeaseCount()};
  }

  // What thread 0 notes before a run's loop; it also resets the count of callers done.
  struct RunStart {
    double process_cpu = 0;
    double heartbeat_cpu = 0;
    LeaseFigures leases;
  };
  RunStart StartRun() ABSL_LOCKS_EXCLUDED(callers_mu_) {
    {
      absl::MutexLock lock(&callers_mu_);
      callers_done_ = 0;
    }
    return {.process_cpu = ProcessCpuSeconds(),
            .heartbeat_cpu = HeartbeatThreadCpuSeconds(),
            .leases = Leases()};
  }
  // A caller thread has sent its last call of the run (its last release included).
  void CallerDone() ABSL_LOCKS_EXCLUDED(callers_mu_) {
    absl::MutexLock lock(&callers_mu_);
    ++callers_done_;
  }
  // Waits (up to 60 s) until `callers` callers are done; false if they were not.
  bool AwaitCallers(int callers) ABSL_LOCKS_EXCLUDED(callers_mu_) {
    absl::MutexLock lock(&callers_mu_);
    auto all_done = [this, callers]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(callers_mu_) {
      return callers_done_ >= callers;
    };
    return callers_mu_.AwaitWithTimeout(absl::Condition(&all_done), absl::Seconds(60));
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
  std::vector<std::unique_ptr<client::MasterLaneClient>> lanes_;  // one per caller, as stubs_
  std::vector<std::string> ids_;
  std::vector<uint64_t> session_ids_;
  std::vector<std::string> sessions_;  // x-mc-session per client; empty without authentication
  absl::Mutex batches_mu_;
  std::map<size_t, std::vector<std::vector<std::string>>> batches_ ABSL_GUARDED_BY(batches_mu_);
  std::thread heartbeat_;
  absl::Mutex mu_;
  bool stop_ = false;
  absl::Mutex callers_mu_;
  int callers_done_ ABSL_GUARDED_BY(callers_mu_) = 0;
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

// How a fleet benchmark sends its calls: range(1) = 1 looks up over the master lane (as mc-client
// does by default), 0 over gRPC; range(2) = 1 carries each batch's release in the caller's next
// GetReplicas (as mc-client does), 0 sends it as a ReleaseLeases RPC of its own right after the
// lookup. Releases always go over gRPC: the lane has no ReleaseLeases (mc-client's release
// sender uses gRPC too). range(3) = 1 names the keys packed and takes the answer as columns (as
// mc-client does with --pack_master_keys, the default), 0 one string and one record per key.
// range(4) = 1 names the release's keys packed too (as mc-client does for the releases its
// lookups carry), 0 one by one.
struct Mode {
  bool lane = false;
  bool carry = false;
  bool packed = false;
  bool packed_releases = false;
};

// One caller's leased lookup of `keys` as fleet client `t`, carrying `carried` when it holds a
// lease. An error message, or "" when the master answered every key found.
std::string Lookup(Fleet& f, int t, Mode mode, const std::vector<std::string_view>& keys,
                   mcstore::v1::ReleaseLeasesRequest* carried, mcstore::v1::GetReplicasRequest* req,
                   mcstore::v1::GetReplicasResponse* resp) {
  req->set_client_id(f.caller_id(t));
  SetRequestKeys(keys, mode.packed, req);  // as mc-client names them
  req->set_packed(mode.packed);
  const uint32_t release_keys =
      static_cast<uint32_t>(carried->keys_size() + carried->packed_key_sizes_size());
  if (carried->lease_id() != 0) *req->add_releases() = std::move(*carried);
  carried->Clear();
  if (mode.lane) {
    grpc::Status status;
    std::string leader;
    if (f.lane(t).Call(lane::kGetReplicas, f.session(t), *req, resp, &status, &leader) !=
        client::MasterLaneClient::Outcome::kAnswered) {
      return "GetReplicas over the lane: no answer";
    }
    if (!status.ok()) return "GetReplicas over the lane: " + status.error_message();
  } else {
    grpc::ClientContext ctx;
    f.Authenticate(t, &ctx);
    const grpc::Status status = f.stub(t).GetReplicas(&ctx, *req, resp);
    if (!status.ok()) return "GetReplicas: " + status.error_message();
  }
  if (!AllRepliesFound(*req, *resp)) return "a preloaded key was not found (a client expired?)";
  if (req->releases_size() != 0 && resp->releases_seen() != release_keys) {
    return "the master did not see every key of the carried release";
  }
  // The caller's own replicas (about one key in a thousand) carry none: some row must.
  if (g_master_auth && (mode.packed ? resp->packed().capabilities().empty()
                                    : std::none_of(resp->results().begin(), resp->results().end(),
                                                   [](const mcstore::v1::KeyReplicas& r) {
                                                     return r.replicas_size() > 0 &&
                                                            !r.replicas(0).capability().empty();
                                                   }))) {
    return "no replica came with a capability";
  }
  return "";
}

// Ends `lease` (a ReleaseLeases RPC as client `t`); false if the master did not answer OK.
bool Release(Fleet& f, int t, const mcstore::v1::ReleaseLeasesRequest& lease) {
  mcstore::v1::ReleaseLeasesResponse resp;
  grpc::ClientContext ctx;
  f.Authenticate(t, &ctx);
  return f.stub(t).ReleaseLeases(&ctx, lease, &resp).ok();
}

// Thread 0, past the loop's closing barrier (and once every caller sent its last release): the
// run's counters, and the check that no lease is left.
void Report(Fleet& f, benchmark::State& state, const Fleet::RunStart& start) {
  const double process_cpu = ProcessCpuSeconds() - start.process_cpu;
  const double heartbeat_cpu = f.HeartbeatThreadCpuSeconds() - start.heartbeat_cpu;
  std::vector<double> all;
  double callers_cpu = 0;
  for (int k = 0; k < state.threads() && k < Fleet::kMaxCallers; ++k) {
    all.insert(all.end(), f.per_thread[k].batch_us.begin(), f.per_thread[k].batch_us.end());
    callers_cpu += f.per_thread[k].cpu_s;
  }
  const Fleet::LeaseFigures leases = f.Leases();
  const uint64_t granted = leases.granted - start.leases.granted;
  const uint64_t released = leases.released - start.leases.released;
  const uint64_t expired = leases.expired - start.leases.expired;
  std::printf(
      "fleet: %s, %s, %s, %d caller(s): %llu leases granted, %llu released, %llu expired; %zu "
      "held at the end\n",
      state.range(1) != 0 ? "lane" : "gRPC",
      state.range(2) != 0 ? "release carried" : "release RPC",
      state.range(3) == 0   ? "key by key"
      : state.range(4) != 0 ? "packed, releases packed"
                            : "packed",
      state.threads(), static_cast<unsigned long long>(granted),
      static_cast<unsigned long long>(released), static_cast<unsigned long long>(expired),
      leases.held);
  std::fflush(stdout);
  if (leases.held != 0 || expired != 0) {
    state.SkipWithError("leases were left held or expired instead of released");
    return;
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

// A reader's leased lookups of range(0) keys against the fleet's master, each caller thread one
// of the fleet's clients, sent as Mode says (range(1): lane, range(2): release carried,
// range(3): packed, range(4): releases packed).
void BM_Fleet_GetReplicas(benchmark::State& state) {
  Fleet& f = Fleet::Get();
  const int t = state.thread_index();
  const Mode mode{.lane = state.range(1) != 0,
                  .carry = state.range(2) != 0,
                  .packed = state.range(3) != 0,
                  .packed_releases = state.range(4) != 0};
  const auto& batches = f.Batches(state.range(0));
  Fleet::PerThread& mine = f.per_thread[t % Fleet::kMaxCallers];
  mine.batch_us.clear();
  mine.cpu_s = 0;
  Fleet::RunStart start;
  if (t == 0) start = f.StartRun();  // before the loop's opening barrier
  mcstore::v1::ReleaseLeasesRequest carried;
  std::vector<std::string_view> keys;  // the batch's keys, as mc-client holds them
  size_t i = static_cast<size_t>(t) * 97;
  std::string error;
  for (auto _ : state) {
    const double cpu0 = ThreadCpuSeconds();
    const auto begin = std::chrono::steady_clock::now();
    google::protobuf::Arena arena;
    auto& req = *google::protobuf::Arena::CreateMessage<mcstore::v1::GetReplicasRequest>(&arena);
    auto& resp = *google::protobuf::Arena::CreateMessage<mcstore::v1::GetReplicasResponse>(&arena);
    const std::vector<std::string>& batch = batches[i++ % batches.size()];
    keys.assign(batch.begin(), batch.end());
    error = Lookup(f, t, mode, keys, &carried, &req, &resp);
    if (!error.empty()) break;
    carried.set_lease_id(resp.lease_id());
    SetRequestKeys(keys, mode.packed_releases, &carried);
    if (!mode.carry) {
      if (!Release(f, t, carried)) {
        error = "ReleaseLeases failed";
        break;
      }
      carried.Clear();
    }
    mine.batch_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
            .count());
    mine.cpu_s += ThreadCpuSeconds() - cpu0;
  }
  // The last lease, as mc-client's release sender sends it when no lookup follows.
  if (carried.lease_id() != 0 && !Release(f, t, carried) && error.empty()) {
    error = "the last ReleaseLeases failed";
  }
  if (!error.empty()) state.SkipWithError(error.c_str());
  state.SetItemsProcessed(state.iterations() * state.range(0));
  f.CallerDone();
  if (t != 0) return;
  if (!f.AwaitCallers(state.threads())) {
    state.SkipWithError("a caller did not finish its last release");
    return;
  }
  if (error.empty()) Report(f, state, start);
}

}  // namespace

void RegisterFleetBenchmarks() {
  // Threads outermost, so one process alternates the modes at each caller count: the four of
  // lane and carry with keys one by one, then lane and carried with the lookup's keys packed,
  // then the daemons' mode (the carried release's keys packed too) and the same over gRPC.
  const std::vector<std::vector<int64_t>> modes = {{0, 0, 0, 0}, {0, 1, 0, 0}, {1, 0, 0, 0},
                                                   {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 1, 1},
                                                   {0, 1, 1, 1}};
  for (int threads : {1, 2, 4}) {
    for (const auto& m : modes) {
      benchmark::RegisterBenchmark("BM_Fleet_GetReplicas", BM_Fleet_GetReplicas)
          ->Args({1024, m[0], m[1], m[2], m[3]})
          ->ArgNames({"keys", "lane", "carry", "packed", "prel"})
          ->Threads(threads)
          ->UseRealTime();
    }
  }
}

void StopFleetIfStarted() { Fleet::StopIfStarted(); }

}  // namespace mc::master::bench
