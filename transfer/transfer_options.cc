#include "transfer/transfer_options.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc::transfer {

absl::StatusOr<GpuDirectRdma> ParseGpuDirectRdma(std::string_view text) {
  if (text == "off") return GpuDirectRdma::kOff;
  if (text == "auto") return GpuDirectRdma::kAuto;
  if (text == "on") return GpuDirectRdma::kOn;
  return McError(
      Code::kInvalidArgument,
      absl::StrCat("GPUDirect RDMA mode must be off, auto or on, not \"", std::string(text), "\""));
}

absl::StatusOr<bool> ParseOnOff(std::string_view text) {
  if (text == "on") return true;
  if (text == "off") return false;
  return McError(Code::kInvalidArgument,
                 absl::StrCat("must be on or off, not \"", std::string(text), "\""));
}

}  // namespace mc::transfer
