#include "tools/mc_bench_prefix.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/fast/fast_session.h"
#include "mcstore/v1/store.grpc.pb.h"
#include "proto/packed_lookups.h"
#include "tools/mc_bench_pattern.h"
#include "tools/mc_bench_stats.h"
#include "tools/store_channel.h"

namespace mc::bench {

namespace v1 = mcstore::v1;

namespace {

// MatchPrefix and ReleaseLease over the fast channel when there is one (and the request fits),
// else over gRPC.
class PrefixCalls {
 public:
  PrefixCalls(v1::Store::Stub* stub, client::FastSession* fast, int64_t timeout_ms)
      : stub_(stub), fast_(fast), timeout_ms_(timeout_ms) {}
  // Empty on success, else the error.
  std::string Match(const v1::MatchPrefixRequest& req, v1::MatchPrefixResponse* resp);
  void Release(uint64_t lease_id);

 private:
  v1::Store::Stub* stub_;
  client::FastSession* fast_;
  int64_t timeout_ms_;
};

void SetDeadline(grpc::ClientContext* c, int64_t timeout_ms) {
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// 32 hex digits chained over the previous key, like a block hash over the prefix.
std::vector<std::string> ChainKeys(const std::string& prefix, int n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  uint64_t h = Mix(std::hash<std::string>()(prefix));
  for (int i = 0; i < n; ++i) {
    const uint64_t a = Mix(h ^ static_cast<uint64_t>(i));
    h = Mix(a);
    keys.push_back(absl::StrFormat("%s-%016x%016x", prefix, a, h));
  }
  return keys;
}

bool PutChain(v1::Store::Stub* stub, const std::vector<std::string>& keys, uint64_t value_size,
              int64_t timeout_ms, FILE* out) {
  std::string value(value_size, '\0');
  for (size_t first = 0; first < keys.size(); first += 128) {
    v1::BatchPutRequest req;
    for (size_t i = first; i < std::min(keys.size(), first + 128); ++i) {
      FillPattern(value.data(), value.size(), i);
      v1::PutItem* item = req.add_items();
      item->set_key(keys[i]);
      item->set_data(value);
    }
    grpc::ClientContext c;
    SetDeadline(&c, timeout_ms);
    v1::BatchPutResponse resp;
    grpc::Status s = stub->BatchPut(&c, req, &resp);
    if (!s.ok()) {
      std::fprintf(out, "mc-bench: BatchPut: %s\n", s.error_message().c_str());
      return false;
    }
    for (int i = 0; i < resp.results_size(); ++i) {
      const v1::Code code = resp.results(i).code();
      if (code != v1::OK && code != v1::ALREADY_EXISTS) {
        std::fprintf(out, "mc-bench: put %s: %s\n", req.items(i).key().c_str(),
                     v1::Code_Name(code).c_str());
        return false;
      }
    }
  }
  return true;
}

// MatchPrefix over `keys`, named packed (one field) or one by one.
v1::MatchPrefixRequest MatchRequest(const std::vector<std::string>& keys, bool packed,
                                    uint32_t lease_ttl_ms) {
  v1::MatchPrefixRequest req;
  for (const std::string& k : keys) {
    if (packed) {
      AppendPackedKey(k, req.mutable_packed_keys(), req.mutable_packed_key_sizes());
    } else {
      req.add_keys(k);
    }
  }
  req.set_lease_ttl_ms(lease_ttl_ms);
  return req;
}

void RemoveChain(v1::Store::Stub* stub, const std::vector<std::string>& keys, int64_t timeout_ms) {
  v1::BatchRemoveRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  grpc::ClientContext c;
  SetDeadline(&c, timeout_ms);
  v1::BatchRemoveResponse resp;
  (void)stub->BatchRemove(&c, req, &resp);  // best effort: the keys are the bench's own
}

}  // namespace

std::string PrefixCalls::Match(const v1::MatchPrefixRequest& req, v1::MatchPrefixResponse* resp) {
  if (fast_ != nullptr && fast_->Fits(req)) {
    absl::Status s = fast_->Call(client::fast::kMatchPrefix, req, resp);
    return s.ok() ? "" : s.ToString();
  }
  grpc::ClientContext c;
  SetDeadline(&c, timeout_ms_);
  grpc::Status s = stub_->MatchPrefix(&c, req, resp);
  return s.ok() ? "" : s.error_message();
}

void PrefixCalls::Release(uint64_t lease_id) {
  v1::ReleaseLeaseRequest req;
  req.set_lease_id(lease_id);
  v1::ReleaseLeaseResponse resp;
  if (fast_ != nullptr) {
    fast_->Call(client::fast::kReleaseLease, req, &resp).IgnoreError();  // expiry is the fallback
    return;
  }
  grpc::ClientContext c;
  SetDeadline(&c, timeout_ms_);
  (void)stub_->ReleaseLease(&c, req, &resp);  // untimed; expiry is the fallback
}

int RunPrefixBench(const PrefixBenchOptions& o, FILE* out) {
  if (o.chain <= 0 || o.value_size == 0 || o.iterations <= 0 || o.runs <= 0) {
    std::fprintf(out, "mc-bench: --prefix_keys, --value_size, --iterations, --runs must be > 0\n");
    return 2;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto stub =
      v1::Store::NewStub(tools::MakeStoreChannel(o.client, args, o.store_token, "", o.security));
  const std::string prefix = o.key_prefix.empty() ? absl::StrCat("mcp-", getpid()) : o.key_prefix;
  const std::vector<std::string> keys = ChainKeys(prefix, o.chain);
  if (!PutChain(stub.get(), keys, o.value_size, o.timeout_ms, out)) {
    RemoveChain(stub.get(), keys, o.timeout_ms);
    return 2;
  }
  v1::MatchPrefixRequest req = MatchRequest(keys, o.packed_keys, o.lease_ttl_ms);
  // The chain's calls are anonymous (no buffers): the fast channel's anonymous ATTACH.
  std::unique_ptr<client::FastSession> fast;
  const std::string fast_path = client::fast::DefaultFastSocket(o.client);
  if (o.fast && !fast_path.empty() && access(fast_path.c_str(), F_OK) == 0) {
    auto session = client::FastSession::Open(fast_path, "", o.timeout_ms);
    if (session.ok()) {
      fast = *std::move(session);
    } else {
      std::fprintf(out, "mc-bench: fast channel %s: %s; using gRPC\n", fast_path.c_str(),
                   session.status().ToString().c_str());
    }
  }
  const char* path = fast != nullptr ? "fast" : "grpc";
  std::fprintf(out, "mc-bench: match_prefix over %s\n", path);
  PrefixCalls calls(stub.get(), fast.get(), o.timeout_ms);

  uint64_t failures = 0;
  std::vector<double> p50, p90, p99;
  double max_ms = 0;
  for (int run = 1; run <= o.runs; ++run) {
    std::vector<double> ms;
    uint64_t bad = 0;
    for (int it = -o.warmup; it < o.iterations; ++it) {
      v1::MatchPrefixResponse resp;
      const auto t0 = std::chrono::steady_clock::now();
      const std::string failure = calls.Match(req, &resp);
      const double d = SecondsSince(t0) * 1e3;
      if (resp.lease_id() != 0) calls.Release(resp.lease_id());  // untimed
      if (failure.empty() && req.keys_size() == 0 &&
          resp.keys_seen() != static_cast<uint32_t>(o.chain)) {
        std::fprintf(out,
                     "mc-bench: the mc-client does not read packed keys; sending them one by "
                     "one\n");
        req = MatchRequest(keys, false, o.lease_ttl_ms);
        it = -o.warmup - 1;  // start the run again
        continue;
      }
      if (it < 0) continue;
      ms.push_back(d);
      if (!failure.empty() || resp.matched() != static_cast<uint32_t>(o.chain)) {
        if (bad++ == 0) {
          std::fprintf(out, "mc-bench error run=%d op=match_prefix: %s matched=%u of %d\n", run,
                       failure.empty() ? "OK" : failure.c_str(), resp.matched(), o.chain);
        }
      }
    }
    const LatencySummary l = Summarize(ms);
    std::fprintf(out,
                 "mc-bench run=%d op=match_prefix path=%s keys=%d lease_ttl_ms=%u rpcs=%zu "
                 "err=%llu p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f\n",
                 run, path, o.chain, o.lease_ttl_ms, ms.size(),
                 static_cast<unsigned long long>(bad), l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms);
    p50.push_back(l.p50_ms);
    p90.push_back(l.p90_ms);
    p99.push_back(l.p99_ms);
    max_ms = std::max(max_ms, l.max_ms);
    failures += bad;
  }
  std::fprintf(out,
               "mc-bench summary op=match_prefix path=%s runs=%d keys=%d lease_ttl_ms=%u "
               "p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f err=%llu\n",
               path, o.runs, o.chain, o.lease_ttl_ms, Median(p50), Median(p90), Median(p99), max_ms,
               static_cast<unsigned long long>(failures));
  std::fflush(out);
  if (!o.keep) RemoveChain(stub.get(), keys, o.timeout_ms);
  return failures == 0 ? 0 : 1;
}

}  // namespace mc::bench
