#include "client/access/store_auth.h"

#include <grp.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace mc::client {
namespace {

// Debian's Abseil has its own string_view.
absl::string_view A(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// mc_store_auth_failures_total{reason}.
Counter& AuthFailuresCounter(MetricsRegistry& metrics, const char* reason) {
  return metrics.GetCounter("mc_store_auth_failures_total",
                            "Store calls refused UNAUTHENTICATED, by reason", {{"reason", reason}});
}

}  // namespace

absl::StatusOr<std::string> RandomHexToken() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return McError(Code::kInternal, absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (size_t i = 0; i < sizeof(bytes); ++i) {
    out[2 * i] = kHex[bytes[i] >> 4];
    out[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is looked at whatever the contents; volatile keeps the
  // compiler from ending the loop early.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

absl::StatusOr<std::string> LoadStoreToken(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store_token_file ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store_token_file ", path, " is not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--store_token_file %s has mode %04o: group and others must have no access (chmod 600)",
        path, st.st_mode & 07777));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat("--store_token_file ", path, ": cannot read"));
  }
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.size() < kMinStoreTokenLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store_token_file ", path, " holds ", token.size(),
                     " characters; a token needs at least ", kMinStoreTokenLength));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--store_token_file ", path, ": the token must be printable ASCII without spaces"));
    }
  }
  return token;
}

absl::StatusOr<mode_t> ParseSocketMode(std::string_view text) {
  std::string_view digits = text;
  if (absl::StartsWithIgnoreCase(A(digits), "0o")) digits.remove_prefix(2);
  if (digits.empty() || digits.size() > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad --unix_socket_mode '", A(text), "': expected an octal mode like 0660"));
  }
  unsigned mode = 0;
  for (char c : digits) {
    if (c < '0' || c > '7') {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --unix_socket_mode '", A(text), "': expected an octal mode like 0660"));
    }
    mode = mode * 8 + static_cast<unsigned>(c - '0');
  }
  if (mode > 0777) {
    return absl::InvalidArgumentError(absl::StrCat("bad --unix_socket_mode '", A(text),
                                                   "': only permission bits (at most 0777)"));
  }
  if ((mode & 0600) != 0600) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad --unix_socket_mode '", A(text), "': the owner needs read and write (0600 at least)"));
  }
  return static_cast<mode_t>(mode);
}

absl::StatusOr<gid_t> ParseGroup(std::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError("empty --unix_socket_group");
  std::string name(text);
  std::vector<char> scratch(16384);
  struct group grp {};
  struct group* found = nullptr;
  uint32_t gid = 0;
  if (absl::SimpleAtoi(A(text), &gid)) {
    int rc = getgrgid_r(static_cast<gid_t>(gid), &grp, scratch.data(), scratch.size(), &found);
    if (rc == 0 && found != nullptr) return found->gr_gid;
    // A numeric gid without a name in the group database is still a gid.
    return static_cast<gid_t>(gid);
  }
  int rc = getgrnam_r(name.c_str(), &grp, scratch.data(), scratch.size(), &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--unix_socket_group '", A(text), "': no such group"));
  }
  return found->gr_gid;
}

absl::Status ApplySocketPermissions(const std::string& path, mode_t mode,
                                    std::optional<gid_t> group) {
  if (group && chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("chown(", path, ", group ", *group, "): ", std::strerror(errno)));
  }
  if (chmod(path.c_str(), mode) != 0) {
    return absl::PermissionDeniedError(
        absl::StrFormat("chmod(%s, %04o): %s", path, mode, std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status BindPrivateSocket(int fd, const sockaddr_un& addr, mode_t mode,
                               std::optional<gid_t> group) {
  const std::string path(addr.sun_path);
  unlink(path.c_str());  // a stale socket from a previous run
  const mode_t old_mask = umask(0177);
  const int rc = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  umask(old_mask);
  if (rc != 0)
    return absl::UnavailableError(absl::StrCat("bind(", path, "): ", std::strerror(errno)));
  MC_RETURN_IF_ERROR(ApplySocketPermissions(path, mode, group));
  if (listen(fd, 64) != 0) {
    return absl::InternalError(absl::StrCat("listen: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

StoreAuth::StoreAuth(StoreAuthOptions options, MetricsRegistry& metrics)
    : options_(std::move(options)), metrics_(metrics) {
  for (const char* reason : {"missing_token", "wrong_token"}) AuthFailuresCounter(metrics_, reason);
}

bool StoreAuth::OverUnixSocket(std::string_view peer) { return absl::StartsWith(A(peer), "unix:"); }

void StoreAuth::CountFailure(const char* reason) const {
  AuthFailuresCounter(metrics_, reason).Inc();
}

absl::Status StoreAuth::Check(std::string_view peer, std::string_view authorization,
                              std::string_view store_token_header) const {
  if (OverUnixSocket(peer) || !options_.tcp_auth) return absl::OkStatus();
  std::string_view presented = store_token_header;
  if (presented.empty() && absl::StartsWithIgnoreCase(A(authorization), "bearer ")) {
    absl::string_view rest = absl::StripAsciiWhitespace(A(authorization.substr(7)));
    presented = std::string_view(rest.data(), rest.size());
  }
  if (presented.empty()) {
    CountFailure("missing_token");
    return absl::UnauthenticatedError(
        "the Store service over TCP needs the token of --store_token_file "
        "(metadata `authorization: Bearer <token>`)");
  }
  if (options_.token.empty() || !ConstantTimeEquals(presented, options_.token)) {
    CountFailure("wrong_token");
    return absl::UnauthenticatedError("wrong Store token");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> StoreAuth::OwnerOf(std::string_view peer, std::string_view owner_header,
                                               const CallerSessions* sessions) {
  if (!owner_header.empty() && sessions != nullptr) {
    if (sessions->IsLive(owner_header)) return std::string(owner_header);
    return absl::FailedPreconditionError(absl::StrCat(
        A(kSessionLost),
        " x-mc-owner names no live fd session of this mc-client (it restarted, or the session "
        "was closed): open a new fd session and register the buffers again"));
  }
  if (OverUnixSocket(peer)) return "anon:unix";
  // "ipv4:1.2.3.4:567" / "ipv6:[::1]:567": the address without the port.
  std::string_view addr = peer;
  if (size_t colon = addr.rfind(':'); colon != std::string_view::npos) addr = addr.substr(0, colon);
  return absl::StrCat("anon:", A(addr));
}

}  // namespace mc::client
