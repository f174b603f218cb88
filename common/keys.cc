#include "common/keys.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc {

absl::Status ValidateKey(std::string_view key) {
  if (key.empty()) return McError(Code::kInvalidArgument, "empty key");
  if (key.size() > kMaxKeyBytes) {
    return McError(
        Code::kInvalidArgument,
        absl::StrCat("key of ", key.size(), " bytes exceeds the limit of ", kMaxKeyBytes));
  }
  return absl::OkStatus();
}

}  // namespace mc
