#include "common/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace mc::auth {
namespace {

std::string_view Trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string_view PurposeName(Purpose purpose) {
  switch (purpose) {
    case Purpose::kMasterRpc:
      return "master-rpc";
    case Purpose::kDataPlane:
      return "data-plane";
    case Purpose::kCapability:
      return "capability";
    case Purpose::kMember:
      return "member";
    case Purpose::kCount:
      break;
  }
  return "invalid";
}

Mac HmacSha256(std::string_view key, std::string_view message) {
  Mac out{};
  unsigned int len = 0;
  // One-shot HMAC (not deprecated in OpenSSL 3); ~1 us for short messages.
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(),
           &len) == nullptr ||
      len != kMacSize) {
    std::fprintf(stderr, "mcstore: HMAC-SHA256 failed in libcrypto\n");
    std::abort();
  }
  return out;
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    ssize_t got = getrandom(out.data() + done, n - done, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "mcstore: getrandom failed: %s\n", std::strerror(errno));
      std::abort();
    }
    done += static_cast<size_t>(got);
  }
  return out;
}

uint64_t RandomU64() {
  std::string bytes = RandomBytes(sizeof(uint64_t));
  uint64_t v = 0;
  std::memcpy(&v, bytes.data(), sizeof(v));
  return v;
}

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string NewSecret() { return Hex(RandomBytes(32)); }

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, size_t max_bytes,
                                            bool private_only) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | (private_only ? O_NOFOLLOW : 0));
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  if (private_only && (st.st_mode & 077) != 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is accessible to group or others (mode ",
                                                   absl::StrFormat("%04o", st.st_mode & 0777),
                                                   "); run: chmod 600 ", path));
  }
  if (static_cast<size_t>(st.st_size) > max_bytes) {
    close(fd);
    const std::string limit = max_bytes % (1 << 20) == 0 ? absl::StrCat(max_bytes >> 20, " MiB")
                                                         : absl::StrCat(max_bytes >> 10, " KiB");
    return absl::InvalidArgumentError(absl::StrCat(path, " is larger than ", limit));
  }
  std::string content(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < content.size()) {
    ssize_t got = read(fd, content.data() + done, content.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<size_t>(got);
  }
  close(fd);
  content.resize(done);
  return content;
}

absl::StatusOr<std::string> ReadPrivateFile(const std::string& path) {
  absl::StatusOr<std::string> content = ReadRegularFile(path, 64 << 10, /*private_only=*/true);
  if (!content.ok()) return content.status();
  return std::string(Trim(*content));
}

namespace {

constexpr int kPurposes = static_cast<int>(Purpose::kCount);

PurposeKeys DeriveKeys(std::string_view secret) {
  PurposeKeys keys{};
  for (int p = 0; p < kPurposes; ++p) {
    keys[p] = HmacSha256(secret, "mcstore/v1/" + std::string(PurposeName(static_cast<Purpose>(p))));
  }
  return keys;
}

std::string_view AsView(const Mac& mac) {
  return {reinterpret_cast<const char*>(mac.data()), mac.size()};
}

// A MAC for a purpose we do not hold: random, so it verifies nowhere (never a MAC under a zero
// or otherwise guessable key).
Mac Unverifiable() {
  Mac out{};
  const std::string bytes = RandomBytes(kMacSize);
  std::memcpy(out.data(), bytes.data(), kMacSize);
  return out;
}

}  // namespace

ClusterKeys::ClusterKeys(std::vector<PurposeKeys> keys, std::optional<MemberIdentity> member)
    : keys_(std::move(keys)), member_(std::move(member)) {
  // Both constructors guarantee the signing set's kDataPlane key.
  Mac fp = HmacSha256(AsView(*keys_.front()[static_cast<int>(Purpose::kDataPlane)]),
                      "mcstore/v1/fingerprint");
  fingerprint_ = Hex(std::string_view(reinterpret_cast<const char*>(fp.data()), 6));
}

absl::StatusOr<ClusterKeysPtr> ClusterKeys::FromPurposeKeys(std::vector<PurposeKeys> sets,
                                                            std::optional<MemberIdentity> member) {
  if (sets.empty() || sets.size() > kMaxSecrets) {
    return absl::InvalidArgumentError(
        absl::StrCat(sets.size(), " key sets; need 1 to ", kMaxSecrets));
  }
  if (!sets.front()[static_cast<int>(Purpose::kDataPlane)].has_value()) {
    return absl::InvalidArgumentError("the signing key set has no data-plane key");
  }
  return ClusterKeysPtr(new ClusterKeys(std::move(sets), std::move(member)));
}

bool ClusterKeys::Has(size_t index, Purpose purpose) const {
  const int p = static_cast<int>(purpose);
  return index < keys_.size() && p >= 0 && p < kPurposes && keys_[index][p].has_value();
}

std::optional<Mac> ClusterKeys::PurposeKey(size_t index, Purpose purpose) const {
  if (!Has(index, purpose)) return std::nullopt;
  return keys_[index][static_cast<int>(purpose)];
}

absl::StatusOr<ClusterKeysPtr> ClusterKeys::FromSecrets(const std::vector<std::string>& secrets) {
  if (secrets.empty()) return absl::InvalidArgumentError("no secret (need at least one line)");
  if (secrets.size() > kMaxSecrets) {
    return absl::InvalidArgumentError(
        absl::StrCat(secrets.size(), " secrets; at most ", kMaxSecrets, " (current + old ones)"));
  }
  std::vector<PurposeKeys> keys;
  for (size_t i = 0; i < secrets.size(); ++i) {
    if (secrets[i].size() < kMinSecretChars) {
      return absl::InvalidArgumentError(absl::StrCat("secret ", i + 1, " has ", secrets[i].size(),
                                                     " characters; need at least ", kMinSecretChars,
                                                     " (mc-admin gen-secret)"));
    }
    keys.push_back(DeriveKeys(secrets[i]));
  }
  return ClusterKeysPtr(new ClusterKeys(std::move(keys), std::nullopt));
}

absl::StatusOr<ClusterKeysPtr> ClusterKeys::Load(const std::string& path) {
  absl::StatusOr<std::string> content = ReadPrivateFile(path);
  if (!content.ok()) return content.status();
  if (content->rfind("mcstore-member", 0) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " is a member credential, not the cluster secret (mc-client takes it as "
                     "--member_credential_file; mc-master and mc-admin need the secret)"));
  }
  std::vector<std::string> secrets;
  for (absl::string_view piece : absl::StrSplit(*content, '\n')) {
    std::string_view line = Trim(std::string_view(piece.data(), piece.size()));
    if (line.empty() || line.front() == '#') continue;
    secrets.emplace_back(line);
  }
  absl::StatusOr<ClusterKeysPtr> keys = FromSecrets(secrets);
  if (!keys.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", keys.status().message()));
  }
  return keys;
}

absl::StatusOr<ClusterKeysPtr> KeysFromFlags(bool auth, const std::string& secret_file,
                                             const std::string& member_file) {
  if (!auth) {
    if (!secret_file.empty()) {
      return absl::InvalidArgumentError("--cluster_secret_file with --auth=false: pick one");
    }
    if (!member_file.empty()) {
      return absl::InvalidArgumentError("--member_credential_file with --auth=false: pick one");
    }
    return ClusterKeysPtr();
  }
  if (!secret_file.empty() && !member_file.empty()) {
    return absl::InvalidArgumentError(
        "--cluster_secret_file and --member_credential_file: give exactly one (a member "
        "credential is the recommended one for mc-client; docs/security.md)");
  }
  if (!member_file.empty()) return LoadMemberCredential(member_file);
  if (secret_file.empty()) {
    return absl::InvalidArgumentError(
        "authentication is on and no --cluster_secret_file is set: create one with "
        "`mc-admin gen-secret FILE` and give the same file to mc-master, every mc-client and "
        "mc-admin, or pass --auth=false for an unauthenticated cluster (benchmarks, a host "
        "whose every user is trusted; docs/security.md)");
  }
  return ClusterKeys::Load(secret_file);
}

Mac ClusterKeys::SignWith(size_t index, Purpose purpose, std::string_view message) const {
  if (!Has(index, purpose)) return Unverifiable();
  return HmacSha256(AsView(*keys_[index][static_cast<int>(purpose)]), message);
}

Mac ClusterKeys::Sign(Purpose purpose, std::string_view message) const {
  return SignWith(0, purpose, message);
}

bool ClusterKeys::Verify(Purpose purpose, std::string_view message, const uint8_t* mac,
                         size_t mac_size) const {
  if (mac == nullptr || mac_size < 16 || mac_size > kMacSize) return false;
  const int p = static_cast<int>(purpose);
  if (p < 0 || p >= kPurposes) return false;
  bool ok = false;
  for (const PurposeKeys& set : keys_) {
    if (!set[p].has_value()) continue;  // a purpose this set lacks never verifies
    Mac want = HmacSha256(AsView(*set[p]), message);
    // Every key is tried (no early exit): the time does not tell which secret matched.
    ok |= CRYPTO_memcmp(want.data(), mac, mac_size) == 0;
  }
  return ok;
}

namespace {

// Debian's Abseil (20220623) has its own string_view.
absl::string_view A(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool ValidMemberId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (c < '!' || c > '~') return false;
  }
  return true;
}

absl::StatusOr<Mac> MacFromHex(std::string_view hex) {
  if (hex.size() != 2 * kMacSize) return absl::InvalidArgumentError("need 64 hex digits");
  Mac out{};
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < kMacSize; ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::InvalidArgumentError("not lower-case hex");
    out[i] = static_cast<uint8_t>((hi << 4) | lo);
  }
  return out;
}

}  // namespace

Mac MemberKey(const ClusterKeys& cluster, size_t index, std::string_view client_id,
              uint64_t serial) {
  return cluster.SignWith(index, Purpose::kMember, absl::StrCat(A(client_id), "\n", serial));
}

PurposeKeys MemberPurposeKeys(const Mac& member_key) {
  PurposeKeys keys{};
  for (Purpose p : {Purpose::kMasterRpc, Purpose::kCapability}) {
    keys[static_cast<int>(p)] =
        HmacSha256(AsView(member_key), absl::StrCat("mcstore/v1/member/", A(PurposeName(p))));
  }
  return keys;
}

absl::StatusOr<std::string> FormatMemberCredential(const ClusterKeys& cluster,
                                                   std::string_view client_id, uint64_t serial) {
  if (!ValidMemberId(client_id)) {
    return absl::InvalidArgumentError(
        "client id must be 1..128 printable ASCII characters without spaces");
  }
  if (cluster.member().has_value() || !cluster.Has(0, Purpose::kMember)) {
    return absl::InvalidArgumentError(
        "issuing a member credential needs the cluster secret, not a member credential");
  }
  const Mac member_key = MemberKey(cluster, 0, client_id, serial);
  std::string out = absl::StrCat(kMemberCredentialHeader, "\nclient_id ", A(client_id), "\nserial ",
                                 serial, "\nmember_key ", Hex(AsView(member_key)), "\n");
  for (size_t i = 0; i < cluster.secret_count(); ++i) {
    absl::StrAppend(&out, "data_plane_key ",
                    Hex(AsView(*cluster.PurposeKey(i, Purpose::kDataPlane))), "\n");
  }
  return out;
}

absl::StatusOr<ClusterKeysPtr> ParseMemberCredential(std::string_view text) {
  std::optional<std::string> client_id;
  std::optional<uint64_t> serial;
  std::optional<Mac> member_key;
  std::vector<Mac> data_plane;
  bool header = false;
  int line_no = 0;
  for (absl::string_view piece :
       absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    std::string_view line = Trim(std::string_view(piece.data(), piece.size()));
    if (line.empty() || line.front() == '#') continue;
    auto bad = [&](std::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", A(what)));
    };
    if (!header) {
      if (line != kMemberCredentialHeader) {
        return bad(absl::StrCat("expected '", kMemberCredentialHeader,
                                "' (a file written by `mc-admin issue-member`)"));
      }
      header = true;
      continue;
    }
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) return bad("expected 'NAME VALUE'");
    const std::string_view name = line.substr(0, space);
    const std::string_view value = Trim(line.substr(space + 1));
    if (name == "client_id") {
      if (client_id || !ValidMemberId(value)) return bad("bad or repeated client_id");
      client_id = std::string(value);
    } else if (name == "serial") {
      uint64_t n = 0;
      if (serial || value.empty() || value.size() > 19 ||
          value.find_first_not_of("0123456789") != std::string_view::npos ||
          !absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &n)) {
        return bad("bad or repeated serial");
      }
      serial = n;
    } else if (name == "member_key" || name == "data_plane_key") {
      absl::StatusOr<Mac> key = MacFromHex(value);
      if (!key.ok()) return bad(absl::StrCat(A(name), ": ", key.status().message()));
      if (name == "data_plane_key") {
        data_plane.push_back(*key);
      } else if (member_key) {
        return bad("repeated member_key");
      } else {
        member_key = *key;
      }
    } else {
      return bad(absl::StrCat("unknown field '", A(name), "'"));
    }
  }
  if (!header) return absl::InvalidArgumentError("empty member credential");
  if (!client_id || !serial || !member_key || data_plane.empty()) {
    return absl::InvalidArgumentError(
        "incomplete member credential: needs client_id, serial, member_key and at least one "
        "data_plane_key");
  }
  if (data_plane.size() > kMaxSecrets) {
    return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxSecrets, " data_plane_key"));
  }
  std::vector<PurposeKeys> sets(data_plane.size());
  sets[0] = MemberPurposeKeys(*member_key);
  for (size_t i = 0; i < data_plane.size(); ++i) {
    sets[i][static_cast<int>(Purpose::kDataPlane)] = data_plane[i];
  }
  return ClusterKeys::FromPurposeKeys(std::move(sets),
                                      MemberIdentity{std::move(*client_id), *serial});
}

absl::StatusOr<ClusterKeysPtr> LoadMemberCredential(const std::string& path) {
  absl::StatusOr<std::string> content = ReadPrivateFile(path);
  if (!content.ok()) return content.status();
  absl::StatusOr<ClusterKeysPtr> keys = ParseMemberCredential(*content);
  if (!keys.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", keys.status().message()));
  }
  return keys;
}

}  // namespace mc::auth
