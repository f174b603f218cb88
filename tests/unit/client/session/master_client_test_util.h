// What the gRPC MasterClient tests share: a real mc-master in-process, and the calls they make to
// it as client "c1": register, put a key (PutStart + PutEnd of 100 bytes), lease keys in one
// lookup. Failures are gtest failures.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "client/session/master_client.h"
#include "gtest/gtest.h"
#include "master/master_server.h"

namespace mc::client::testing {

inline constexpr char kTestClientId[] = "c1";

// An mc-master on a free loopback port, without authentication or HTTP endpoint.
inline std::unique_ptr<master::MasterServer> StartTestMaster() {
  master::MasterServerOptions opts;
  opts.listen = "127.0.0.1:0";
  opts.http = "";
  auto server = std::make_unique<master::MasterServer>(opts);
  EXPECT_TRUE(server->Start().ok());
  return server;
}

// Registers "c1" with one 1 MiB segment (a second registration replaces the first session).
inline void RegisterTestClient(MasterClient& client) {
  v1::RegisterClientRequest reg;
  reg.set_client_id(kTestClientId);
  reg.set_data_endpoint("127.0.0.1:1");
  reg.add_segments()->set_size(1 << 20);
  v1::RegisterClientResponse reg_resp;
  ASSERT_TRUE(client.RegisterClient(reg, &reg_resp).ok());
}

// Stores `key` (100 bytes, checksum 7) as "c1".
inline void PutTestKey(MasterClient& client, const std::string& key) {
  v1::PutStartRequest start;
  start.set_client_id(kTestClientId);
  auto* item = start.add_items();
  item->set_key(key);
  item->set_size(100);
  v1::PutStartResponse started;
  ASSERT_TRUE(client.PutStart(start, &started).ok());
  ASSERT_EQ(started.results(0).code(), v1::OK) << started.results(0).message();
  v1::PutEndRequest end;
  end.set_client_id(kTestClientId);
  auto* e = end.add_items();
  e->set_key(key);
  e->set_generation(started.results(0).generation());
  e->set_checksum(7);
  v1::PutEndResponse ended;
  ASSERT_TRUE(client.PutEnd(end, &ended).ok());
  ASSERT_EQ(ended.results(0).code(), v1::OK);
}

// Leases `keys` in one lookup as "c1" (it carries whatever releases are queued) and returns
// their release, the keys named one by one as BatchGet names them.
inline v1::ReleaseLeasesRequest LeaseTestKeys(MasterClient& client,
                                              const std::vector<std::string>& keys) {
  v1::GetReplicasRequest get;
  get.set_client_id(kTestClientId);
  for (const auto& k : keys) get.add_keys(k);
  v1::GetReplicasResponse got;
  EXPECT_TRUE(client.GetReplicas(get, &got).ok());
  for (int i = 0; i < got.results_size(); ++i) EXPECT_EQ(got.results(i).code(), v1::OK) << i;
  v1::ReleaseLeasesRequest release;
  release.set_lease_id(got.lease_id());
  for (const auto& k : keys) release.add_keys(k);
  return release;
}

}  // namespace mc::client::testing
