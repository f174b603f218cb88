// The cluster credential: the shared secret(s) that mc-master, the mc-clients and mc-admin hold
// (docs/security.md), and the primitives built on it.
//
// A secret file holds one secret per line (blank lines and lines starting with '#' are skipped),
// each at least kMinSecretChars characters (`mc-admin gen-secret` writes 64 hex digits), at most
// kMaxSecrets of them. The FIRST secret signs; every secret verifies: an operator rotates by
// adding the new secret as a second line everywhere, then moving it first, then removing the old
// one (a restart or SIGHUP-free rollout per step; docs/security.md). The file must be a regular
// file that neither group nor others may read or write (mode 0600 or 0400), like an ssh key.
//
// Nothing signs with a secret directly: each purpose has its own key derived from every secret
// (HMAC-SHA256(secret, "mcstore/v1/" + purpose name)), so a MAC made for one purpose (say a
// data-plane handshake) is never valid for another (a master RPC or a capability).
//
// A member credential (`mc-admin issue-member`, docs/security.md) holds no secret: it holds the
// member key of ONE client id and serial (HMAC of "id\nserial" under the signing secret's kMember
// key) and the kDataPlane key of every secret. LoadMemberCredential turns it into a ClusterKeys
// that has only the purposes a member may use: kDataPlane (cluster-wide: the data-plane handshake
// is mutual between members), and kMasterRpc / kCapability derived from the member key (its
// registration proof, the wrap of its owner key). The master derives the same keys from the
// secret (MemberKey). A purpose a ClusterKeys lacks fails closed: Sign gives a random MAC that
// verifies nowhere, Verify is false.
//
// Thread-safe: ClusterKeys is immutable after Load; the free functions are pure or use the
// kernel's random source.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace mc::auth {

inline constexpr size_t kMacSize = 32;  // HMAC-SHA256
inline constexpr size_t kMinSecretChars = 32;
inline constexpr size_t kMaxSecrets = 4;
using Mac = std::array<uint8_t, kMacSize>;

// What a MAC is for; each has its own derived key.
enum class Purpose : int {
  kMasterRpc = 0,   // a daemon proving itself to mc-master
  kDataPlane = 1,   // the data-plane connection handshake
  kCapability = 2,  // a master-issued grant to read or write one range of one segment
  kMember = 3,      // issuing member credentials (the master and mc-admin only)
  kCount = 4,
};
std::string_view PurposeName(Purpose purpose);

// One secret's purpose keys; an absent purpose is not held (a member credential).
using PurposeKeys = std::array<std::optional<Mac>, static_cast<int>(Purpose::kCount)>;

// Whose member credential a ClusterKeys was loaded from.
struct MemberIdentity {
  std::string client_id;
  uint64_t serial = 0;
};

class ClusterKeys {
 public:
  // Reads and checks a secret file (see the header comment). Errors name the file and the
  // problem (missing, not a regular file, readable by group/others, too short, too many).
  static absl::StatusOr<std::shared_ptr<const ClusterKeys>> Load(const std::string& path);
  // From secrets in memory, first signs (tests, tools). INVALID_ARGUMENT as Load would.
  static absl::StatusOr<std::shared_ptr<const ClusterKeys>> FromSecrets(
      const std::vector<std::string>& secrets);
  // From explicit purpose keys, one set per secret (first signs; 1..kMaxSecrets sets, the first
  // holding kDataPlane, which the fingerprint derives from). `member`: the identity of the member
  // credential these keys come from (a registration proof is then a member proof for it).
  static absl::StatusOr<std::shared_ptr<const ClusterKeys>> FromPurposeKeys(
      std::vector<PurposeKeys> sets, std::optional<MemberIdentity> member = std::nullopt);

  // HMAC-SHA256 of `message` under the signing (first) secret's key for `purpose`; a random MAC
  // (that verifies nowhere) when the signing set lacks `purpose`.
  Mac Sign(Purpose purpose, std::string_view message) const;
  // True when `mac` (any length up to kMacSize: a truncated MAC compares its prefix; fewer than
  // 16 bytes never verifies) is the MAC of `message` under ANY secret's key for `purpose`.
  // Constant time in the MAC bytes.
  bool Verify(Purpose purpose, std::string_view message, const uint8_t* mac, size_t mac_size) const;

  // Sign with secret `index` (< secret_count()) instead of the first: a receiver that must
  // reproduce a MAC made under whichever secret the sender signs with tries each.
  Mac SignWith(size_t index, Purpose purpose, std::string_view message) const;

  size_t secret_count() const { return keys_.size(); }
  // Whether secret `index`'s set holds `purpose`.
  bool Has(size_t index, Purpose purpose) const;
  // The purpose key itself (issuing a member credential copies kDataPlane keys); nullopt when
  // absent or index out of range.
  std::optional<Mac> PurposeKey(size_t index, Purpose purpose) const;
  // Set when loaded from a member credential.
  const std::optional<MemberIdentity>& member() const { return member_; }
  // A short public fingerprint of the signing secret (hex of a MAC of a fixed string under its
  // kDataPlane key, which members hold too), for logs and /status: operators compare it across
  // hosts during a rotation. Reveals nothing usable.
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  ClusterKeys(std::vector<PurposeKeys> keys, std::optional<MemberIdentity> member);
  std::vector<PurposeKeys> keys_;  // [secret][purpose]
  std::optional<MemberIdentity> member_;
  std::string fingerprint_;
};
using ClusterKeysPtr = std::shared_ptr<const ClusterKeys>;

// HMAC-SHA256 with an explicit key.
Mac HmacSha256(std::string_view key, std::string_view message);
// Constant-time equality of two byte strings (false when the sizes differ; the size is public).
bool ConstantTimeEqual(std::string_view a, std::string_view b);
// `n` bytes from the kernel's CSPRNG (getrandom); aborts if the kernel cannot supply them, as
// a predictable value must never be used in their place.
std::string RandomBytes(size_t n);
uint64_t RandomU64();
// Lower-case hex of `bytes`.
std::string Hex(std::string_view bytes);
// A fresh secret as `mc-admin gen-secret` writes it: 64 hex digits (256 random bits).
std::string NewSecret();

// What the daemons' --auth / --cluster_secret_file flags ask for: null (no authentication) when
// `auth` is false, the loaded keys when a file is named, and an error saying what to do when
// authentication is on and no file is named. `member_file` (mc-client's
// --member_credential_file) is the alternative to the secret file: exactly one of them.
absl::StatusOr<ClusterKeysPtr> KeysFromFlags(bool auth, const std::string& secret_file,
                                             const std::string& member_file = "");

// ---- Member credentials ----
inline constexpr char kMemberCredentialHeader[] = "mcstore-member v1";
// The member key of (client_id, serial) under secret `index` of the cluster keys (which must hold
// kMember there): HMAC(kMember key, client_id + "\n" + decimal serial).
Mac MemberKey(const ClusterKeys& cluster, size_t index, std::string_view client_id,
              uint64_t serial);
// The purpose keys a member key gives: kMasterRpc and kCapability, each
// HMAC(member key, "mcstore/v1/member/" + purpose name); nothing else.
PurposeKeys MemberPurposeKeys(const Mac& member_key);
// The text of a member credential file for (client_id, serial) (cluster: the secret's keys):
//   mcstore-member v1 / client_id X / serial N / member_key <hex> / data_plane_key <hex>...
// INVALID_ARGUMENT for a bad id or keys that are not a cluster secret's.
absl::StatusOr<std::string> FormatMemberCredential(const ClusterKeys& cluster,
                                                   std::string_view client_id, uint64_t serial);
// Parses that text into the member's keys (see the header comment). Errors name the line.
absl::StatusOr<ClusterKeysPtr> ParseMemberCredential(std::string_view text);
// ReadPrivateFile + ParseMemberCredential; errors name the file.
absl::StatusOr<ClusterKeysPtr> LoadMemberCredential(const std::string& path);

// A file other users must not read (a secret, a token): a regular file whose mode grants group
// and others nothing. Returns its content with surrounding whitespace trimmed, or an error that
// names the file and says how to fix it ("chmod 600 F").
absl::StatusOr<std::string> ReadPrivateFile(const std::string& path);
// A regular file of at most `max_bytes`, whole (not trimmed). With `private_only`, also the rule
// of ReadPrivateFile (no symlink, nothing for group and others); without it, anyone may read it
// (a certificate) and a symlink is followed. INVALID_ARGUMENT naming the file and the problem.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, size_t max_bytes,
                                            bool private_only);

}  // namespace mc::auth
