#include "tools/mc_bench_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/buffers/fd_session.h"
#include "client/fast/fast_session.h"
#include "mcstore/v1/store.grpc.pb.h"
#include "tools/mc_bench_pattern.h"
#include "tools/mc_bench_stats.h"
#include "tools/store_channel.h"

namespace mc::bench {

namespace v1 = mcstore::v1;

namespace {

constexpr double kGB = 1e9;

// `token` and `owner` (an fd session's) go with every call.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const std::string& token,
                                           const std::string& owner,
                                           const ChannelSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Each worker gets its own connection rather than sharing one HTTP/2 connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return tools::MakeStoreChannel(target, args, token, owner, security);
}

// The fd session with the daemon at `target` (its fd socket `fd_socket`, default next to a
// unix:PATH target); null after printing why.
std::unique_ptr<client::FdSession> OpenSession(const std::string& target,
                                               const std::string& fd_socket, FILE* out) {
  std::string path = fd_socket.empty() ? client::DefaultFdSocket(target) : fd_socket;
  if (path.empty()) {
    std::fprintf(out,
                 "mc-bench: shm buffers of %s need its fd socket: --client unix:PATH, or "
                 "--fd_socket / --put_fd_socket (or --shm=false)\n",
                 target.c_str());
    return nullptr;
  }
  auto session = client::FdSession::Open(path);
  if (!session.ok()) {
    std::fprintf(out, "mc-bench: %s\n", session.status().ToString().c_str());
    return nullptr;
  }
  return *std::move(session);
}

// One fast-channel connection per worker to the daemon at `target` (a unix:PATH with a
// PATH.fast socket), attached as `owner`; empty when there is none or it refuses (after saying
// why: the bench then uses gRPC).
std::vector<std::unique_ptr<client::FastSession>> OpenFast(const std::string& target,
                                                           const std::string& owner, int threads,
                                                           int64_t timeout_ms, FILE* out) {
  std::vector<std::unique_ptr<client::FastSession>> sessions;
  const std::string path = client::fast::DefaultFastSocket(target);
  if (path.empty() || access(path.c_str(), F_OK) != 0) return sessions;
  for (int t = 0; t < threads; ++t) {
    auto session = client::FastSession::Open(path, owner, timeout_ms);
    if (!session.ok()) {
      std::fprintf(out, "mc-bench: fast channel %s: %s; using gRPC\n", path.c_str(),
                   session.status().ToString().c_str());
      return {};
    }
    sessions.push_back(*std::move(session));
  }
  return sessions;
}

void SetDeadline(grpc::ClientContext* c, int64_t timeout_ms) {
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

// One POSIX shm object mapped here and registered with one or two daemons.
class SharedBuffer {
 public:
  ~SharedBuffer() {
    for (auto& [stub, id] : registrations_) {
      grpc::ClientContext c;
      SetDeadline(&c, 10'000);
      v1::UnregisterBufferRequest req;
      req.set_buffer_id(id);
      v1::UnregisterBufferResponse resp;
      (void)stub->UnregisterBuffer(&c, req, &resp);  // best effort at exit
    }
    if (base_ != nullptr) munmap(base_, size_);
    if (fd_ >= 0) close(fd_);
    if (!name_.empty()) shm_unlink(name_.c_str());
  }

  bool Create(uint64_t size, FILE* out) {
    size_ = size;
    name_ = absl::StrFormat("/mc-bench-%d-%08x", getpid(), std::random_device()());
    int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      std::fprintf(out, "mc-bench: shm_open(%s): %s\n", name_.c_str(), std::strerror(errno));
      name_.clear();
      return false;
    }
    bool ok = ftruncate(fd, static_cast<off_t>(size)) == 0;
    if (ok) {
      void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) base_ = static_cast<char*>(p);
    }
    fd_ = fd;  // kept: its fd is what registers it
    if (base_ == nullptr) {
      std::fprintf(out, "mc-bench: cannot map %llu bytes of shm\n",
                   static_cast<unsigned long long>(size));
      return false;
    }
    std::memset(base_, 0, size);  // fault the pages in here, untimed
    return true;
  }

  // Registers with the daemon behind `stub` by passing the fd in `session` (the stub's calls
  // carry its owner); returns the buffer id there (0 on failure).
  uint64_t Register(v1::Store::Stub* stub, client::FdSession& session, FILE* out) {
    absl::StatusOr<std::string> handle = session.Register(fd_, size_);
    if (!handle.ok()) {
      std::fprintf(out, "mc-bench: passing the buffer: %s\n", handle.status().ToString().c_str());
      return 0;
    }
    grpc::ClientContext c;
    SetDeadline(&c, 30'000);
    v1::RegisterBufferRequest req;
    req.set_handle(*handle);
    v1::RegisterBufferResponse resp;
    grpc::Status s = stub->RegisterBuffer(&c, req, &resp);
    if (!s.ok()) {
      std::fprintf(out, "mc-bench: RegisterBuffer: %s\n", s.error_message().c_str());
      return 0;
    }
    registrations_.emplace_back(stub, resp.buffer_id());
    return resp.buffer_id();
  }

  char* data() const { return base_; }

 private:
  std::string name_;
  int fd_ = -1;
  char* base_ = nullptr;
  uint64_t size_ = 0;
  std::vector<std::pair<v1::Store::Stub*, uint64_t>> registrations_;
};

// What one worker thread counted in one phase.
struct Tally {
  uint64_t rpcs = 0, items = 0, ok = 0, miss = 0, err = 0, verify_fail = 0, bytes = 0;
  double busy_s = 0;  // time inside RPCs
  std::vector<double> latency_ms;
  void Add(const Tally& t) {
    rpcs += t.rpcs, items += t.items, ok += t.ok, miss += t.miss, err += t.err;
    verify_fail += t.verify_fail, bytes += t.bytes;
    latency_ms.insert(latency_ms.end(), t.latency_ms.begin(), t.latency_ms.end());
  }
};

struct PhaseResult {
  Tally total;
  double gbps = 0, wall_gbps = 0, items_per_s = 0, wall_s = 0;
  // CPU seconds per GB moved: this process (its verification included) and --cpu_pids summed;
  // negative when not measured.
  double cpu_s_per_gb = -1, pids_cpu_s_per_gb = -1;
  LatencySummary lat;
};

class Runner {
 public:
  Runner(const StoreBenchOptions& o, FILE* out) : o_(o), out_(out) {}

  int Run() {
    if (!Setup()) return 2;
    std::vector<PhaseResult> puts, gets;
    bool failed = false;
    for (int run = 1; run <= o_.runs; ++run) {
      if (!o_.stored) {
        PhaseResult put = Phase(run, /*is_put=*/true);
        if (o_.measure_put) Print(run, "put", put);
        failed |= put.total.err + put.total.verify_fail > 0;
        puts.push_back(std::move(put));
      }
      if (o_.measure_get) {
        PhaseResult get = Phase(run, /*is_put=*/false);
        Print(run, "get", get);
        failed |= get.total.err + get.total.verify_fail > 0;
        gets.push_back(std::move(get));
      }
      if (!o_.stored && !(o_.keep && run == o_.runs)) Remove(run);
    }
    if (o_.measure_put) Summary("put", puts);
    if (o_.measure_get) Summary("get", gets);
    std::fflush(out_);
    return failed ? 1 : 0;
  }

 private:
  bool Setup() {
    prefix_ = o_.key_prefix.empty() ? absl::StrCat("mcb-", getpid()) : o_.key_prefix;
    const std::string put_target = o_.put_client.empty() ? o_.client : o_.put_client;
    const bool same = put_target == o_.client;
    if (o_.shm) {
      get_session_ = OpenSession(o_.client, o_.fd_socket, out_);
      if (get_session_ == nullptr) return false;
      if (!same) {
        put_session_ = OpenSession(put_target, o_.put_fd_socket, out_);
        if (put_session_ == nullptr) return false;
      }
    }
    client::FdSession* put_session = same ? get_session_.get() : put_session_.get();
    const std::string get_owner = get_session_ ? get_session_->owner() : "";
    const std::string put_owner = put_session != nullptr ? put_session->owner() : "";
    for (int t = 0; t < o_.threads; ++t) {
      get_stubs_.push_back(
          v1::Store::NewStub(MakeChannel(o_.client, o_.store_token, get_owner, o_.security)));
      put_stubs_.push_back(
          v1::Store::NewStub(MakeChannel(put_target, o_.store_token, put_owner, o_.security)));
    }
    if (o_.fast) {
      put_fast_ = OpenFast(put_target, put_owner, o_.threads, o_.timeout_ms, out_);
      // Gets over the fast channel land in registered slices: inline answers would not fit.
      if (o_.shm) get_fast_ = OpenFast(o_.client, get_owner, o_.threads, o_.timeout_ms, out_);
    }
    std::fprintf(out_, "mc-bench: puts over %s, gets over %s\n", PathOf(true), PathOf(false));
    slot_count_ = static_cast<uint64_t>(o_.threads) * static_cast<uint64_t>(o_.batch);
    if (!shm_.Create(slot_count_ * o_.value_size, out_)) return false;
    if (o_.shm) {
      get_buffer_ = shm_.Register(get_stubs_[0].get(), *get_session_, out_);
      put_buffer_ = same ? get_buffer_ : shm_.Register(put_stubs_[0].get(), *put_session, out_);
      if (get_buffer_ == 0 || put_buffer_ == 0) return false;
    }
    return true;
  }

  const char* PathOf(bool is_put) const {
    return (is_put ? put_fast_ : get_fast_).empty() ? "grpc" : "fast";
  }

  // BatchPut of worker t over its fast connection when it has one and the request fits, else
  // over gRPC: empty on success, else the error.
  std::string CallPut(int t, const v1::BatchPutRequest& req, v1::BatchPutResponse* resp) {
    if (!put_fast_.empty() && put_fast_[t]->Fits(req)) {
      absl::Status s = put_fast_[t]->Call(client::fast::kBatchPut, req, resp);
      return s.ok() ? "" : s.ToString();
    }
    grpc::ClientContext c;
    SetDeadline(&c, o_.timeout_ms);
    grpc::Status s = put_stubs_[t]->BatchPut(&c, req, resp);
    return s.ok() ? "" : s.error_message();
  }
  std::string CallGet(int t, const v1::BatchGetRequest& req, v1::BatchGetResponse* resp) {
    if (!get_fast_.empty() && get_fast_[t]->Fits(req)) {
      absl::Status s = get_fast_[t]->Call(client::fast::kBatchGet, req, resp);
      return s.ok() ? "" : s.ToString();
    }
    grpc::ClientContext c;
    SetDeadline(&c, o_.timeout_ms);
    grpc::Status s = get_stubs_[t]->BatchGet(&c, req, resp);
    return s.ok() ? "" : s.error_message();
  }

  // --stored reads, in every run, the keys a --keep --runs 1 run left.
  std::string Key(int run, uint64_t id) const {
    return absl::StrCat(prefix_, "-r", o_.stored ? 1 : run, "-k", id);
  }
  char* Slot(int thread, int j) const {
    return shm_.data() + (static_cast<uint64_t>(thread) * o_.batch + j) * o_.value_size;
  }
  uint64_t SlotOffset(int thread, int j) const {
    return (static_cast<uint64_t>(thread) * o_.batch + j) * o_.value_size;
  }

  void ReportError(int run, const char* op, const std::string& key, const std::string& what) {
    std::lock_guard<std::mutex> lock(log_mu_);
    if (errors_printed_++ < 8) {
      std::fprintf(out_, "mc-bench error run=%d op=%s key=%s: %s\n", run, op, key.c_str(),
                   what.c_str());
    }
  }

  PhaseResult Phase(int run, bool is_put) {
    std::vector<Tally> tallies(o_.threads);
    std::vector<std::thread> workers;
    const double cpu0 = OwnCpuSeconds();
    const double pids0 = o_.cpu_pids.empty() ? -1 : ProcessesCpuSeconds(o_.cpu_pids);
    auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < o_.threads; ++t) {
      workers.emplace_back([this, t, run, is_put, &tallies] {
        if (is_put) {
          PutWorker(run, t, &tallies[t]);
        } else {
          GetWorker(run, t, &tallies[t]);
        }
      });
    }
    for (auto& w : workers) w.join();
    PhaseResult r;
    r.wall_s = SecondsSince(t0);
    const double cpu1 = OwnCpuSeconds();
    const double pids1 = o_.cpu_pids.empty() ? -1 : ProcessesCpuSeconds(o_.cpu_pids);
    for (const Tally& t : tallies) {
      r.total.Add(t);
      r.total.busy_s += t.busy_s;
      if (t.busy_s > 0) {
        r.gbps += static_cast<double>(t.bytes) / t.busy_s / kGB;
        r.items_per_s += static_cast<double>(t.items) / t.busy_s;
      }
    }
    if (r.wall_s > 0) r.wall_gbps = static_cast<double>(r.total.bytes) / r.wall_s / kGB;
    const double gb = static_cast<double>(r.total.bytes) / kGB;
    if (gb > 0) {
      r.cpu_s_per_gb = (cpu1 - cpu0) / gb;
      if (pids0 >= 0 && pids1 >= 0) r.pids_cpu_s_per_gb = (pids1 - pids0) / gb;
    }
    r.lat = Summarize(r.total.latency_ms);
    return r;
  }

  // Puts keys [0, keys) once; thread t takes batches t, t + threads, ...
  void PutWorker(int run, int t, Tally* tally) {
    const uint64_t keys = static_cast<uint64_t>(o_.keys);
    const uint64_t batches = (keys + o_.batch - 1) / o_.batch;
    for (uint64_t b = static_cast<uint64_t>(t); b < batches; b += o_.threads) {
      v1::BatchPutRequest req;
      const uint64_t first = b * o_.batch;
      const uint64_t last = std::min(keys, first + o_.batch);
      for (uint64_t id = first; id < last; ++id) {
        int j = static_cast<int>(id - first);
        FillPattern(Slot(t, j), o_.value_size, id);
        v1::PutItem* item = req.add_items();
        item->set_key(Key(run, id));
        if (o_.shm) {
          v1::Slice* s = item->add_slices();
          s->set_buffer_id(put_buffer_);
          s->set_offset(SlotOffset(t, j));
          s->set_length(o_.value_size);
        } else {
          item->set_data(Slot(t, j), o_.value_size);
        }
      }
      v1::BatchPutResponse resp;
      auto c0 = std::chrono::steady_clock::now();
      const std::string failure = CallPut(t, req, &resp);
      double d = SecondsSince(c0);
      tally->busy_s += d;
      tally->latency_ms.push_back(d * 1e3);
      ++tally->rpcs;
      tally->items += last - first;
      if (!failure.empty() || resp.results_size() != static_cast<int>(last - first)) {
        tally->err += last - first;
        ReportError(run, "put", Key(run, first),
                    failure.empty() ? "wrong number of results" : failure);
        continue;
      }
      for (int i = 0; i < resp.results_size(); ++i) {
        const v1::Result& r = resp.results(i);
        if (r.code() == v1::OK) {
          ++tally->ok;
          tally->bytes += o_.value_size;
        } else {
          ++tally->err;
          ReportError(run, "put", req.items(i).key(),
                      absl::StrCat(v1::Code_Name(r.code()), ": ", r.message()));
        }
      }
    }
  }

  // One get batch's plan: key id per item, -1 - n for the n-th miss.
  std::vector<int64_t> PlanBatch(std::mt19937_64& rng, int64_t* next_miss) const {
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<int64_t> ids;
    for (int j = 0; j < o_.batch; ++j) {
      if (j > 0 && u(rng) < o_.duplicate_ratio) {
        ids.push_back(ids[std::uniform_int_distribution<int>(0, j - 1)(rng)]);
      } else if (u(rng) < o_.hit_ratio) {
        int64_t id = 0;
        for (int attempt = 0; attempt < 16; ++attempt) {  // distinct unless asked to repeat
          id = std::uniform_int_distribution<int64_t>(0, o_.keys - 1)(rng);
          if (std::find(ids.begin(), ids.end(), id) == ids.end()) break;
        }
        ids.push_back(id);
      } else {
        ids.push_back(-1 - (*next_miss)++);
      }
    }
    return ids;
  }

  void GetWorker(int run, int t, Tally* tally) {
    std::mt19937_64 rng(o_.seed * 1000003 + static_cast<uint64_t>(run) * 7919 + t);
    int64_t next_miss = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t it = -o_.warmup;; ++it) {
      if (it >= 0) {
        if (o_.seconds > 0 ? SecondsSince(t0) >= o_.seconds : it >= o_.iterations) break;
      } else if (it == -1) {
        t0 = std::chrono::steady_clock::now();
      }
      Tally scratch;
      Tally* into = it >= 0 ? tally : &scratch;
      if (o_.get_gap_ms > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o_.get_gap_ms));
      }
      std::vector<int64_t> ids = PlanBatch(rng, &next_miss);
      v1::BatchGetRequest req;
      for (int j = 0; j < o_.batch; ++j) {
        v1::GetItem* item = req.add_items();
        item->set_key(ids[j] >= 0
                          ? Key(run, ids[j])
                          : absl::StrCat(prefix_, "-r", run, "-miss-t", t, "-", -1 - ids[j]));
        if (o_.shm) {
          if (o_.verify) PoisonPages(Slot(t, j), o_.value_size);
          v1::Slice* s = item->add_slices();
          s->set_buffer_id(get_buffer_);
          s->set_offset(SlotOffset(t, j));
          s->set_length(o_.value_size);
        }
      }
      v1::BatchGetResponse resp;
      auto c0 = std::chrono::steady_clock::now();
      const std::string failure = CallGet(t, req, &resp);
      double d = SecondsSince(c0);
      into->busy_s += d;
      into->latency_ms.push_back(d * 1e3);
      ++into->rpcs;
      into->items += o_.batch;
      if (!failure.empty() || resp.results_size() != o_.batch) {
        into->err += o_.batch;
        ReportError(run, "get", req.items(0).key(),
                    failure.empty() ? "wrong number of results" : failure);
        continue;
      }
      for (int j = 0; j < o_.batch; ++j) Account(run, t, j, ids[j], req, resp.results(j), into);
    }
  }

  void Account(int run, int t, int j, int64_t id, const v1::BatchGetRequest& req,
               const v1::GetResult& r, Tally* tally) {
    const std::string& key = req.items(j).key();
    if (id < 0) {
      if (r.code() == v1::NOT_FOUND) {
        ++tally->miss;
      } else {
        ++tally->err;
        ReportError(run, "get", key,
                    absl::StrCat("expected NOT_FOUND, got ", v1::Code_Name(r.code())));
      }
      return;
    }
    if (r.code() != v1::OK) {
      ++tally->err;
      ReportError(run, "get", key, absl::StrCat(v1::Code_Name(r.code()), ": ", r.message()));
      return;
    }
    const char* got = o_.shm ? Slot(t, j) : r.data().data();
    uint64_t got_size = o_.shm ? r.bytes_written() : r.data().size();
    if (got_size != o_.value_size || r.size() != o_.value_size ||
        (o_.verify && !CheckPattern(got, o_.value_size, static_cast<uint64_t>(id)))) {
      ++tally->verify_fail;
      ReportError(run, "get", key,
                  absl::StrCat("OK but bytes differ from the value put (bytes_written=",
                               r.bytes_written(), " size=", r.size(), ")"));
      return;
    }
    ++tally->ok;
    tally->bytes += o_.value_size;
  }

  // Removes this run's keys. A key another daemon's reader still leases (its release waits up to
  // that daemon's --lease_release_delay_us for a lookup to carry it) answers HAS_LEASE: retried
  // for up to 2 s, then reported, so a cross-get run does not leave its keys in the store.
  void Remove(int run) {
    std::vector<std::string> keys;
    for (int id = 0; id < o_.keys; ++id) keys.push_back(Key(run, id));
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!keys.empty()) {
      std::vector<std::string> leased;
      if (!RemoveOnce(run, keys, std::chrono::steady_clock::now() < give_up, &leased)) return;
      keys.swap(leased);
      if (!keys.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // One pass over `keys` (1,000 per request); keys answered HAS_LEASE go to `leased` while
  // `retry`, otherwise they are reported. False when a request itself failed.
  bool RemoveOnce(int run, const std::vector<std::string>& keys, bool retry,
                  std::vector<std::string>* leased) {
    for (size_t first = 0; first < keys.size(); first += 1000) {
      v1::BatchRemoveRequest req;
      for (size_t i = first; i < std::min(keys.size(), first + 1000); ++i) req.add_keys(keys[i]);
      grpc::ClientContext c;
      SetDeadline(&c, o_.timeout_ms);
      v1::BatchRemoveResponse resp;
      grpc::Status s = put_stubs_[0]->BatchRemove(&c, req, &resp);
      if (!s.ok()) {
        std::fprintf(out_, "mc-bench: BatchRemove: %s\n", s.error_message().c_str());
        return false;
      }
      for (int i = 0; i < resp.results_size(); ++i) {
        const v1::Result& r = resp.results(i);
        if (r.code() == v1::HAS_LEASE && retry) {
          leased->push_back(req.keys(i));
        } else if (r.code() != v1::OK && r.code() != v1::NOT_FOUND) {
          ReportError(run, "remove", req.keys(i),
                      absl::StrCat(v1::Code_Name(r.code()), ": ", r.message()));
        }
      }
    }
    return true;
  }

  void Print(int run, const char* op, const PhaseResult& r) {
    const Tally& t = r.total;
    std::fprintf(out_,
                 "mc-bench run=%d op=%s path=%s value_size=%llu batch=%d threads=%d dest=%s "
                 "dup=%.2f "
                 "hit=%.2f gap_ms=%g rpcs=%llu items=%llu ok=%llu miss=%llu err=%llu "
                 "verify_fail=%llu wall_s=%.3f GB/s=%.3f wall_GB/s=%.3f items/s=%.1f p50_ms=%.3f "
                 "p90_ms=%.3f p99_ms=%.3f max_ms=%.3f cpu_s/GB=%.3f daemons_cpu_s/GB=%.3f\n",
                 run, op, PathOf(std::string_view(op) == "put"),
                 static_cast<unsigned long long>(o_.value_size), o_.batch, o_.threads,
                 o_.shm ? "shm" : "inline", o_.duplicate_ratio, o_.hit_ratio, o_.get_gap_ms,
                 static_cast<unsigned long long>(t.rpcs), static_cast<unsigned long long>(t.items),
                 static_cast<unsigned long long>(t.ok), static_cast<unsigned long long>(t.miss),
                 static_cast<unsigned long long>(t.err),
                 static_cast<unsigned long long>(t.verify_fail), r.wall_s, r.gbps, r.wall_gbps,
                 r.items_per_s, r.lat.p50_ms, r.lat.p90_ms, r.lat.p99_ms, r.lat.max_ms,
                 r.cpu_s_per_gb, r.pids_cpu_s_per_gb);
    std::fflush(out_);
  }

  void Summary(const char* op, const std::vector<PhaseResult>& runs) {
    std::vector<double> gbps, items, p50, p90, p99, cpu, pids_cpu;
    double max_ms = 0;
    uint64_t err = 0, vfail = 0;
    for (const PhaseResult& r : runs) {
      gbps.push_back(r.gbps);
      items.push_back(r.items_per_s);
      p50.push_back(r.lat.p50_ms);
      p90.push_back(r.lat.p90_ms);
      p99.push_back(r.lat.p99_ms);
      cpu.push_back(r.cpu_s_per_gb);
      pids_cpu.push_back(r.pids_cpu_s_per_gb);
      max_ms = std::max(max_ms, r.lat.max_ms);
      err += r.total.err;
      vfail += r.total.verify_fail;
    }
    std::fprintf(out_,
                 "mc-bench summary op=%s path=%s runs=%zu value_size=%llu batch=%d threads=%d "
                 "dest=%s "
                 "gap_ms=%g GB/s=%.3f items/s=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f "
                 "max_ms=%.3f err=%llu verify_fail=%llu cpu_s/GB=%.3f daemons_cpu_s/GB=%.3f\n",
                 op, PathOf(std::string_view(op) == "put"), runs.size(),
                 static_cast<unsigned long long>(o_.value_size), o_.batch, o_.threads,
                 o_.shm ? "shm" : "inline", o_.get_gap_ms, Median(gbps), Median(items), Median(p50),
                 Median(p90), Median(p99), max_ms, static_cast<unsigned long long>(err),
                 static_cast<unsigned long long>(vfail), Median(cpu), Median(pids_cpu));
  }

  const StoreBenchOptions& o_;
  FILE* out_;
  std::string prefix_;
  // The fd sessions outlive the stubs and the buffer: its unregistration needs them alive.
  std::unique_ptr<client::FdSession> get_session_, put_session_;
  std::vector<std::unique_ptr<v1::Store::Stub>> get_stubs_, put_stubs_;
  // Per worker, with --store_fast and a fast socket: Store calls without gRPC.
  std::vector<std::unique_ptr<client::FastSession>> get_fast_, put_fast_;
  SharedBuffer shm_;
  uint64_t slot_count_ = 0;
  uint64_t get_buffer_ = 0, put_buffer_ = 0;
  std::mutex log_mu_;
  int errors_printed_ = 0;
};

}  // namespace

int RunStoreBench(const StoreBenchOptions& options, FILE* out) {
  if (options.value_size == 0 || options.batch <= 0 || options.keys <= 0 || options.threads <= 0 ||
      options.runs <= 0) {
    std::fprintf(out, "mc-bench: --value_size, --batch, --keys, --threads, --runs must be > 0\n");
    return 2;
  }
  if (!(options.get_gap_ms >= 0 && options.get_gap_ms <= 60'000)) {
    std::fprintf(out, "mc-bench: --get_gap_ms must be within 0..60000\n");
    return 2;
  }
  Runner runner(options, out);
  return runner.Run();
}

}  // namespace mc::bench
