#include "common/util.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"

namespace mc {

absl::StatusOr<HostPort> ParseHostPort(std::string_view text) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return McError(Code::kInvalidArgument, absl::StrCat("expected HOST:PORT, got '", std::string(text), "'"));
  }
  HostPort out;
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  out.host = std::string(host);
  int port = -1;
  if (!absl::SimpleAtoi(std::string(text.substr(colon + 1)), &port) || port < 0 || port > 65535) {
    return McError(Code::kInvalidArgument, absl::StrCat("bad port in '", std::string(text), "'"));
  }
  out.port = port;
  return out;
}

absl::StatusOr<uint64_t> ParseBytes(std::string_view text) {
  auto bad = [&] {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("expected a byte count like 65536, 64K or 16MiB, got '",
                                std::string(text), "'"));
  };
  size_t end = 0;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  const std::string_view digits = text.substr(0, end);
  const std::string_view suffix = text.substr(end);
  uint64_t n = 0;
  if (digits.empty() || !absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &n)) {
    return bad();
  }
  int shift = 0;
  if (!suffix.empty()) {
    constexpr std::string_view kUnits = "KMGT";
    const size_t unit = kUnits.find(static_cast<char>(std::toupper(
        static_cast<unsigned char>(suffix.front()))));
    if (unit == std::string_view::npos) return bad();
    shift = 10 * static_cast<int>(unit + 1);
    std::string rest =
        absl::AsciiStrToUpper(absl::string_view(suffix.data() + 1, suffix.size() - 1));
    if (!rest.empty() && rest != "B" && rest != "IB") return bad();
  }
  if (shift > 0 && n > (UINT64_MAX >> shift)) return bad();
  return n << shift;
}

bool ParseBytes(std::string_view text, uint64_t* out) {
  absl::StatusOr<uint64_t> n = ParseBytes(text);
  if (!n.ok()) return false;
  *out = *n;
  return true;
}

namespace {

// `s` as the inside of a JSON string: quotes, backslashes and control characters escaped.
std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", static_cast<unsigned char>(c)));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

absl::Status WriteReadyFile(const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string json = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) json += ", ";
    absl::StrAppend(&json, "\"", JsonEscape(fields[i].first), "\": \"",
                    JsonEscape(fields[i].second), "\"");
  }
  json += "}\n";
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << json;
    out.close();
    if (!out) return McError(Code::kInternal, absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return McError(Code::kInternal, absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 6) {
    v /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", v, kUnits[unit]);
}

std::string AbsolutePath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

}  // namespace mc
