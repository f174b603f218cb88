// MC_RETURN_IF_ERROR and MC_ASSIGN_OR_RETURN: Debian's Abseil 20220623 ships neither.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MC_STATUS_CONCAT_INNER(a, b) a##b
#define MC_STATUS_CONCAT(a, b) MC_STATUS_CONCAT_INNER(a, b)

#define MC_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::absl::Status mc_status_tmp_ = (expr);          \
    if (!mc_status_tmp_.ok()) return mc_status_tmp_; \
  } while (0)

#define MC_ASSIGN_OR_RETURN(lhs, expr) \
  MC_ASSIGN_OR_RETURN_IMPL(MC_STATUS_CONCAT(mc_statusor_, __LINE__), lhs, expr)

#define MC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(*tmp)

// For states that must never happen (never for input from the network, disk or a user).
#define MC_CHECK(cond)                                                                    \
  do {                                                                                    \
    if (!(cond)) ::mc::internal::CheckFailed(#cond, __FILE__, __LINE__);                  \
  } while (0)

namespace mc::internal {
[[noreturn]] void CheckFailed(const char* cond, const char* file, int line);
}  // namespace mc::internal
