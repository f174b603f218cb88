// A new transport plugs into the engine through the public seam alone: MemoryTransport below is
// an in-memory "network" of daemons (endpoints "mem:NAME", each with segments, SSD records and an
// object index as plain maps), registered with TransferEngineOptions::extra_transports. It
// includes no other transport and none of them knows it; the engine routes to it the requests it
// claims, every kind of target reaches it with its own fields, memory registration reaches it,
// and the engine's guarantees (never a short OK, no proof that was not asked for, invalid
// requests refused before any transport) hold for it as for the built-in ones.
// (docs/architecture.md, "Adding a transport".)
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "transfer/transfer_engine.h"
#include "transfer/transport.h"

namespace mc::transfer {
namespace {

constexpr char kSelf[] = "10.0.0.1:7000";

// One in-memory daemon.
struct MemDaemon {
  std::map<uint64_t, std::string> segments;
  std::map<std::tuple<uint64_t, uint64_t, uint32_t>, std::string> records;  // gen, locator, tag
  std::vector<std::string> notices;
};

class MemoryTransport final : public Transport {
 public:
  struct Knobs {
    bool short_ok = false;       // misbehave: report OK one byte short
    bool unasked_proof = false;  // misbehave: return a checksum nobody asked for
    bool fail_registration = false;
    bool needs_registration = false;
  };
  MemoryTransport(std::map<std::string, MemDaemon>& daemons, Knobs knobs, std::string name)
      : daemons_(daemons), knobs_(knobs), name_(std::move(name)) {}

  std::string_view name() const override { return name_; }
  bool Claims(const TransferRequest& request) override {
    return request.endpoint.rfind("mem:", 0) == 0;
  }
  void Submit(std::span<const TransferRequest* const> requests, std::span<TransferResult> results,
              int64_t deadline_ms) override {
    absl::MutexLock lock(&mu_);
    submitted_ += requests.size();
    for (size_t i = 0; i < requests.size(); ++i) {
      if (deadline_ms != 0 && RealClock::Get().NowMs() >= deadline_ms) {
        results[i].status = DeadlineError();
        continue;
      }
      results[i] = Execute(*requests[i]);
      if (results[i].status.ok() && knobs_.short_ok) --results[i].bytes;
      if (results[i].status.ok() && knobs_.unasked_proof) results[i].checksum = 42;
    }
  }
  absl::Status RegisterMemory(void* base, uint64_t /*length*/, MemoryAccess /*access*/) override {
    if (knobs_.fail_registration) return McError(Code::kUnavailable, "mem: registration refused");
    absl::MutexLock lock(&mu_);
    registered_.insert(base);
    return absl::OkStatus();
  }
  void UnregisterMemory(void* base) override {
    absl::MutexLock lock(&mu_);
    registered_.erase(base);
  }
  bool NeedsLocalRegistration() const override { return knobs_.needs_registration; }

  size_t submitted() const {
    absl::MutexLock lock(&mu_);
    return submitted_;
  }
  size_t registered() const {
    absl::MutexLock lock(&mu_);
    return registered_.size();
  }

 private:
  // One request against its daemon's maps; OK only with every byte moved.
  TransferResult Execute(const TransferRequest& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    TransferResult out;
    auto daemon = daemons_.find(r.endpoint);
    if (daemon == daemons_.end()) {
      out.status = McError(Code::kTransferFailed, "mem: no daemon at " + r.endpoint);
      return out;
    }
    std::string* remote = nullptr;
    uint64_t offset = 0;
    if (const SegmentRange* range = AsSegmentRange(r)) {
      auto seg = daemon->second.segments.find(range->segment_id);
      if (seg == daemon->second.segments.end()) {
        out.status = McError(Code::kNotFound, "mem: unknown segment");
        return out;
      }
      remote = &seg->second;
      offset = range->offset;
    } else if (const DiskRecord* record = AsDiskRecord(r)) {
      auto rec =
          daemon->second.records.find({record->generation, record->locator, record->key_tag});
      if (rec == daemon->second.records.end()) {
        out.status = McError(Code::kNotFound, "mem: no such record");
        return out;
      }
      remote = &rec->second;
    } else {  // an index notice: the local bytes, whole
      std::string& notice = daemon->second.notices.emplace_back();
      for (const LocalBuffer& b : r.local) notice.append(b.data, b.length);
      out.bytes = notice.size();
      return out;
    }
    const uint64_t total = TotalLength(r);
    if (offset > remote->size() || total > remote->size() - offset) {
      out.status = McError(Code::kInvalidArgument, "mem: range outside the target");
      return out;
    }
    StreamingChecksum delivered;
    for (const LocalBuffer& b : r.local) {
      if (r.direction == Direction::kRead) {
        std::memcpy(b.data, remote->data() + offset, b.length);
        delivered.Update(b.data, b.length);  // hashed from the destination, as it landed
      } else {
        std::memcpy(remote->data() + offset, b.data, b.length);
      }
      offset += b.length;
    }
    out.bytes = total;
    if (r.proof == Proof::kDeliveredBytes) out.checksum = delivered.Digest();
    return out;  // kWrittenReplica: nothing this transport can prove; left empty
  }

  std::map<std::string, MemDaemon>& daemons_;
  const Knobs knobs_;
  const std::string name_;
  mutable absl::Mutex mu_;
  size_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<void*> registered_ ABSL_GUARDED_BY(mu_);
};

class TestTransport : public ::testing::Test {
 protected:
  TestTransport() : own_segment_(4096, 'o') {
    table_.Add(1, own_segment_.data(), own_segment_.size());
    MemDaemon& a = daemons_["mem:a"];
    a.segments[7] = std::string(1 << 16, '\0');
    a.records[{9, 77, 0xabc}] = "the record's payload";
  }

  // An engine with the built-in transports (tcp only remote: no rdma probing) and `added`.
  std::unique_ptr<TransferEngine> Engine(std::vector<MemoryTransport::Knobs> added) {
    TransferEngineOptions o;
    o.local_endpoint = kSelf;
    o.transport = "tcp";
    o.metrics = &metrics_;
    for (size_t i = 0; i < added.size(); ++i) {
      o.extra_transports.push_back([this, knobs = added[i], i](const TransportContext& context) {
        EXPECT_EQ(context.local_endpoint, kSelf);
        EXPECT_TRUE(context.segments.Resolve(1, 0, 4096).ok()) << "the daemon's own segments";
        auto t = std::make_unique<MemoryTransport>(daemons_, knobs, i == 0 ? "mem" : "mem2");
        transports_.push_back(t.get());
        return t;
      });
    }
    return std::make_unique<TransferEngine>(o, table_);
  }
  uint64_t Bytes(const std::string& transport, const std::string& op) {
    return metrics_
        .GetCounter("mc_transfer_bytes_total", "", {{"transport", transport}, {"op", op}})
        .Value();
  }

  std::vector<char> own_segment_;
  SegmentTable table_;
  MetricsRegistry metrics_;
  std::map<std::string, MemDaemon> daemons_;
  std::vector<MemoryTransport*> transports_;
};

TEST_F(TestTransport, PlugsInAndServesEveryKindOfTarget) {
  auto engine = Engine({{}});
  ASSERT_TRUE(engine->status().ok());
  ASSERT_EQ(transports_.size(), 1u);
  std::string src(10000, '\0');
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 3);
  std::string back(10000, '\0'), record(20, '\0'), notice = "an encoded notice";
  std::vector<TransferRequest> reqs(5);
  reqs[0] = {Direction::kWrite,
             {{src.data(), 4000}, {src.data() + 4000, 6000}},
             "mem:a",
             SegmentRange{7, 100}};
  reqs[1] = {Direction::kRead, {{back.data(), back.size()}}, "mem:a", SegmentRange{7, 100}};
  reqs[1].proof = Proof::kDeliveredBytes;
  reqs[2] = {Direction::kRead, {{record.data(), record.size()}}, "mem:a", DiskRecord{9, 77, 0xabc}};
  reqs[2].proof = Proof::kDeliveredBytes;
  reqs[3] = {Direction::kWrite, {{notice.data(), notice.size()}}, "mem:a", IndexNotice{}};
  // Our own endpoint is still the local transport's, untouched by the added one.
  std::vector<char> mine(4096);
  reqs[4] = {Direction::kRead, {{mine.data(), mine.size()}}, kSelf, SegmentRange{1, 0}};
  // Submitted in two batches: the write lands before the read.
  auto first = engine->Submit(std::span<const TransferRequest>(reqs.data(), 1));
  ASSERT_TRUE(first[0].status.ok()) << first[0].status;
  auto rest = engine->Submit(std::span<const TransferRequest>(reqs.data() + 1, 4));
  for (const auto& r : rest) ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(back, src);
  EXPECT_EQ(rest[0].checksum, Checksum(src.data(), src.size()));
  EXPECT_EQ(record, "the record's payload");
  EXPECT_EQ(rest[1].checksum, Checksum(record.data(), record.size()));
  ASSERT_EQ(daemons_["mem:a"].notices.size(), 1u);
  EXPECT_EQ(daemons_["mem:a"].notices[0], notice);
  EXPECT_EQ(std::string(mine.data(), mine.size()), std::string(4096, 'o'));
  EXPECT_EQ(transports_[0]->submitted(), 4u);
  EXPECT_EQ(Bytes("mem", "write"), src.size() + notice.size());
  EXPECT_EQ(Bytes("mem", "read"), back.size() + record.size());
  EXPECT_EQ(Bytes("local", "read"), 4096u);
}

TEST_F(TestTransport, TheEngineKeepsItsContractForAnyTransport) {
  std::string buf(4096, 'x');
  TransferRequest read{Direction::kRead, {{buf.data(), buf.size()}}, "mem:a", SegmentRange{7, 0}};
  {
    // A transport that reports OK one byte short is corrected: never a short OK.
    auto engine = Engine({{.short_ok = true}});
    auto r = engine->Submit({&read, 1});
    EXPECT_EQ(ToCode(r[0].status), Code::kTransferFailed) << r[0].status;
  }
  transports_.clear();
  auto engine = Engine({{.unasked_proof = true}});
  // A proof nobody asked for is dropped; one asked for is the transport's.
  auto r = engine->Submit({&read, 1});
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_FALSE(r[0].checksum.has_value());
  // Requests the engine refuses never reach the transport; an empty one is OK without it.
  const size_t before = transports_[0]->submitted();
  std::vector<TransferRequest> refused(3);
  refused[0] = {Direction::kWrite, {{buf.data(), 10}}, "mem:a", DiskRecord{9, 77, 0xabc}};
  refused[1] = {Direction::kRead, {{buf.data(), 10}}, "mem:a", IndexNotice{}};
  refused[2] = {Direction::kRead, {}, "mem:a", SegmentRange{7, 0}};
  auto rr = engine->Submit(refused);
  EXPECT_EQ(ToCode(rr[0].status), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(rr[1].status), Code::kInvalidArgument);
  EXPECT_TRUE(rr[2].status.ok());
  EXPECT_EQ(transports_[0]->submitted(), before);
  // A deadline already passed: the transport's deadline error.
  auto late = engine->Submit({&read, 1}, RealClock::Get().NowMs() - 1);
  EXPECT_EQ(ToCode(late[0].status), Code::kTransferFailed);
  EXPECT_EQ(late[0].status.message(), "deadline");
}

TEST_F(TestTransport, MemoryRegistrationReachesItAndIsUndoneOnFailure) {
  std::vector<char> app(1 << 16);
  {
    auto engine = Engine({{.needs_registration = true}});
    EXPECT_TRUE(engine->NeedsLocalRegistration());
    ASSERT_TRUE(engine->RegisterMemory(app.data(), app.size(), MemoryAccess::kLocal).ok());
    EXPECT_EQ(transports_[0]->registered(), 1u);
    engine->UnregisterMemory(app.data());
    EXPECT_EQ(transports_[0]->registered(), 0u);
  }
  transports_.clear();
  // The second added transport refuses: the first one's registration is undone.
  auto engine = Engine({{}, {.fail_registration = true}});
  EXPECT_FALSE(engine->NeedsLocalRegistration());
  EXPECT_EQ(ToCode(engine->RegisterMemory(app.data(), app.size(), MemoryAccess::kLocal)),
            Code::kUnavailable);
  EXPECT_EQ(transports_[0]->registered(), 0u);
}

}  // namespace
}  // namespace mc::transfer
