// Packed lease-release keys: the releases a lookup carries name their keys packed
// (ReleaseLeasesRequest.packed_keys) and end their leases at a real mc-master, which counts them
// in releases_seen; the master reads packed keys in ReleaseLeases too and refuses malformed
// ones. A master that does not read packed release keys (played by a proxy that strips them and
// answers no releases_seen, as such a master would) gets the releases again one by one, and the
// client names release keys one by one for a while. Every lease is counted back to zero.
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "client/session/master_client.h"
#include "common/logging.h"
#include "gtest/gtest.h"
#include "master/master_server.h"
#include "proto/packed_lookups.h"
#include "tests/fakes/await.h"
#include "tests/unit/client/session/master_client_test_util.h"

namespace mc::client {
namespace {

// A Master service in front of the real one, for the calls these tests make. With `older` it
// plays a master that knows carried releases but not their packed keys: it forwards the
// releases without packed keys and answers without releases_seen. It offers no lane, so every
// call comes through it.
class ReleaseProxy final : public v1::Master::Service {
 public:
  explicit ReleaseProxy(const std::string& master)
      : stub_(
            v1::Master::NewStub(grpc::CreateChannel(master, grpc::InsecureChannelCredentials()))) {}

  std::atomic<bool> older{false};
  std::atomic<int> packed_releases{0};  // carried releases that came packed
  std::atomic<int> plain_releases{0};   // carried releases that named keys one by one
  std::atomic<int> packed_alone{0};     // ReleaseLeases calls that came packed
  std::atomic<int> plain_alone{0};      // ReleaseLeases calls that named keys one by one

  grpc::Status RegisterClient(grpc::ServerContext*, const v1::RegisterClientRequest* req,
                              v1::RegisterClientResponse* resp) override {
    grpc::Status s = Forward(&v1::Master::Stub::RegisterClient, *req, resp);
    resp->set_lane_port(0);
    return s;
  }
  grpc::Status PutStart(grpc::ServerContext*, const v1::PutStartRequest* req,
                        v1::PutStartResponse* resp) override {
    return Forward(&v1::Master::Stub::PutStart, *req, resp);
  }
  grpc::Status PutEnd(grpc::ServerContext*, const v1::PutEndRequest* req,
                      v1::PutEndResponse* resp) override {
    return Forward(&v1::Master::Stub::PutEnd, *req, resp);
  }
  grpc::Status ReleaseLeases(grpc::ServerContext*, const v1::ReleaseLeasesRequest* req,
                             v1::ReleaseLeasesResponse* resp) override {
    v1::ReleaseLeasesRequest forwarded = *req;
    (req->packed_key_sizes_size() != 0 ? packed_alone : plain_alone)++;
    if (older) {
      forwarded.clear_packed_keys();
      forwarded.clear_packed_key_sizes();
    }
    grpc::Status s = Forward(&v1::Master::Stub::ReleaseLeases, forwarded, resp);
    if (older) resp->clear_keys_seen();
    return s;
  }
  grpc::Status GetReplicas(grpc::ServerContext*, const v1::GetReplicasRequest* req,
                           v1::GetReplicasResponse* resp) override {
    v1::GetReplicasRequest forwarded = *req;
    for (v1::ReleaseLeasesRequest& release : *forwarded.mutable_releases()) {
      (release.packed_key_sizes_size() != 0 ? packed_releases : plain_releases)++;
      if (older) {
        release.clear_packed_keys();
        release.clear_packed_key_sizes();
      }
    }
    grpc::Status s = Forward(&v1::Master::Stub::GetReplicas, forwarded, resp);
    if (older) resp->clear_releases_seen();
    return s;
  }

 private:
  template <typename Req, typename Resp>
  grpc::Status Forward(grpc::Status (v1::Master::Stub::*call)(grpc::ClientContext*, const Req&,
                                                              Resp*),
                       const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    return (stub_.get()->*call)(&ctx, req, resp);
  }

  std::unique_ptr<v1::Master::Stub> stub_;
};

class PackedReleases : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel("error");
    server_ = testing::StartTestMaster();
    proxy_ = std::make_unique<ReleaseProxy>(server_->grpc_address());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(proxy_.get());
    proxy_server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    client_ = CreateGrpcMasterClient({.address = "127.0.0.1:" + std::to_string(port),
                                      .rpc_timeout_ms = 10'000,
                                      .max_message_bytes = 64 << 20,
                                      .release_delay_us = 60'000'000,  // only lookups carry them
                                      .packed_release_retry_ms = 60'000});
    testing::RegisterTestClient(*client_);
    for (const char* key : {"a", "b", "c"}) testing::PutTestKey(*client_, key);
  }
  void TearDown() override {
    client_.reset();
    proxy_server_->Shutdown();
    server_->Shutdown();
  }

  v1::ReleaseLeasesRequest Lease(const std::vector<std::string>& keys) {
    return testing::LeaseTestKeys(*client_, keys);
  }
  // Queues `release`; the counter goes up once it is answered OK.
  std::shared_ptr<EventCounter> Queue(v1::ReleaseLeasesRequest release) {
    auto done = std::make_shared<EventCounter>();
    client_->ReleaseLeasesAsync(std::move(release), [done](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      done->Add();
    });
    return done;
  }
  std::shared_ptr<EventCounter> LeaseAndQueueRelease(const std::vector<std::string>& keys) {
    return Queue(Lease(keys));
  }
  size_t ActiveLeases() { return server_->service().ActiveLeaseCount(); }

  std::unique_ptr<master::MasterServer> server_;
  std::unique_ptr<ReleaseProxy> proxy_;
  std::unique_ptr<grpc::Server> proxy_server_;
  std::unique_ptr<MasterClient> client_;
};

TEST_F(PackedReleases, CarriedReleasesTravelPackedAndEndTheirLeases) {
  auto first = LeaseAndQueueRelease({"a", "b"});
  auto second = LeaseAndQueueRelease({"c"});  // carries the release of a and b
  EXPECT_EQ(first->value(), 1);
  EXPECT_EQ(proxy_->packed_releases.load(), 1);
  EXPECT_EQ(proxy_->plain_releases.load(), 0);
  EXPECT_EQ(ActiveLeases(), 1u) << "a and b released, c held";
  auto third = LeaseAndQueueRelease({"a"});  // carries c's
  EXPECT_EQ(second->value(), 1);
  EXPECT_EQ(proxy_->packed_releases.load(), 2);
  v1::ReleaseLeasesRequest none;  // an explicit release first ends the queued one (a's)
  ASSERT_TRUE(client_->ReleaseLeases(none).ok());
  EXPECT_TRUE(third->AwaitAtLeast(1));
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(PackedReleases, AMasterThatDoesNotReadThemGetsThemAgainOneByOne) {
  proxy_->older = true;
  auto first = LeaseAndQueueRelease({"a", "b"});
  v1::ReleaseLeasesRequest c = Lease({"c"});  // carries a and b packed: the master sees none
  EXPECT_EQ(proxy_->packed_releases.load(), 1);
  // Queued again one by one and sent at once, alone.
  EXPECT_TRUE(first->AwaitAtLeast(1));
  EXPECT_EQ(ActiveLeases(), 1u) << "a and b released after all, c held";
  // Packing rests: the next lookup carries c's release with its keys one by one.
  auto second = Queue(c);
  v1::ReleaseLeasesRequest a = Lease({"a"});
  EXPECT_EQ(second->value(), 1);
  EXPECT_EQ(proxy_->packed_releases.load(), 1);
  EXPECT_EQ(proxy_->plain_releases.load(), 1);
  ASSERT_TRUE(client_->ReleaseLeases(a).ok());
  EXPECT_EQ(ActiveLeases(), 0u) << "no lease left to its TTL";
}

// The master's side, called directly: ReleaseLeases reads packed keys and counts them; keys
// named both ways or cut wrong are refused; a malformed carried release is skipped and left out
// of releases_seen (the caller sees the difference).
TEST_F(PackedReleases, TheMasterReadsPackedKeysAndRefusesMalformedOnes) {
  auto stub = v1::Master::NewStub(
      grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials()));
  auto lease = [&](const std::vector<std::string>& keys) {
    v1::GetReplicasRequest get;
    get.set_client_id("c1");
    for (const auto& k : keys) get.add_keys(k);
    v1::GetReplicasResponse got;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->GetReplicas(&ctx, get, &got).ok());
    v1::ReleaseLeasesRequest release;
    release.set_lease_id(got.lease_id());
    for (const auto& k : keys)
      AppendPackedKey(k, release.mutable_packed_keys(), release.mutable_packed_key_sizes());
    return release;
  };
  v1::ReleaseLeasesRequest good = lease({"a", "b"});
  v1::ReleaseLeasesRequest both = good;
  both.add_keys("a");
  v1::ReleaseLeasesRequest cut = good;
  cut.add_packed_key_sizes(1);
  for (const auto* bad : {&both, &cut}) {
    v1::ReleaseLeasesResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->ReleaseLeases(&ctx, *bad, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(ActiveLeases(), 2u) << "a refused release ends nothing";
  {
    v1::ReleaseLeasesResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->ReleaseLeases(&ctx, good, &resp).ok());
    EXPECT_EQ(resp.keys_seen(), 2u);
    EXPECT_EQ(resp.released(), 2u);
  }
  EXPECT_EQ(ActiveLeases(), 0u);

  v1::ReleaseLeasesRequest carried = lease({"a", "b"});
  v1::ReleaseLeasesRequest malformed = lease({"c"});
  malformed.add_keys("c");  // both ways: skipped
  v1::GetReplicasRequest get;
  get.set_client_id("c1");
  get.set_no_lease(true);
  get.add_keys("a");
  *get.add_releases() = carried;
  *get.add_releases() = malformed;
  v1::GetReplicasResponse got;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->GetReplicas(&ctx, get, &got).ok());
  EXPECT_EQ(got.releases_seen(), 2u) << "the malformed release counts none";
  EXPECT_EQ(ActiveLeases(), 1u) << "c's lease stays (to its TTL): its release was malformed";
}

// A ReleaseLeases whose keys came packed (an application's MatchPrefix lease) goes packed and
// ends its leases; to a master that does not read packed keys it goes again one by one, and the
// next goes one by one at once.
TEST_F(PackedReleases, AReleaseSentPackedGoesAgainOneByOneToAMasterThatDoesNotReadThem) {
  auto packed_lease = [&](const std::vector<std::string>& keys) {
    v1::ReleaseLeasesRequest release = Lease(keys);
    PackRequestKeys(&release);
    return release;
  };
  ASSERT_TRUE(client_->ReleaseLeases(packed_lease({"a", "b"})).ok());
  EXPECT_EQ(ActiveLeases(), 0u);
  EXPECT_EQ(proxy_->packed_alone.load(), 1);
  EXPECT_EQ(proxy_->plain_alone.load(), 0);
  proxy_->older = true;
  ASSERT_TRUE(client_->ReleaseLeases(packed_lease({"a", "b", "c"})).ok());
  EXPECT_EQ(ActiveLeases(), 0u) << "sent again one by one";
  EXPECT_EQ(proxy_->packed_alone.load(), 2);
  EXPECT_EQ(proxy_->plain_alone.load(), 1);
  ASSERT_TRUE(client_->ReleaseLeases(packed_lease({"c"})).ok());
  EXPECT_EQ(ActiveLeases(), 0u);
  EXPECT_EQ(proxy_->packed_alone.load(), 2) << "packing rests: one by one at once";
  EXPECT_EQ(proxy_->plain_alone.load(), 2);
}

}  // namespace
}  // namespace mc::client
