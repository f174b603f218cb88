// Promoter: only bytes that still hash to the recorded checksum when staged are promoted; the
// get's destination belongs to the application, which may already be writing into it.
#include "client/batch/promoter.h"

#include "common/checksum.h"
#include "tests/unit/client/client_test_util.h"

namespace mc::client {
namespace {

using testing::ClientFixture;
using testing::Payload;

class PromoterTest : public ClientFixture {
 protected:
  PromoterTest() : promoter_(testing::kLocalId, master_, engine_, clock_, registry_) {}
  uint64_t Failed() {
    return registry_.GetCounter("mc_client_promotions_total", "", {{"result", "failed"}}).Value();
  }
  Promoter promoter_;
};

TEST_F(PromoterTest, BytesChangedAfterTheGetAreNotPromoted) {
  std::string payload = Payload(100'000, 1);
  PutOk("k", payload);
  v1::KeyReplicas kr = Lookup("k");
  const uint64_t sum = Checksum(payload.data(), payload.size());
  ASSERT_EQ(kr.checksum(), sum);
  std::string changed = payload;
  changed[5000] ^= 0x40;  // the application wrote into its buffer after the get verified it
  Promoter::Item item{"k", kr.generation(), sum, {LocalBuffer{changed.data(), changed.size()}}};
  EXPECT_EQ(promoter_.Promote({item}), 0u);
  EXPECT_EQ(master_.Calls(FakeMasterClient::Rpc::kPromoteStart), 0)
      << "changed bytes must not even be offered to the master";
  EXPECT_EQ(Failed(), 1u);
}

TEST_F(PromoterTest, UnchangedBytesAreOfferedToTheMaster) {
  std::string payload = Payload(100'000, 2);
  PutOk("k", payload);
  v1::KeyReplicas kr = Lookup("k");
  // Two pieces, as a sliced destination would be.
  Promoter::Item item{"k",
                      kr.generation(),
                      kr.checksum(),
                      {LocalBuffer{payload.data(), 40'000},
                       LocalBuffer{payload.data() + 40'000, payload.size() - 40'000}}};
  // The object is still in memory, so the master declines; what matters is that it was asked.
  EXPECT_EQ(promoter_.Promote({item}), 0u);
  EXPECT_EQ(master_.Calls(FakeMasterClient::Rpc::kPromoteStart), 1);
}

TEST_F(PromoterTest, StagingIsBoundedPerRound) {
  // 3 items of 600 bytes with 1000 bytes of staging: one item per round, three rounds.
  Promoter small(testing::kLocalId, master_, engine_, clock_, registry_, /*staging_bytes=*/1000);
  std::string payload(600, 'x');
  const uint64_t sum = Checksum(payload.data(), payload.size());
  std::vector<Promoter::Item> items;
  for (const char* k : {"a", "b", "c"}) {
    items.push_back({k, 1, sum, {LocalBuffer{payload.data(), payload.size()}}});
  }
  EXPECT_EQ(small.Promote(items), 0u);  // unknown keys: declined
  EXPECT_EQ(master_.Calls(FakeMasterClient::Rpc::kPromoteStart), 3);
  // The default bound takes all three in one round.
  EXPECT_EQ(promoter_.Promote(items), 0u);
  EXPECT_EQ(master_.Calls(FakeMasterClient::Rpc::kPromoteStart), 4);
}

}  // namespace
}  // namespace mc::client
