// Capabilities: the master's grant to touch exactly one object's bytes on one owner's data
// plane (docs/security.md). A capability names the rights (READ, WRITE or READ_DISK), the
// range (segment_id, offset, length; for READ_DISK the generation, record locator, length and
// key tag), the object's generation and an expiry in the MASTER's monotonic clock, followed by a
// 16-byte truncated HMAC-SHA256 under the OWNER's key.
//
// Key hierarchy: mc-master draws a random root key per run; an owner's key is
// HMAC-SHA256(root, "mcstore/v1/capability-owner" || client_id || session), handed to that
// owner alone at RegisterClient (wrapped under the cluster secret's kCapability key, so a
// passive observer of the unencrypted master channel does not learn it). Only the master and
// the owner can mint or verify a capability for the owner's memory; another member that holds
// the cluster secret cannot forge one.
//
// Wire form (kCapabilitySize bytes, little-endian):
//   0  u8  version (kCapabilityVersion)     1  u8  rights (one Right)
//   2  u16 WRITE: key binding bits 32..47; else 0
//   4  u32 READ_DISK: key_tag; WRITE: key binding bits 0..31; else 0
//   8  u64 segment_id (READ_DISK: generation)
//  16  u64 offset (READ_DISK: locator)     24  u64 length
//  32  u64 generation                      40  i64 expiry_ms (master clock)
//  48  16  MAC = HMAC-SHA256(owner key, bytes [0, 48)) truncated to 16 bytes
//
// Key binding (WRITE only): the 48 low bits of HMAC-SHA256(owner key, "mcstore/v1/write-key\n"
// || object key), WriteKeyBinding below. WRITE frames ignore it (they name no key); an INDEX
// notice entry must name the key the grant was minted for (CapabilityVerifier::CheckIndexEntry),
// so a member cannot tell an owner that the bytes it wrote under its own key are another key's.
// Keyed with the owner key, which members do not know: finding another key
// with the same binding takes ~2^47 PutStarts on average.
//
// Clocks: the owner learns the master's clock at every registration and heartbeat
// (CapabilityVerifier::SetMasterClock), converts, and accepts a capability until its expiry
// plus a skew allowance. The estimate errs towards expiring early by up to one RPC round trip.
//
// Thread-safety: OwnerKey and Capability functions are pure; CapabilityVerifier is thread-safe.
#pragma once

#include <openssl/sha.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/clock.h"

namespace mc::auth {

inline constexpr size_t kCapabilitySize = 64;
inline constexpr size_t kCapabilityBodySize = 48;
inline constexpr size_t kCapabilityMacSize = 16;
inline constexpr uint8_t kCapabilityVersion = 1;
inline constexpr size_t kOwnerKeySize = 32;
using CapabilityBytes = std::array<uint8_t, kCapabilitySize>;

enum class Right : uint8_t { kRead = 1, kWrite = 2, kReadDisk = 4 };

struct Capability {
  Right right = Right::kRead;
  uint32_t key_tag = 0;
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
  int64_t expiry_ms = 0;
  uint64_t key_binding = 0;  // kWrite: WriteKeyBinding of the object key (48 bits); else 0
};

inline constexpr uint64_t kKeyBindingMask = (uint64_t{1} << 48) - 1;

// HMAC-SHA256 under one fixed key with the key's inner and outer SHA-256 states computed once
// (RFC 2104), so a MAC of a short message costs two compression rounds and no allocation
// (~0.2 us with SHA-NI, against ~1-4 us for OpenSSL's one-shot HMAC()). Results equal
// HmacSha256(key, message) (tests/unit/common/capability_test.cc checks).
class OwnerKey {
 public:
  explicit OwnerKey(std::string_view key);
  Mac Sign(std::string_view message) const;

 private:
  SHA256_CTX inner_;
  SHA256_CTX outer_;
};

// The owner key of `client_id`'s registration `session` under the master's `root` key.
std::string DeriveOwnerKey(std::string_view root, std::string_view client_id, uint64_t session);

// The binding of `object_key` in a WRITE capability minted under `key` (48 bits).
uint64_t WriteKeyBinding(const OwnerKey& key, std::string_view object_key);

// Encodes and MACs `cap` under `key`.
CapabilityBytes MintCapability(const OwnerKey& key, const Capability& cap);
// Decodes (no MAC check): INVALID_ARGUMENT for a bad version, rights or reserved bits.
absl::StatusOr<Capability> DecodeCapability(const uint8_t* data, size_t size);
// True when the MAC of `bytes` (kCapabilitySize of them) is right under `key`. Constant time.
bool CapabilityMacValid(const OwnerKey& key, const uint8_t* bytes);

// The owner key as sent in RegisterClientResponse.capability_key: version(1) || nonce(16) ||
// key XOR pad(32) || tag(16), pad and tag HMACs under the cluster secret's kCapability key over
// the nonce and client id. Unwrap tries every secret (rotation) and fails (UNAUTHENTICATED as
// INVALID_ARGUMENT) when none gives a valid tag.
std::string WrapOwnerKey(const ClusterKeys& keys, std::string_view client_id,
                         std::string_view owner_key);
absl::StatusOr<std::string> UnwrapOwnerKey(const ClusterKeys& keys, std::string_view client_id,
                                           std::string_view wrapped);

// Why a frame was refused (for the refusal counter's `reason` label).
enum class Denial {
  kNone = 0,
  kNoKey,      // this owner holds no capability key (not registered, or the master runs no auth)
  kMalformed,  // undecodable capability
  kBadMac,
  kExpired,
  kWrongOp,     // the rights do not cover the frame's op
  kOutOfRange,  // another segment, or bytes outside the granted range
  kWrongKey,    // an INDEX entry names another key than the WRITE grant was minted for
  kCount,
};
std::string_view DenialName(Denial denial);

// What a frame asks for, as the owner checks it.
struct FrameAccess {
  Right right = Right::kRead;
  uint64_t segment_id = 0;  // READ_DISK: generation
  uint64_t offset = 0;      // READ_DISK: locator
  uint64_t length = 0;
  uint32_t key_tag = 0;  // READ_DISK only
};

struct CapabilityVerifierOptions {
  // Extra ms a capability stays valid past its expiry, for clock drift between two master clock
  // samples (heartbeats, every second by default) and scheduling delays.
  int64_t clock_skew_ms = 1000;
};

// The owner's side: its current key and its estimate of the master's clock.
class CapabilityVerifier {
 public:
  CapabilityVerifier(CapabilityVerifierOptions options, const Clock& clock);

  // A new owner key (after a registration); empty forgets it (every frame is then refused).
  void SetKey(std::string_view owner_key);
  // `master_ms` is the master's clock as it answered a call sent at our `sent_ms` (our clock):
  // the master's clock is at most master_ms + (now - sent_ms) now.
  void SetMasterClock(int64_t master_ms, int64_t sent_ms);
  bool has_key() const;

  // Bytes whose MAC one connection verified last: the frames cut from one large request carry
  // the same capability, so its MAC is checked once (expiry and range are checked every time).
  struct Cache {
    uint64_t epoch = 0;  // key_epoch() when verified; 0 = empty
    CapabilityBytes bytes{};
  };
  // Checks `cap` (kCapabilitySize bytes) for `access`; kNone when it grants it. `cache` optional.
  Denial Check(const uint8_t* cap, const FrameAccess& access, Cache* cache = nullptr) const;
  // An INDEX notice entry: `cap` must grant WRITE on exactly [offset, +length) of `segment_id`
  // for `generation` (as a WRITE frame of the whole replica would be checked) and be minted for
  // `object_key` (kWrongKey otherwise). kNone when it does.
  Denial CheckIndexEntry(const uint8_t* cap, uint64_t segment_id, uint64_t offset, uint64_t length,
                         uint64_t generation, std::string_view object_key) const;
  // Changes whenever the key does (starts at 1 with the first key).
  uint64_t key_epoch() const { return epoch_.load(); }

 private:
  const CapabilityVerifierOptions options_;
  const Clock& clock_;
  std::atomic<int64_t> offset_ms_{0};  // master clock - our clock (conservative: high)
  std::atomic<uint64_t> epoch_{0};
  // The current key (null when none) and the epoch it belongs to, read together.
  struct KeySnapshot {
    std::shared_ptr<const OwnerKey> key;
    uint64_t epoch = 0;
  };
  KeySnapshot CurrentKey() const;
  Denial CheckWith(const OwnerKey& key, uint64_t epoch, const uint8_t* bytes,
                   const FrameAccess& access, Cache* cache, Capability* decoded) const;

  mutable absl::Mutex mu_;
  std::shared_ptr<const OwnerKey> key_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::auth
