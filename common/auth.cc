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

using KeySet = std::array<Mac, static_cast<int>(Purpose::kCount)>;

KeySet DeriveKeys(std::string_view secret) {
  KeySet keys{};
  for (int p = 0; p < static_cast<int>(Purpose::kCount); ++p) {
    keys[p] = HmacSha256(secret, "mcstore/v1/" + std::string(PurposeName(static_cast<Purpose>(p))));
  }
  return keys;
}

std::string_view AsView(const Mac& mac) {
  return {reinterpret_cast<const char*>(mac.data()), mac.size()};
}

}  // namespace

ClusterKeys::ClusterKeys(std::vector<KeySet> keys) : keys_(std::move(keys)) {
  Mac fp = HmacSha256(AsView(keys_.front()[0]), "mcstore/v1/fingerprint");
  fingerprint_ = Hex(std::string_view(reinterpret_cast<const char*>(fp.data()), 6));
}

absl::StatusOr<ClusterKeysPtr> ClusterKeys::FromSecrets(const std::vector<std::string>& secrets) {
  if (secrets.empty()) return absl::InvalidArgumentError("no secret (need at least one line)");
  if (secrets.size() > kMaxSecrets) {
    return absl::InvalidArgumentError(
        absl::StrCat(secrets.size(), " secrets; at most ", kMaxSecrets, " (current + old ones)"));
  }
  std::vector<KeySet> keys;
  for (size_t i = 0; i < secrets.size(); ++i) {
    if (secrets[i].size() < kMinSecretChars) {
      return absl::InvalidArgumentError(absl::StrCat("secret ", i + 1, " has ", secrets[i].size(),
                                                     " characters; need at least ", kMinSecretChars,
                                                     " (mc-admin gen-secret)"));
    }
    keys.push_back(DeriveKeys(secrets[i]));
  }
  return ClusterKeysPtr(new ClusterKeys(std::move(keys)));
}

absl::StatusOr<ClusterKeysPtr> ClusterKeys::Load(const std::string& path) {
  absl::StatusOr<std::string> content = ReadPrivateFile(path);
  if (!content.ok()) return content.status();
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

absl::StatusOr<ClusterKeysPtr> KeysFromFlags(bool auth, const std::string& secret_file) {
  if (!auth) {
    if (!secret_file.empty()) {
      return absl::InvalidArgumentError("--cluster_secret_file with --auth=false: pick one");
    }
    return ClusterKeysPtr();
  }
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
  return HmacSha256(AsView(keys_.at(index)[static_cast<int>(purpose)]), message);
}

Mac ClusterKeys::Sign(Purpose purpose, std::string_view message) const {
  return HmacSha256(AsView(keys_.front()[static_cast<int>(purpose)]), message);
}

bool ClusterKeys::Verify(Purpose purpose, std::string_view message, const uint8_t* mac,
                         size_t mac_size) const {
  if (mac == nullptr || mac_size < 16 || mac_size > kMacSize) return false;
  bool ok = false;
  for (const KeySet& set : keys_) {
    Mac want = HmacSha256(AsView(set[static_cast<int>(purpose)]), message);
    // Every key is tried (no early exit): the time does not tell which secret matched.
    ok |= CRYPTO_memcmp(want.data(), mac, mac_size) == 0;
  }
  return ok;
}

}  // namespace mc::auth
