// Capabilities: the MAC, the codec, owner keys and their wrapping, and the owner's checks
// (range, op, expiry against the master's clock, malformed bytes).
#include "common/capability.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tests/fakes/fake_clock.h"

namespace mc::auth {
namespace {

std::string KeyBytes(char c) { return std::string(kOwnerKeySize, c); }

TEST(OwnerKey, EqualsOpenSslHmac) {
  for (const std::string& key : {KeyBytes('k'), std::string(100, 'x'), std::string("short")}) {
    for (const std::string& msg : {std::string(), std::string(48, 'm'), std::string(1000, 'z')}) {
      EXPECT_EQ(OwnerKey(key).Sign(msg), HmacSha256(key, msg));
    }
  }
}

TEST(OwnerKey, DerivedPerClientAndSession) {
  const std::string root = KeyBytes('r');
  EXPECT_NE(DeriveOwnerKey(root, "a", 1), DeriveOwnerKey(root, "b", 1));
  EXPECT_NE(DeriveOwnerKey(root, "a", 1), DeriveOwnerKey(root, "a", 2));
  EXPECT_NE(DeriveOwnerKey(root, "a", 1), DeriveOwnerKey(KeyBytes('s'), "a", 1));
  EXPECT_EQ(DeriveOwnerKey(root, "a", 1).size(), kOwnerKeySize);
}

TEST(WrapOwnerKey, OpensOnlyForTheClientItWasSealedFor) {
  auto keys = *ClusterKeys::FromSecrets({std::string(40, 'a')});
  auto other = *ClusterKeys::FromSecrets({std::string(40, 'b')});
  const std::string key = KeyBytes('q');
  const std::string sealed = WrapOwnerKey(*keys, "c1", key);
  EXPECT_EQ(sealed.find(key), std::string::npos);
  EXPECT_EQ(*UnwrapOwnerKey(*keys, "c1", sealed), key);
  EXPECT_FALSE(UnwrapOwnerKey(*keys, "c2", sealed).ok());
  EXPECT_FALSE(UnwrapOwnerKey(*other, "c1", sealed).ok());
  std::string flipped = sealed;
  flipped[20] ^= 1;
  EXPECT_FALSE(UnwrapOwnerKey(*keys, "c1", flipped).ok());
  EXPECT_FALSE(UnwrapOwnerKey(*keys, "c1", sealed.substr(1)).ok());
  // Rotation: a receiver holding the sender's secret second still opens it.
  auto rotated = *ClusterKeys::FromSecrets({std::string(40, 'n'), std::string(40, 'a')});
  EXPECT_EQ(*UnwrapOwnerKey(*rotated, "c1", sealed), key);
}

TEST(Capability, RoundTripsAndRejectsMalformedBytes) {
  OwnerKey key(KeyBytes('k'));
  Capability cap{Right::kWrite, 0, 7, 4096, 100, 42, 123456, 0xba9876543210};
  CapabilityBytes bytes = MintCapability(key, cap);
  auto back = DecodeCapability(bytes.data(), bytes.size());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->right, Right::kWrite);
  EXPECT_EQ(back->key_binding, 0xba9876543210u) << "a WRITE grant carries its key binding";
  EXPECT_EQ(back->key_tag, 0u);
  EXPECT_EQ(back->segment_id, 7u);
  EXPECT_EQ(back->offset, 4096u);
  EXPECT_EQ(back->length, 100u);
  EXPECT_EQ(back->generation, 42u);
  EXPECT_EQ(back->expiry_ms, 123456);
  EXPECT_TRUE(CapabilityMacValid(key, bytes.data()));
  EXPECT_FALSE(CapabilityMacValid(OwnerKey(KeyBytes('o')), bytes.data()));
  EXPECT_FALSE(DecodeCapability(bytes.data(), bytes.size() - 1).ok());
  CapabilityBytes bad = bytes;
  bad[0] = 9;  // version
  EXPECT_FALSE(DecodeCapability(bad.data(), bad.size()).ok());
  bad = bytes;
  bad[1] = 3;  // two rights at once
  EXPECT_FALSE(DecodeCapability(bad.data(), bad.size()).ok());
  bad = MintCapability(key, {Right::kRead, 0, 7, 4096, 100, 42, 123456});
  ASSERT_TRUE(DecodeCapability(bad.data(), bad.size()).ok());
  bad[2] = 1;  // reserved (bits of the key binding on WRITE grants only)
  EXPECT_FALSE(DecodeCapability(bad.data(), bad.size()).ok());
  cap.offset = UINT64_MAX - 10;  // offset + length wraps
  bad = MintCapability(key, cap);
  EXPECT_FALSE(DecodeCapability(bad.data(), bad.size()).ok());
}

TEST(Capability, TheWriteKeyBindingIsKeyedAndDistinguishesKeys) {
  OwnerKey key(KeyBytes('k'));
  const uint64_t a = WriteKeyBinding(key, "key-a");
  EXPECT_EQ(a, WriteKeyBinding(key, "key-a"));
  EXPECT_EQ(a & ~kKeyBindingMask, 0u) << "48 bits";
  EXPECT_NE(a, WriteKeyBinding(key, "key-b"));
  EXPECT_NE(a, WriteKeyBinding(OwnerKey(KeyBytes('o')), "key-a")) << "keyed by the owner key";
}

class Verifier : public ::testing::Test {
 protected:
  Verifier() : verifier_({.clock_skew_ms = 100}, clock_) {
    verifier_.SetKey(KeyBytes('k'));
    verifier_.SetMasterClock(/*master_ms=*/1'000'000, /*sent_ms=*/clock_.NowMs());
  }
  CapabilityBytes Mint(Capability cap) { return MintCapability(OwnerKey(KeyBytes('k')), cap); }
  Denial Check(const CapabilityBytes& b, FrameAccess a) { return verifier_.Check(b.data(), a); }

  FakeClock clock_;
  CapabilityVerifier verifier_;
};

TEST_F(Verifier, GrantsExactlyTheRangeAndOp) {
  const auto cap = Mint({Right::kRead, 0, 7, 1000, 500, 1, 1'005'000});
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 1000, 500}), Denial::kNone);
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 1200, 300}), Denial::kNone);  // a frame of it
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 1499, 1}), Denial::kNone);
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 1000, 0}), Denial::kNone);
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 999, 10}), Denial::kOutOfRange);
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 1400, 101}), Denial::kOutOfRange);
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 0, 64 << 20}), Denial::kOutOfRange);    // whole segment
  EXPECT_EQ(Check(cap, {Right::kRead, 7, UINT64_MAX, 2}), Denial::kOutOfRange);  // wraps
  EXPECT_EQ(Check(cap, {Right::kRead, 8, 1000, 500}), Denial::kOutOfRange);      // other segment
  EXPECT_EQ(Check(cap, {Right::kWrite, 7, 1000, 500}), Denial::kWrongOp);
}

TEST_F(Verifier, ForgedOrForeignMacIsRefused) {
  auto cap = Mint({Right::kRead, 0, 7, 0, 100, 1, 1'005'000});
  CapabilityBytes widened = cap;
  widened[24] = 0xff;  // length 255: the MAC no longer matches
  EXPECT_EQ(Check(widened, {Right::kRead, 7, 0, 200}), Denial::kBadMac);
  // Minted under another owner's key (what a member could do with its own key).
  auto foreign =
      MintCapability(OwnerKey(KeyBytes('o')), {Right::kRead, 0, 7, 0, 100, 1, 1'005'000});
  EXPECT_EQ(Check(foreign, {Right::kRead, 7, 0, 100}), Denial::kBadMac);
  CapabilityBytes zeros{};
  EXPECT_EQ(Check(zeros, {Right::kRead, 7, 0, 100}), Denial::kMalformed);
}

TEST_F(Verifier, ExpiresOnTheMastersClockPlusTheSkewAllowance) {
  const auto cap = Mint({Right::kRead, 0, 7, 0, 100, 1, 1'000'500});
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 0, 100}), Denial::kNone);
  clock_.AdvanceMs(600);  // master now 1'000'600: past expiry, within the 100 ms allowance
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 0, 100}), Denial::kNone);
  clock_.AdvanceMs(1);
  EXPECT_EQ(Check(cap, {Right::kRead, 7, 0, 100}), Denial::kExpired);
}

TEST_F(Verifier, ANewKeyVoidsCapabilitiesOfTheOldAndTheCache) {
  const auto cap = Mint({Right::kRead, 0, 7, 0, 100, 1, 1'005'000});
  CapabilityVerifier::Cache cache;
  EXPECT_EQ(verifier_.Check(cap.data(), {Right::kRead, 7, 0, 100}, &cache), Denial::kNone);
  EXPECT_EQ(verifier_.Check(cap.data(), {Right::kRead, 7, 0, 100}, &cache), Denial::kNone);
  verifier_.SetKey(KeyBytes('n'));  // re-registered
  EXPECT_EQ(verifier_.Check(cap.data(), {Right::kRead, 7, 0, 100}, &cache), Denial::kBadMac);
  verifier_.SetKey("");
  EXPECT_EQ(verifier_.Check(cap.data(), {Right::kRead, 7, 0, 100}, &cache), Denial::kNoKey);
}

TEST_F(Verifier, ReadDiskNamesExactlyOneRecord) {
  const auto cap =
      Mint({Right::kReadDisk, 0xabc, /*generation=*/9, /*locator=*/77, 4096, 9, 1'005'000});
  EXPECT_EQ(Check(cap, {Right::kReadDisk, 9, 77, 4096, 0xabc}), Denial::kNone);
  EXPECT_EQ(Check(cap, {Right::kReadDisk, 9, 78, 4096, 0xabc}), Denial::kOutOfRange);
  EXPECT_EQ(Check(cap, {Right::kReadDisk, 9, 77, 4096, 0xabd}), Denial::kOutOfRange);
  EXPECT_EQ(Check(cap, {Right::kReadDisk, 9, 77, 4095, 0xabc}), Denial::kOutOfRange);
  EXPECT_EQ(Check(cap, {Right::kRead, 9, 77, 4096}), Denial::kWrongOp);
}

}  // namespace
}  // namespace mc::auth
