// PackedKeysGate (client/session/packed_keys_gate.h): what a master's count of the packed keys it
// read says of it, and packing resting for retry_ms after an older master was met.
#include "client/session/packed_keys_gate.h"

#include <gtest/gtest.h>

#include "tests/fakes/fake_clock.h"

namespace mc::client {
namespace {

using Seen = PackedKeysGate::Seen;

TEST(PackedKeysGate, ACountOfNoneIsAnOlderMasterAndAnyOtherShortCountIsNot) {
  EXPECT_EQ(PackedKeysGate::Classify(5, 5), Seen::kAll);
  EXPECT_EQ(PackedKeysGate::Classify(0, 0), Seen::kAll) << "no keys sent: nothing to miss";
  EXPECT_EQ(PackedKeysGate::Classify(0, 5), Seen::kNone);
  EXPECT_EQ(PackedKeysGate::Classify(1, 5), Seen::kSome);
  EXPECT_EQ(PackedKeysGate::Classify(4, 5), Seen::kSome);
  EXPECT_EQ(PackedKeysGate::Classify(6, 5), Seen::kSome) << "more than sent: not trusted either";
  EXPECT_EQ(PackedKeysGate::Classify(uint64_t{1} << 32, 0), Seen::kSome);
}

TEST(PackedKeysGate, PackingRestsForRetryMsAfterAnOlderMaster) {
  FakeClock clock;
  PackedKeysGate gate(clock, /*retry_ms=*/1000, "tests");
  EXPECT_FALSE(gate.Resting());
  gate.OlderMaster(0, 3, "a test");
  EXPECT_TRUE(gate.Resting());
  clock.AdvanceMs(999);
  EXPECT_TRUE(gate.Resting());
  clock.AdvanceMs(1);
  EXPECT_FALSE(gate.Resting()) << "packing is tried again";
}

}  // namespace
}  // namespace mc::client
