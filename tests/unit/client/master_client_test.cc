// The gRPC MasterClient against a real mc-master served in-process on loopback: releases sent
// without waiting (ReleaseLeasesAsync) complete, and this client's own Remove and PutStart wait
// for the releases sent before them.
#include "client/master_client.h"

#include <atomic>
#include <memory>

#include "common/logging.h"
#include "gtest/gtest.h"
#include "master/master_server.h"

namespace mc::client {
namespace {

class GrpcMasterClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel("warn");
    master::MasterServerOptions opts;
    opts.listen = "127.0.0.1:0";
    opts.http = "";
    server_ = std::make_unique<master::MasterServer>(opts);
    ASSERT_TRUE(server_->Start().ok());
    client_ = CreateGrpcMasterClient({server_->grpc_address(), 10'000, 64 << 20});
    v1::RegisterClientRequest reg;
    reg.set_client_id("c1");
    reg.set_data_endpoint("127.0.0.1:1");
    reg.add_segments()->set_size(1 << 20);
    v1::RegisterClientResponse reg_resp;
    ASSERT_TRUE(client_->RegisterClient(reg, &reg_resp).ok());
  }

  void Put(const std::string& key) {
    v1::PutStartRequest start;
    start.set_client_id("c1");
    auto* item = start.add_items();
    item->set_key(key);
    item->set_size(100);
    v1::PutStartResponse started;
    ASSERT_TRUE(client_->PutStart(start, &started).ok());
    ASSERT_EQ(started.results(0).code(), v1::OK) << started.results(0).message();
    v1::PutEndRequest end;
    end.set_client_id("c1");
    auto* e = end.add_items();
    e->set_key(key);
    e->set_generation(started.results(0).generation());
    e->set_checksum(7);
    v1::PutEndResponse ended;
    ASSERT_TRUE(client_->PutEnd(end, &ended).ok());
    ASSERT_EQ(ended.results(0).code(), v1::OK);
  }

  // Leases `key` and returns the release request for it.
  v1::ReleaseLeasesRequest Lease(const std::string& key) {
    v1::GetReplicasRequest get;
    get.set_client_id("c1");
    get.add_keys(key);
    v1::GetReplicasResponse got;
    EXPECT_TRUE(client_->GetReplicas(get, &got).ok());
    EXPECT_EQ(got.results(0).code(), v1::OK);
    v1::ReleaseLeasesRequest rel;
    rel.set_lease_id(got.lease_id());
    rel.add_keys(key);
    return rel;
  }

  std::unique_ptr<master::MasterServer> server_;
  std::unique_ptr<MasterClient> client_;
};

TEST_F(GrpcMasterClientTest, RemoveWaitsForTheReleasesSentBeforeIt) {
  for (int round = 0; round < 20; ++round) {
    const std::string key = "k" + std::to_string(round);
    Put(key);
    auto done = std::make_shared<std::atomic<int>>(0);
    client_->ReleaseLeasesAsync(Lease(key), [done](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      done->fetch_add(1);
    });
    v1::RemoveRequest rm;
    rm.add_keys(key);
    v1::RemoveResponse removed;
    ASSERT_TRUE(client_->Remove(rm, &removed).ok());
    EXPECT_EQ(done->load(), 1) << "Remove returned before the release it follows completed";
    EXPECT_EQ(removed.results(0).code(), v1::OK) << removed.results(0).message();
  }
}

TEST_F(GrpcMasterClientTest, DestroyingTheClientWaitsForReleasesInFlight) {
  Put("k");
  auto done = std::make_shared<std::atomic<int>>(0);
  client_->ReleaseLeasesAsync(Lease("k"), [done](absl::Status) { done->fetch_add(1); });
  client_.reset();
  EXPECT_EQ(done->load(), 1);
}

TEST_F(GrpcMasterClientTest, ReleaseToAStoppedMasterReportsAnErrorNotAHang) {
  Put("k");
  v1::ReleaseLeasesRequest rel = Lease("k");
  server_->Shutdown();
  auto status = std::make_shared<absl::Status>();
  auto done = std::make_shared<std::atomic<int>>(0);
  client_->ReleaseLeasesAsync(rel, [status, done](absl::Status s) {
    *status = s;
    done->fetch_add(1);
  });
  client_.reset();  // waits for the answer (an error, within the RPC deadline)
  EXPECT_EQ(done->load(), 1);
  EXPECT_FALSE(status->ok());
}

}  // namespace
}  // namespace mc::client
