// Index notices: the owner's handler (capabilities checked as for a WRITE, unknown segments
// refused and counted, hostile payloads answered) and the writer's notices (a put tells the
// owner of every replica, local or remote, before PutEnd; a refused notice leaves the put OK).
#include "client/session/index_service.h"

#include "common/checksum.h"
#include "gtest/gtest.h"
#include "tests/fakes/loopback_data_server.h"
#include "tests/unit/client/client_test_util.h"
#include "transfer/data_server.h"

namespace mc::client::testing {
namespace {

using transfer::IndexNoticeEntry;

constexpr int64_t kMasterNow = 5'000'000;

transfer::IndexNoticeEntry Entry(uint64_t segment, uint64_t offset, uint64_t generation) {
  return {.segment_id = segment,
          .offset = offset,
          .length = 100,
          .generation = generation,
          .checksum = 42,
          .key = "key-" + std::to_string(offset)};
}

class IndexHandler : public ::testing::Test {
 protected:
  IndexHandler()
      : index_({1 << 20, 1 << 20}), owner_key_(32, 'o'), verifier_({.clock_skew_ms = 50}, clock_) {
    verifier_.SetKey(owner_key_);
    verifier_.SetMasterClock(kMasterNow, clock_.NowMs());
  }
  SegmentResolver Resolver() {
    return [](uint64_t id) -> std::optional<size_t> {
      if (id == kSegA) return 0;
      if (id == kSegB) return 1;
      return std::nullopt;
    };
  }
  // The grant the master would mint for e's replica (WRITE: bound to e.key, or `granted_key`).
  void Sign(IndexNoticeEntry& e, auth::Right right = auth::Right::kWrite, uint64_t generation = 0,
            const std::string& key = "", const std::string* granted_key = nullptr) {
    const auth::OwnerKey owner(key.empty() ? owner_key_ : key);
    const uint64_t binding =
        right == auth::Right::kWrite
            ? auth::WriteKeyBinding(owner, granted_key != nullptr ? *granted_key : e.key)
            : 0;
    e.capability = auth::MintCapability(
        owner, {right, 0, e.segment_id, e.offset, e.length, generation ? generation : e.generation,
                kMasterNow + 1000, binding});
  }
  // `server` serving INDEX requests with `handler`, whichever transport it has.
  static void StartServing(transfer::DataServer& server, IndexNoticeHandler& handler) {
    ASSERT_TRUE(server
                    .RegisterOpHandler(
                        transfer::DataOp::kIndex,
                        [&handler](const transfer::DataRequest& r, transfer::RequestStream& s) {
                          return handler.Serve(r, s);
                        })
                    .ok());
    ASSERT_TRUE(server.Start().ok());
  }
  uint64_t CounterValue(const std::string& name, const Labels& labels) {
    return metrics_.GetCounter(name, "", labels).Value();
  }

  static constexpr uint64_t kSegA = (uint64_t{9} << 32) | 1;
  static constexpr uint64_t kSegB = (uint64_t{9} << 32) | 2;
  FakeClock clock_{1000};
  MetricsRegistry metrics_;
  ObjectIndex index_;
  std::string owner_key_;
  auth::CapabilityVerifier verifier_;
};

TEST_F(IndexHandler, WithoutAuthRecordsPublishedSegmentsAndRefusesUnknownOnes) {
  IndexNoticeHandler handler(index_, Resolver(), nullptr, metrics_);
  std::vector<IndexNoticeEntry> entries = {Entry(kSegA, 0, 1), Entry(kSegB, 4096, 2),
                                           Entry((uint64_t{8} << 32) | 1, 0, 3)};
  absl::Status s = handler.Apply(entries);
  EXPECT_EQ(ToCode(s), Code::kNotFound) << s;
  EXPECT_EQ(index_.size(), 2u) << "the acceptable entries are recorded";
  EXPECT_EQ(CounterValue(transfer::kUnknownSegmentMetric, {{"op", "index"}}), 1u);
  EXPECT_EQ(CounterValue("mc_client_index_entries_total", {{"result", "recorded"}}), 2u);
  EXPECT_EQ(CounterValue("mc_client_index_entries_total", {{"result", "refused"}}), 1u);
  std::vector<ObjectIndex::Entry> snap = index_.Snapshot();
  EXPECT_EQ(snap[1].local_index, 1u);
  EXPECT_EQ(snap[1].offset, 4096u);
  EXPECT_EQ(snap[1].object.generation, 2u);
  EXPECT_EQ(snap[1].object.size, 100u);
  EXPECT_EQ(snap[1].object.checksum, 42u);
}

TEST_F(IndexHandler, WithAuthNeedsTheReplicasOwnWriteCapability) {
  IndexNoticeHandler handler(index_, Resolver(), &verifier_, metrics_);
  IndexNoticeEntry good = Entry(kSegA, 0, 7);
  Sign(good);
  EXPECT_TRUE(handler.Apply({&good, 1}).ok());
  IndexNoticeEntry none = Entry(kSegA, 512, 7);  // zeros: no capability
  EXPECT_EQ(ToCode(handler.Apply({&none, 1})), Code::kPermissionDenied);
  IndexNoticeEntry read = Entry(kSegA, 1024, 7);
  Sign(read, auth::Right::kRead);
  EXPECT_EQ(ToCode(handler.Apply({&read, 1})), Code::kPermissionDenied);
  IndexNoticeEntry other_generation = Entry(kSegA, 2048, 7);
  Sign(other_generation, auth::Right::kWrite, 8);
  EXPECT_EQ(ToCode(handler.Apply({&other_generation, 1})), Code::kPermissionDenied);
  IndexNoticeEntry forged = Entry(kSegA, 3072, 7);
  Sign(forged, auth::Right::kWrite, 0, std::string(32, 'x'));
  EXPECT_EQ(ToCode(handler.Apply({&forged, 1})), Code::kPermissionDenied);
  IndexNoticeEntry wider = Entry(kSegA, 4096, 7);  // the grant covers 100 bytes, not 200
  Sign(wider);
  wider.length = 200;
  EXPECT_EQ(ToCode(handler.Apply({&wider, 1})), Code::kPermissionDenied);
  IndexNoticeEntry stale = Entry((uint64_t{8} << 32) | 1, 0, 7);  // signed, but not published
  Sign(stale);
  EXPECT_EQ(ToCode(handler.Apply({&stale, 1})), Code::kNotFound);
  EXPECT_EQ(index_.size(), 1u);
}

// A member put its own key K' (the master granted it WRITE on a range
// for K'), wrote its bytes, then told the owner the range held an existing key K with the
// checksum of its bytes; the grant did not name the key, so the owner recorded K -> the member's
// bytes and reported it after the next master restart. The grant now binds the key.
TEST_F(IndexHandler, ANoticeNamingAnotherKeyThanTheGrantIsRefused) {
  IndexNoticeHandler handler(index_, Resolver(), &verifier_, metrics_);
  IndexNoticeEntry own = Entry(kSegA, 0, 7);
  own.key = "attacker-own-key";
  Sign(own);
  IndexNoticeEntry lie = own;  // the same range, generation and grant, another key
  lie.key = "victim-key";
  lie.checksum = 0xbad;
  EXPECT_EQ(ToCode(handler.Apply({&lie, 1})), Code::kPermissionDenied);
  EXPECT_EQ(index_.size(), 0u) << "nothing recorded under the victim's key";
  const std::string victim = "victim-key";
  IndexNoticeEntry also_lie = Entry(kSegA, 512, 7);
  Sign(also_lie, auth::Right::kWrite, 0, "", &victim);  // granted for victim-key ...
  also_lie.key = "victim-key2";                         // ... noticed as another
  EXPECT_EQ(ToCode(handler.Apply({&also_lie, 1})), Code::kPermissionDenied);
  EXPECT_EQ(index_.size(), 0u);
  EXPECT_EQ(metrics_.Sum("mc_data_capability_denied_total", {{"reason", "wrong_key"}}), 2)
      << "each refusal counted under its reason";
  EXPECT_TRUE(handler.Apply({&own, 1}).ok()) << "its own key, as granted, is recorded";
  ASSERT_EQ(index_.size(), 1u);
  EXPECT_EQ(index_.Snapshot()[0].object.key, "attacker-own-key");
}

TEST_F(IndexHandler, ServesFramesAndAnswersHostilePayloads) {
  IndexNoticeHandler handler(index_, Resolver(), nullptr, metrics_);
  transfer::SegmentTable table, local;
  transfer::tcp::TcpDataServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.metrics = &metrics_;
  transfer::tcp::TcpDataServer server(o, table);
  StartServing(server, handler);
  transfer::TransferEngineOptions eo;
  eo.local_endpoint = "127.0.0.1:1";
  eo.transport = "tcp";
  transfer::TransferEngine engine(eo, local);
  auto send = [&](std::string payload) {
    transfer::TransferRequest r{transfer::Direction::kWrite,
                                {{payload.data(), payload.size()}},
                                server.endpoint(),
                                transfer::IndexNotice{}};
    return engine.Submit({&r, 1})[0];
  };
  std::vector<IndexNoticeEntry> entries = {Entry(kSegA, 0, 1), Entry(kSegA, 200, 2)};
  transfer::TransferResult ok = send(*transfer::EncodeIndexNotice(entries));
  EXPECT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(index_.size(), 2u);
  transfer::TransferResult bad = send("garbage that is no notice");
  EXPECT_EQ(ToCode(bad.status), Code::kInvalidArgument) << bad.status;
  std::vector<IndexNoticeEntry> unknown = {Entry(12345, 0, 1)};
  transfer::TransferResult refused = send(*transfer::EncodeIndexNotice(unknown));
  EXPECT_EQ(ToCode(refused.status), Code::kNotFound) << refused.status;
  // The connection survived both refusals.
  EXPECT_EQ(server.malformed_frames(), 0u);
  EXPECT_TRUE(send(*transfer::EncodeIndexNotice(entries)).status.ok());
  server.Stop();
}

// The handler behind a data server without a transport (tests/fakes/loopback_data_server.h): it
// reads its payload only through the transport-neutral stream, consumes all of it and answers
// once, whatever the payload; only a notice above the limit closes the connection, unread.
TEST_F(IndexHandler, ServesRequestsOfAnyDataServer) {
  IndexNoticeHandler handler(index_, Resolver(), nullptr, metrics_);
  transfer::LoopbackDataServer server;
  StartServing(server, handler);
  auto serve = [&](const std::string& payload) {
    return server.Serve({.op = transfer::DataOp::kIndex, .length = payload.size()}, payload);
  };
  std::vector<IndexNoticeEntry> entries = {Entry(kSegA, 0, 1), Entry(kSegB, 200, 2)};
  transfer::LoopbackResponse ok = serve(*transfer::EncodeIndexNotice(entries));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.code, Code::kOk);
  EXPECT_TRUE(ok.payload.empty());
  EXPECT_EQ(index_.size(), 2u);

  transfer::LoopbackResponse garbage = serve("garbage that is no notice");
  ASSERT_TRUE(garbage.status.ok()) << garbage.status;
  EXPECT_EQ(garbage.code, Code::kInvalidArgument);
  std::vector<IndexNoticeEntry> unknown = {Entry(12345, 0, 1)};
  transfer::LoopbackResponse refused = serve(*transfer::EncodeIndexNotice(unknown));
  ASSERT_TRUE(refused.status.ok()) << refused.status;
  EXPECT_EQ(refused.code, Code::kNotFound);
  EXPECT_EQ(CounterValue(transfer::kUnknownSegmentMetric, {{"op", "index"}}), 1u);
  EXPECT_EQ(server.closed_connections(), 0);

  transfer::LoopbackResponse huge = serve(std::string(transfer::kMaxIndexNoticeBytes + 1, 'x'));
  EXPECT_EQ(ToCode(huge.status), Code::kInvalidArgument);
  EXPECT_FALSE(huge.responded);
  EXPECT_EQ(server.closed_connections(), 1);
  EXPECT_EQ(index_.size(), 2u);
}

// A daemon without an index drains the notice and answers NOT_READY (the writer's put goes on).
TEST_F(IndexHandler, WithoutAnIndexDrainsTheNoticeAndAnswersNotReady) {
  transfer::LoopbackDataServer server;
  ASSERT_TRUE(
      server.RegisterOpHandler(transfer::DataOp::kIndex, IndexNoticeHandler::ServeWithoutIndex)
          .ok());
  ASSERT_TRUE(server.Start().ok());
  const std::string notice = *transfer::EncodeIndexNotice(std::vector{Entry(kSegA, 0, 1)});
  transfer::LoopbackResponse out =
      server.Serve({.op = transfer::DataOp::kIndex, .length = notice.size()}, notice);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.code, Code::kNotReady);
  EXPECT_EQ(out.payload_left, 0u);
  const std::string huge(transfer::kMaxIndexNoticeBytes + 1, 'x');
  EXPECT_FALSE(
      server.Serve({.op = transfer::DataOp::kIndex, .length = huge.size()}, huge).status.ok());
}

// The writer's side, against the real master and a remote owner over loopback TCP.
class IndexNotices : public ClientFixture {
 protected:
  void SetUp() override {
    ClientFixture::SetUp();
    local_index_ = std::make_unique<ObjectIndex>(std::vector<uint64_t>{1 << 20, 1 << 20});
    remote_index_ = std::make_unique<ObjectIndex>(std::vector<uint64_t>{1 << 20});
    handler_ = std::make_unique<IndexNoticeHandler>(
        *remote_index_,
        [this](uint64_t id) -> std::optional<size_t> {
          if (refuse_remote_ || remote_ == nullptr) return std::nullopt;
          for (size_t i = 0; i < remote_->ids.size(); ++i) {
            if (remote_->ids[i] == id) return i;
          }
          return std::nullopt;
        },
        nullptr, remote_metrics_);
    transfer::tcp::TcpDataServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.socket_buffers = {.send_bytes = 1 << 20, .receive_bytes = 1 << 20};
    remote_server_ = std::make_unique<transfer::tcp::TcpDataServer>(o, remote_table_);
    ASSERT_TRUE(remote_server_
                    ->RegisterOpHandler(
                        transfer::DataOp::kIndex,
                        [this](const transfer::DataRequest& r, transfer::RequestStream& s) {
                          if (remote_no_index_) {  // as mc-client --object_index=false answers
                            return IndexNoticeHandler::ServeWithoutIndex(r, s);
                          }
                          return handler_->Serve(r, s);
                        })
                    .ok());
    ASSERT_TRUE(remote_server_->Start().ok());
    remote_ = Register("client-b", remote_server_->endpoint(), remote_table_, 1, 1 << 20);
    notifier_ = std::make_unique<IndexNotifier>(
        kLocalEndpoint, local_index_.get(),
        [this](uint64_t id) -> std::optional<size_t> {
          if (refuse_local_) return std::nullopt;
          for (size_t i = 0; i < local_->ids.size(); ++i) {
            if (local_->ids[i] == id) return i;
          }
          return std::nullopt;
        },
        engine_, registry_);
    putter_.SetIndexNotifier(notifier_.get());
  }
  void TearDown() override { remote_server_->Stop(); }

  static const ObjectIndex::Entry* Find(const std::vector<ObjectIndex::Entry>& snap,
                                        const std::string& key) {
    for (const auto& e : snap) {
      if (e.object.key == key) return &e;
    }
    return nullptr;
  }

  std::unique_ptr<ObjectIndex> local_index_;
  std::unique_ptr<ObjectIndex> remote_index_;
  MetricsRegistry remote_metrics_;
  std::unique_ptr<IndexNoticeHandler> handler_;
  std::unique_ptr<IndexNotifier> notifier_;
  std::atomic<bool> refuse_remote_{false};
  std::atomic<bool> refuse_local_{false};
  std::atomic<bool> remote_no_index_{false};
};

TEST_F(IndexNotices, EveryReplicaOwnerLearnsWhatItHolds) {
  const std::string p1 = Payload(5000, 1), p2 = Payload(7000, 2);
  std::vector<absl::Status> s = Put({"obj-1", "obj-2"}, {p1, p2}, /*replicas=*/2);
  ASSERT_TRUE(s[0].ok()) << s[0];
  ASSERT_TRUE(s[1].ok()) << s[1];
  EXPECT_EQ(notifier_->failed_notices(), 0u);
  for (const std::string& key : {std::string("obj-1"), std::string("obj-2")}) {
    const v1::KeyReplicas kr = Lookup(key);
    ASSERT_EQ(kr.replicas_size(), 2);
    for (const auto& rep : kr.replicas()) {
      const bool local = rep.client_id() == kLocalId;
      const std::vector<ObjectIndex::Entry> snap =
          (local ? local_index_ : remote_index_)->Snapshot();
      const ObjectIndex::Entry* e = Find(snap, key);
      ASSERT_NE(e, nullptr) << key << " on " << rep.client_id();
      EXPECT_EQ(e->offset, rep.offset());
      EXPECT_EQ(e->object.generation, kr.generation());
      EXPECT_EQ(e->object.size, kr.size());
      EXPECT_EQ(e->object.checksum, kr.checksum());
      EXPECT_EQ(e->object.checksum, Checksum(key == "obj-1" ? p1 : p2));
      const auto& ids = local ? local_->ids : remote_->ids;
      ASSERT_LT(e->local_index, ids.size());
      EXPECT_EQ(ids[e->local_index], rep.segment_id());
    }
  }
  EXPECT_EQ(
      remote_metrics_.GetCounter("mc_client_index_entries_total", "", {{"result", "recorded"}})
          .Value(),
      2u)
      << "one notice for both objects of the batch";
  EXPECT_EQ(registry_.GetCounter("mc_client_index_notices_sent_total", "").Value(), 1u);
}

TEST_F(IndexNotices, ARefusedNoticeIsCountedAndThePutSucceeds) {
  refuse_remote_ = true;
  const std::string p = Payload(3000, 3);
  std::vector<absl::Status> s = Put({"obj-3"}, {p}, /*replicas=*/2);
  ASSERT_TRUE(s[0].ok()) << s[0];
  EXPECT_EQ(notifier_->failed_notices(), 1u);
  EXPECT_EQ(remote_index_->size(), 0u);
  EXPECT_EQ(local_index_->size(), 1u);
  EXPECT_EQ(Lookup("obj-3").code(), v1::OK);
}

TEST_F(IndexNotices, APutNoOwnerRecordedIsRevokedNotAcknowledged) {
  // Both owners keep an index and both refuse: the bytes are in place, but a master restart
  // would forget the object, so the put must not answer OK.
  refuse_remote_ = true;
  refuse_local_ = true;
  std::vector<absl::Status> s = Put({"obj-5"}, {Payload(3000, 5)}, /*replicas=*/2);
  EXPECT_EQ(ToCode(s[0]), Code::kTransferFailed) << s[0];
  EXPECT_NE(s[0].message().find("master restart"), std::string_view::npos) << s[0];
  EXPECT_EQ(Lookup("obj-5").code(), v1::NOT_FOUND) << "revoked, not COMPLETE";
  EXPECT_EQ(registry_.GetCounter("mc_client_put_index_failed_total", "").Value(), 1u);
  EXPECT_EQ(notifier_->failed_notices(), 2u);
  // The owners record again: the same key puts fine.
  refuse_remote_ = false;
  refuse_local_ = false;
  s = Put({"obj-5"}, {Payload(3000, 6)}, /*replicas=*/2);
  ASSERT_TRUE(s[0].ok()) << s[0];
  EXPECT_EQ(Lookup("obj-5").code(), v1::OK);
}

TEST_F(IndexNotices, AnOwnerWithoutAnIndexIsNotAFailure) {
  remote_no_index_ = true;
  const std::string p = Payload(3000, 7);
  std::vector<absl::Status> s = Put({"obj-6"}, {p}, /*replicas=*/2);
  ASSERT_TRUE(s[0].ok()) << s[0];
  EXPECT_EQ(notifier_->failed_notices(), 0u) << "NOT_READY: that owner keeps no index";
  EXPECT_EQ(local_index_->size(), 1u);
  // Directly: a replica on that owner alone is kNoIndex, not kFailed.
  const std::string key = "obj-7";
  const WrittenReplica only_remote{.key = key,
                                   .generation = 1,
                                   .size = 100,
                                   .checksum = 1,
                                   .endpoint = remote_server_->endpoint(),
                                   .segment_id = remote_->ids[0],
                                   .offset = 0,
                                   .capability = {}};
  const std::vector<IndexNotifier::Outcome> out =
      notifier_->Notify(std::span<const WrittenReplica>(&only_remote, 1), 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], IndexNotifier::Outcome::kNoIndex);
  // And a refused one is kFailed.
  remote_no_index_ = false;
  refuse_remote_ = true;
  EXPECT_EQ(notifier_->Notify(std::span<const WrittenReplica>(&only_remote, 1), 0)[0],
            IndexNotifier::Outcome::kFailed);
}

TEST_F(IndexNotices, AFailedWriteSendsNoNotice) {
  // The remote owner's segment disappears: the replica write fails, the item is revoked.
  remote_table_.Clear();
  std::vector<absl::Status> s = Put({"obj-4"}, {Payload(3000, 4)}, /*replicas=*/2);
  EXPECT_FALSE(s[0].ok());
  EXPECT_EQ(local_index_->size(), 0u);
  EXPECT_EQ(remote_index_->size(), 0u);
  EXPECT_EQ(registry_.GetCounter("mc_client_index_notices_sent_total", "").Value(), 0u);
}

}  // namespace
}  // namespace mc::client::testing
