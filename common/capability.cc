// SHA256_Init/Update/Final are deprecated in OpenSSL 3 in favour of EVP, whose per-call context
// handling costs ~3x more than the MAC itself on a 48-byte message; the HMAC of a capability is
// on the master's lookup path (one per replica answered), so it keeps the low-level calls.
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include "common/capability.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_order.h"
#include "common/status.h"

namespace mc::auth {
namespace {

constexpr size_t kShaBlock = 64;
constexpr size_t kWrapNonceSize = 16;
constexpr size_t kWrapTagSize = 16;
constexpr uint8_t kWrapVersion = 1;
constexpr size_t kWrappedSize = 1 + kWrapNonceSize + kOwnerKeySize + kWrapTagSize;

std::string_view View(const Mac& mac) {
  return {reinterpret_cast<const char*>(mac.data()), mac.size()};
}

Mac WrapPad(const ClusterKeys& keys, size_t secret, std::string_view nonce,
            std::string_view client_id, std::string_view what) {
  std::string message = "mcstore/v1/owner-key-";
  message.append(what).append("\n").append(nonce).append(client_id);
  return keys.SignWith(secret, Purpose::kCapability, message);
}

}  // namespace

OwnerKey::OwnerKey(std::string_view key) {
  uint8_t block[kShaBlock] = {};
  if (key.size() > kShaBlock) {
    SHA256(reinterpret_cast<const uint8_t*>(key.data()), key.size(), block);
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  uint8_t pad[kShaBlock];
  for (size_t i = 0; i < kShaBlock; ++i) pad[i] = block[i] ^ 0x36;
  SHA256_Init(&inner_);
  SHA256_Update(&inner_, pad, kShaBlock);
  for (size_t i = 0; i < kShaBlock; ++i) pad[i] = block[i] ^ 0x5c;
  SHA256_Init(&outer_);
  SHA256_Update(&outer_, pad, kShaBlock);
  OPENSSL_cleanse(block, sizeof(block));
  OPENSSL_cleanse(pad, sizeof(pad));
}

Mac OwnerKey::Sign(std::string_view message) const {
  uint8_t inner_digest[SHA256_DIGEST_LENGTH];
  SHA256_CTX ctx = inner_;
  SHA256_Update(&ctx, message.data(), message.size());
  SHA256_Final(inner_digest, &ctx);
  ctx = outer_;
  SHA256_Update(&ctx, inner_digest, sizeof(inner_digest));
  Mac out{};
  SHA256_Final(out.data(), &ctx);
  return out;
}

std::string DeriveOwnerKey(std::string_view root, std::string_view client_id, uint64_t session) {
  std::string message = "mcstore/v1/capability-owner\n";
  message.append(client_id).append("\n");
  AppendLe(message, session);
  return std::string(View(HmacSha256(root, message)));
}

uint64_t WriteKeyBinding(const OwnerKey& key, std::string_view object_key) {
  std::string message = "mcstore/v1/write-key\n";
  message.append(object_key);
  const Mac mac = key.Sign(message);
  uint64_t binding = 0;
  for (int i = 5; i >= 0; --i) binding = (binding << 8) | mac[static_cast<size_t>(i)];
  return binding;
}

CapabilityBytes MintCapability(const OwnerKey& key, const Capability& cap) {
  CapabilityBytes out{};
  uint8_t* p = out.data();
  const bool write = cap.right == Right::kWrite;
  PutLe<uint8_t>(p, kCapabilityVersion);
  PutLe<uint8_t>(p, static_cast<uint8_t>(cap.right));
  PutLe<uint16_t>(p, write ? static_cast<uint16_t>((cap.key_binding >> 32) & 0xffff) : 0);
  PutLe<uint32_t>(p, write ? static_cast<uint32_t>(cap.key_binding) : cap.key_tag);
  PutLe<uint64_t>(p, cap.segment_id);
  PutLe<uint64_t>(p, cap.offset);
  PutLe<uint64_t>(p, cap.length);
  PutLe<uint64_t>(p, cap.generation);
  PutLe<uint64_t>(p, static_cast<uint64_t>(cap.expiry_ms));
  const Mac mac = key.Sign({reinterpret_cast<const char*>(out.data()), kCapabilityBodySize});
  std::memcpy(p, mac.data(), kCapabilityMacSize);
  return out;
}

absl::StatusOr<Capability> DecodeCapability(const uint8_t* data, size_t size) {
  if (data == nullptr || size != kCapabilitySize) {
    return McError(Code::kInvalidArgument, absl::StrCat("capability of ", size, " bytes"));
  }
  const uint8_t* p = data;
  const uint8_t version = GetLe<uint8_t>(p);
  const uint8_t rights = GetLe<uint8_t>(p);
  const uint16_t reserved = GetLe<uint16_t>(p);
  if (version != kCapabilityVersion) {
    return McError(Code::kInvalidArgument, absl::StrCat("capability version ", version));
  }
  if (rights != static_cast<uint8_t>(Right::kRead) &&
      rights != static_cast<uint8_t>(Right::kWrite) &&
      rights != static_cast<uint8_t>(Right::kReadDisk)) {
    return McError(Code::kInvalidArgument, absl::StrCat("capability rights ", rights));
  }
  Capability cap;
  cap.right = static_cast<Right>(rights);
  if (reserved != 0 && cap.right != Right::kWrite) {
    return McError(Code::kInvalidArgument, "capability reserved bits set");
  }
  cap.key_tag = GetLe<uint32_t>(p);
  if (cap.right == Right::kWrite) {  // the key binding, not a disk record's tag
    cap.key_binding = (uint64_t{reserved} << 32) | cap.key_tag;
    cap.key_tag = 0;
  }
  cap.segment_id = GetLe<uint64_t>(p);
  cap.offset = GetLe<uint64_t>(p);
  cap.length = GetLe<uint64_t>(p);
  cap.generation = GetLe<uint64_t>(p);
  cap.expiry_ms = static_cast<int64_t>(GetLe<uint64_t>(p));
  if (cap.key_tag != 0 && cap.right != Right::kReadDisk) {
    return McError(Code::kInvalidArgument, "capability key tag on a memory range");
  }
  if (cap.offset > UINT64_MAX - cap.length) {
    return McError(Code::kInvalidArgument, "capability range overflows");
  }
  return cap;
}

bool CapabilityMacValid(const OwnerKey& key, const uint8_t* bytes) {
  const Mac mac = key.Sign({reinterpret_cast<const char*>(bytes), kCapabilityBodySize});
  return CRYPTO_memcmp(mac.data(), bytes + kCapabilityBodySize, kCapabilityMacSize) == 0;
}

std::string WrapOwnerKey(const ClusterKeys& keys, std::string_view client_id,
                         std::string_view owner_key) {
  const std::string nonce = RandomBytes(kWrapNonceSize);
  const Mac pad = WrapPad(keys, 0, nonce, client_id, "pad");
  std::string out(1, static_cast<char>(kWrapVersion));
  out += nonce;
  for (size_t i = 0; i < kOwnerKeySize; ++i) {
    out.push_back(static_cast<char>(static_cast<uint8_t>(owner_key[i]) ^ pad[i]));
  }
  const Mac tag = WrapPad(keys, 0, out, client_id, "tag");
  out.append(reinterpret_cast<const char*>(tag.data()), kWrapTagSize);
  return out;
}

absl::StatusOr<std::string> UnwrapOwnerKey(const ClusterKeys& keys, std::string_view client_id,
                                           std::string_view wrapped) {
  if (wrapped.size() != kWrappedSize || static_cast<uint8_t>(wrapped[0]) != kWrapVersion) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("capability key of ", wrapped.size(), " bytes: not ours"));
  }
  const std::string_view body = wrapped.substr(0, kWrappedSize - kWrapTagSize);
  const std::string_view nonce = wrapped.substr(1, kWrapNonceSize);
  const std::string_view sealed = wrapped.substr(1 + kWrapNonceSize, kOwnerKeySize);
  for (size_t s = 0; s < keys.secret_count(); ++s) {
    const Mac tag = WrapPad(keys, s, body, client_id, "tag");
    if (CRYPTO_memcmp(tag.data(), wrapped.data() + body.size(), kWrapTagSize) != 0) continue;
    const Mac pad = WrapPad(keys, s, nonce, client_id, "pad");
    std::string key(kOwnerKeySize, '\0');
    for (size_t i = 0; i < kOwnerKeySize; ++i) {
      key[i] = static_cast<char>(static_cast<uint8_t>(sealed[i]) ^ pad[i]);
    }
    return key;
  }
  return McError(Code::kPermissionDenied,
                 "capability key sealed under a cluster secret we do not hold");
}

std::string_view DenialName(Denial denial) {
  switch (denial) {
    case Denial::kNone:
      return "none";
    case Denial::kNoKey:
      return "no_key";
    case Denial::kMalformed:
      return "malformed";
    case Denial::kBadMac:
      return "bad_mac";
    case Denial::kExpired:
      return "expired";
    case Denial::kWrongOp:
      return "wrong_op";
    case Denial::kOutOfRange:
      return "out_of_range";
    case Denial::kWrongKey:
      return "wrong_key";
    case Denial::kCount:
      break;
  }
  return "invalid";
}

CapabilityVerifier::CapabilityVerifier(CapabilityVerifierOptions options, const Clock& clock)
    : options_(options), clock_(clock) {}

void CapabilityVerifier::SetKey(std::string_view owner_key) {
  std::shared_ptr<const OwnerKey> key;
  if (!owner_key.empty()) key = std::make_shared<const OwnerKey>(owner_key);
  absl::MutexLock lock(&mu_);
  key_ = std::move(key);
  epoch_.fetch_add(1);
}

void CapabilityVerifier::SetMasterClock(int64_t master_ms, int64_t sent_ms) {
  offset_ms_.store(master_ms - sent_ms);
}

bool CapabilityVerifier::has_key() const {
  absl::MutexLock lock(&mu_);
  return key_ != nullptr;
}

CapabilityVerifier::KeySnapshot CapabilityVerifier::CurrentKey() const {
  absl::MutexLock lock(&mu_);
  return KeySnapshot{.key = key_, .epoch = epoch_.load()};
}

Denial CapabilityVerifier::Check(const uint8_t* bytes, const FrameAccess& access,
                                 Cache* cache) const {
  const KeySnapshot current = CurrentKey();
  if (current.key == nullptr) return Denial::kNoKey;
  Capability decoded;
  return CheckWith(*current.key, current.epoch, bytes, access, cache, &decoded);
}

Denial CapabilityVerifier::CheckIndexEntry(const uint8_t* bytes, uint64_t segment_id,
                                           uint64_t offset, uint64_t length, uint64_t generation,
                                           std::string_view object_key) const {
  const KeySnapshot current = CurrentKey();
  if (current.key == nullptr) return Denial::kNoKey;
  const FrameAccess access{
      .right = Right::kWrite, .segment_id = segment_id, .offset = offset, .length = length};
  Capability cap;
  const Denial denial = CheckWith(*current.key, current.epoch, bytes, access, nullptr, &cap);
  if (denial != Denial::kNone) return denial;
  // Exactly this replica's grant, not a wider one.
  if (cap.offset != offset || cap.length != length || cap.generation != generation) {
    return Denial::kOutOfRange;
  }
  if (cap.key_binding != WriteKeyBinding(*current.key, object_key)) return Denial::kWrongKey;
  return Denial::kNone;
}

Denial CapabilityVerifier::CheckWith(const OwnerKey& key, uint64_t epoch, const uint8_t* bytes,
                                     const FrameAccess& access, Cache* cache,
                                     Capability* decoded) const {
  absl::StatusOr<Capability> cap = DecodeCapability(bytes, kCapabilitySize);
  if (!cap.ok()) return Denial::kMalformed;
  *decoded = *cap;
  const bool cached = cache != nullptr && cache->epoch == epoch &&
                      std::memcmp(cache->bytes.data(), bytes, kCapabilitySize) == 0;
  if (!cached) {
    if (!CapabilityMacValid(key, bytes)) return Denial::kBadMac;
    if (cache != nullptr) {
      cache->epoch = epoch;
      std::memcpy(cache->bytes.data(), bytes, kCapabilitySize);
    }
  }
  const int64_t master_now = clock_.NowMs() + offset_ms_.load();
  if (cap->expiry_ms < master_now - options_.clock_skew_ms) return Denial::kExpired;
  if (cap->right != access.right) return Denial::kWrongOp;
  if (access.right == Right::kReadDisk) {
    // A record is read whole: the frame names exactly the granted record.
    if (access.segment_id != cap->segment_id || access.offset != cap->offset ||
        access.length != cap->length || access.key_tag != cap->key_tag) {
      return Denial::kOutOfRange;
    }
    return Denial::kNone;
  }
  // [access.offset, +length) inside [cap.offset, +cap.length), without overflow.
  if (access.segment_id != cap->segment_id || access.offset < cap->offset ||
      access.length > cap->length || access.offset - cap->offset > cap->length - access.length) {
    return Denial::kOutOfRange;
  }
  return Denial::kNone;
}

}  // namespace mc::auth
