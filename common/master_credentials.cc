#include "common/master_credentials.h"

#include <chrono>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mc::auth {
namespace {

// Debian's Abseil (20220623) has its own string_view.
absl::string_view A(std::string_view s) { return absl::string_view(s.data(), s.size()); }
std::string_view S(absl::string_view s) { return std::string_view(s.data(), s.size()); }

std::vector<std::string_view> SplitSpaces(std::string_view value) {
  std::vector<std::string_view> out;
  for (absl::string_view piece : absl::StrSplit(A(value), ' ')) out.push_back(S(piece));
  return out;
}

}  // namespace

std::string_view ProofRoleName(ProofRole role) {
  switch (role) {
    case ProofRole::kAdmin:
      return "admin";
    case ProofRole::kMember:
      return "member";
    case ProofRole::kRegister:
      break;
  }
  return "register";
}

std::string ProofMessage(ProofRole role, std::string_view id, std::string_view endpoint,
                         int64_t unix_ms, std::string_view nonce_hex, std::string_view run_id,
                         uint64_t serial) {
  // id, time, nonce and run hold no '\n' (parsed so; the run as hex), so the endpoint is the
  // only free-form part and the message decodes one way.
  if (role == ProofRole::kMember) {
    return absl::StrCat("mcstore master v3\nmember\n", A(id), "\n", serial, "\n", unix_ms, "\n",
                        A(nonce_hex), "\n", Hex(run_id), "\n", A(endpoint));
  }
  return absl::StrCat("mcstore master v2\n", A(ProofRoleName(role)), "\n", A(id), "\n", unix_ms,
                      "\n", A(nonce_hex), "\n", Hex(run_id), "\n", A(endpoint));
}

std::string MakeProof(const ClusterKeys& keys, ProofRole role, std::string_view id,
                      std::string_view endpoint, int64_t unix_ms, std::string_view run_id) {
  const std::string nonce_hex = Hex(RandomBytes(kNonceSize));
  uint64_t serial = 0;
  std::string_view version = "v2 ";
  std::string serial_field;
  if (keys.member().has_value() && role != ProofRole::kAdmin) {
    role = ProofRole::kMember;
    id = keys.member()->client_id;
    serial = keys.member()->serial;
    version = "v3 ";
    serial_field = absl::StrCat(serial, " ");
  }
  const Mac mac = keys.Sign(Purpose::kMasterRpc,
                            ProofMessage(role, id, endpoint, unix_ms, nonce_hex, run_id, serial));
  return absl::StrCat(A(version), A(ProofRoleName(role)), " ", A(id), " ", serial_field, unix_ms,
                      " ", nonce_hex, " ", Hex(run_id), " ",
                      Hex(std::string_view(reinterpret_cast<const char*>(mac.data()), mac.size())));
}

bool ValidCallerId(std::string_view id) {
  if (id.empty() || id.size() > kMaxCallerIdSize) return false;
  for (char c : id) {
    if (c < '!' || c > '~') return false;
  }
  return true;
}

absl::StatusOr<std::string> FromHex(std::string_view hex, size_t bytes) {
  if (hex.size() != 2 * bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", 2 * bytes, " hex digits, got ", hex.size()));
  }
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) {
    const int hi = digit(hex[2 * i]);
    const int lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::InvalidArgumentError("not hex");
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

absl::StatusOr<ParsedProof> ParseProof(std::string_view value) {
  if (value.size() > kMaxCredentialSize) return absl::InvalidArgumentError("proof too long");
  std::vector<std::string_view> f = SplitSpaces(value);
  if (!f.empty() && f[0] == "v1") {
    return absl::InvalidArgumentError(
        "proof version 1 (no master run id; replayable after a restart) is no longer accepted");
  }
  ParsedProof p;
  if (!f.empty() && f[0] == "v3") {
    // v3: member proofs only, with the serial after the id; the rest as v2.
    if (f.size() != 8) {
      return absl::InvalidArgumentError(absl::StrCat("proof has ", f.size(), " fields, not 8"));
    }
    if (f[1] != "member") return absl::InvalidArgumentError("unknown v3 proof role");
    p.role = ProofRole::kMember;
    if (f[3].empty() || f[3].size() > 19 ||
        f[3].find_first_not_of("0123456789") != std::string_view::npos ||
        (f[3].size() > 1 && f[3][0] == '0') || !absl::SimpleAtoi(A(f[3]), &p.serial)) {
      return absl::InvalidArgumentError("bad serial in proof");
    }
    f.erase(f.begin() + 3);  // now laid out as v2
  } else if (f.size() != 7) {
    return absl::InvalidArgumentError(absl::StrCat("proof has ", f.size(), " fields, not 7"));
  } else if (f[0] != "v2") {
    return absl::InvalidArgumentError("unknown proof version");
  } else if (f[1] == "register") {
    p.role = ProofRole::kRegister;
  } else if (f[1] == "admin") {
    p.role = ProofRole::kAdmin;
  } else {
    return absl::InvalidArgumentError("unknown proof role");
  }
  if (!ValidCallerId(f[2])) return absl::InvalidArgumentError("bad id in proof");
  p.id = std::string(f[2]);
  // Digits only (no sign, no spaces): the MAC covers the decimal text as sent.
  if (f[3].empty() || f[3].size() > 15 ||
      f[3].find_first_not_of("0123456789") != std::string_view::npos ||
      !absl::SimpleAtoi(A(f[3]), &p.unix_ms)) {
    return absl::InvalidArgumentError("bad time in proof");
  }
  absl::StatusOr<std::string> nonce = FromHex(f[4], kNonceSize);
  if (!nonce.ok()) return absl::InvalidArgumentError("bad nonce in proof");
  p.nonce_hex = Hex(*nonce);  // canonical lower case: a replay in upper case is the same nonce
  if (p.nonce_hex != f[4]) return absl::InvalidArgumentError("nonce must be lower-case hex");
  absl::StatusOr<std::string> run = FromHex(f[5], kRunIdSize);
  if (!run.ok() || Hex(*run) != f[5]) {
    return absl::InvalidArgumentError("bad run id in proof (lower-case hex)");
  }
  p.run_id = std::move(*run);
  absl::StatusOr<std::string> mac = FromHex(f[6], kMacSize);
  if (!mac.ok()) return absl::InvalidArgumentError("bad mac in proof");
  p.mac = std::move(*mac);
  return p;
}

std::string MakeSessionCredential(std::string_view client_id, std::string_view token) {
  return absl::StrCat(A(client_id), " ", Hex(token));
}

absl::StatusOr<SessionCredential> ParseSessionCredential(std::string_view value) {
  if (value.size() > kMaxCredentialSize) return absl::InvalidArgumentError("session too long");
  std::vector<std::string_view> f = SplitSpaces(value);
  if (f.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("session has ", f.size(), " fields, not 2"));
  }
  if (!ValidCallerId(f[0])) return absl::InvalidArgumentError("bad client id in session");
  absl::StatusOr<std::string> token = FromHex(f[1], kSessionTokenSize);
  if (!token.ok()) return absl::InvalidArgumentError("bad token in session");
  return SessionCredential{std::string(f[0]), std::move(*token)};
}

int64_t UnixNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace mc::auth
