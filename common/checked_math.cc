#include "common/checked_math.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc {

absl::StatusOr<uint64_t> CheckedSum::Get(std::string_view what) const {
  if (!ok_) {
    return McError(Code::kInvalidArgument, absl::StrCat(std::string(what), " overflows 64 bits"));
  }
  return value_;
}

absl::StatusOr<uint64_t> CheckedTotal(std::initializer_list<uint64_t> values,
                                      std::string_view what) {
  CheckedSum sum;
  for (uint64_t v : values) sum.Add(v);
  return sum.Get(what);
}

}  // namespace mc
